"""See ../DESIGN §2: router."""
