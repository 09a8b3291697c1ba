"""See ../DESIGN §2: kvtransfer."""
