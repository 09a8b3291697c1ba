"""The client-facing API: OpenAI HTTP and gRPC over ``EngineClient``s, requests to engine inputs,
responses, errors, API keys and admission."""
