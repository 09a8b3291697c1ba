"""``pdserve bench serve``: online serving benchmark against any OpenAI-compatible server or
pdserve's gRPC API, as ``vllm bench serve`` measures it."""
