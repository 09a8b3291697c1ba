"""Where the benchmark sends its requests: an OpenAI-compatible HTTP server (streamed
``/v1/completions``, or ``/v1/chat/completions``), or pdserve's gRPC API (``Generate``). Each
sends one request greedy, for ``max_tokens`` tokens (``ignore_eos`` unless told not to), ticking
the clock at every streamed chunk's tokens."""

import contextlib
import copy
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from pdserve.benchmarks.latency import TokenClock
from pdserve.benchmarks.openai_http import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    NO_USAGE,
    REQUEST_TIMEOUT_S,
    OpenAIClient,
    Usage,
    chat_body,
    completion_body,
)
from pdserve.benchmarks.serve_bench.datasets import BenchRequest
from pdserve.router.api.grpc_codegen import load


class Backend(Protocol):
    model: str

    async def send(self, request: BenchRequest, clock: TokenClock) -> Usage: ...

    def for_model(self, model: str) -> "Backend": ...


class _OneServer:
    model: str

    def for_model(self, model: str) -> "Backend":
        """This backend's connection, sending for ``model`` instead."""
        other = copy.copy(self)
        other.model = model
        return other


class HTTPBackend(_OneServer):
    def __init__(self, client: OpenAIClient, model: str, chat: bool, ignore_eos: bool) -> None:
        self.client, self.model, self.chat, self.ignore_eos = client, model, chat, ignore_eos

    async def send(self, request: BenchRequest, clock: TokenClock) -> Usage:
        if self.chat:
            messages = [{"role": "user", "content": request.prompt}]
            body = chat_body(self.model, messages, request.output_len, self.ignore_eos)
            return await self.client.stream(CHAT_COMPLETIONS, body, clock)
        body = completion_body(self.model, request.prompt, request.output_len, self.ignore_eos)
        return await self.client.stream(COMPLETIONS, body, clock)


class GrpcError(RuntimeError):
    """A gRPC status other than OK, as ``CODE: details``."""


class GrpcBackend(_OneServer):
    def __init__(
        self, channel: grpc.aio.Channel, model: str, ignore_eos: bool, api_key: str | None
    ) -> None:
        self.pb, pb_grpc = load()
        self.stub = pb_grpc.GenerationStub(channel)
        self.model, self.ignore_eos = model, ignore_eos
        # as over HTTP: "authorization: Bearer <key>" (gRPC metadata keys are lower case)
        self.metadata = () if api_key is None else (("authorization", f"Bearer {api_key}"),)

    async def models(self) -> list[str]:
        response = await self.stub.ListModels(
            self.pb.ListModelsRequest(), timeout=REQUEST_TIMEOUT_S
        )
        return [model.name for model in response.models]

    async def send(self, request: BenchRequest, clock: TokenClock) -> Usage:
        params = self.pb.SamplingParams(
            max_tokens=request.output_len, temperature=0.0, ignore_eos=self.ignore_eos
        )
        message = self.pb.GenerateRequest(
            model=self.model, text=request.prompt, sampling_params=params
        )
        usage = NO_USAGE
        try:
            async for response in self.stub.Generate(
                message, timeout=REQUEST_TIMEOUT_S, metadata=self.metadata
            ):
                clock.tick(len(response.token_ids))
                if response.HasField("usage"):
                    u = response.usage
                    usage = Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        except grpc.aio.AioRpcError as error:
            raise GrpcError(f"{error.code().name}: {error.details()}") from error
        return usage


@contextlib.asynccontextmanager
async def open_backend(
    url: str | None,
    grpc_target: str | None,
    model: str | None,
    chat: bool,
    ignore_eos: bool,
    api_key: str | None,
) -> AsyncIterator[Backend]:
    """The backend for ``--url`` or ``--grpc``; without ``model``, the server's first model."""
    if grpc_target is not None:
        if chat:
            raise ValueError("the gRPC API has no chat endpoint: drop --chat, or use --url")
        async with grpc.aio.insecure_channel(grpc_target) as channel:
            backend = GrpcBackend(channel, model or "", ignore_eos, api_key)
            backend.model = model or (await backend.models())[0]
            yield backend
        return
    if url is None:
        raise ValueError("give the server: --url (OpenAI HTTP) or --grpc (pdserve's gRPC)")
    async with OpenAIClient(url, api_key) as client:
        yield HTTPBackend(client, model or (await client.models())[0], chat, ignore_eos)
