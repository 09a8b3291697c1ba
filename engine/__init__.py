"""The engine: model, paged KV cache, tokenizer, sampling, scheduler, step loop (no Ray/HTTP)."""
