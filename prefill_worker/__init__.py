"""See ../DESIGN §2: prefill_worker."""
