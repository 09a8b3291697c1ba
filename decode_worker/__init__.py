"""The decode Serve deployment: an engine in the decode role with its own continuous-batching
loop, which pulls a prefill's KV (or prefills locally when told) and streams the tokens; it never
calls the prefill pool itself (docs/architecture.md, §4 and §5)."""
