"""See ../DESIGN §2: decode_worker."""
