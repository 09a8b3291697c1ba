"""The prefill Serve deployment: an engine in the prefill role that computes a prompt's KV and
first token, then holds the KV under a lease until a decode replica pulls it; it streams nothing
to clients (docs/architecture.md, §3)."""
