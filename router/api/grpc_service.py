"""The gRPC API (``pdserve.proto``) over the same engine clients as the HTTP API.

Each method is named after its rpc and takes ``(request, grpc_context)``: a ``grpc.aio`` server
passes its context positionally, Ray Serve's gRPC proxy passes ``grpc_context=`` to a deployment
method, so the class serves both unchanged. A refused request sets the status code and details on
the context and returns (no exception), which both servers turn into that status.
"""

import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Protocol

import grpc

from pdserve.engine.errors import RequestError
from pdserve.engine.outputs import CompletionOutput, PositionLogprobs
from pdserve.router.api.admission import Admission
from pdserve.router.api.api_keys import AUTHORIZATION, APIKeys, bearer_token
from pdserve.router.api.engine_client import EngineClient, check_all, pick_client
from pdserve.router.api.engine_inputs import completion_budget, sampling_params
from pdserve.router.api.errors import INTERNAL, to_api_error
from pdserve.router.api.grpc_codegen import load
from pdserve.router.api.openai_requests import COMPLETIONS_DEFAULT_MAX_TOKENS
from pdserve.router.api.request_group import RequestGroup, TokenCounts, start_group

logger = logging.getLogger(__name__)

pb, pb_grpc = load()
# What a grpc.aio server, or Serve's gRPCOptions(grpc_servicer_functions=[...]), registers.
add_GenerationServicer_to_server = pb_grpc.add_GenerationServicer_to_server


class GrpcContext(Protocol):
    """What both servers' contexts offer (grpc.aio's ``ServicerContext``, Serve's
    ``RayServegRPCContext``) and all this servicer uses."""

    def set_code(self, code: grpc.StatusCode) -> None: ...

    def set_details(self, details: str) -> None: ...

    def invocation_metadata(self) -> Iterable[tuple[str, str]] | None: ...


def _fail(grpc_context: GrpcContext, error: Exception) -> None:
    api_error = to_api_error(error)
    if api_error.kind is INTERNAL:
        logger.error("gRPC request failed", exc_info=error)
    grpc_context.set_code(grpc.StatusCode[api_error.kind.grpc_code])
    grpc_context.set_details(api_error.message)


def _logprobs(token_id: int, position: PositionLogprobs, num_top: int) -> pb.TokenLogprobs:
    def entry(tid: int) -> pb.Logprob:
        lp = position[tid]
        return pb.Logprob(token_id=tid, token=lp.decoded_token, logprob=lp.logprob, rank=lp.rank)

    top = sorted((lp.rank, tid) for tid, lp in position.items() if lp.rank <= num_top)
    return pb.TokenLogprobs(sampled=entry(token_id), top=[entry(tid) for _, tid in top])


def _response(
    request_id: str, output: CompletionOutput, num_top: int, usage: TokenCounts | None
) -> pb.GenerateResponse:
    message = pb.GenerateResponse(
        request_id=request_id,
        text=output.text,
        token_ids=output.token_ids,
        finish_reason=output.finish_reason or "",
    )
    if output.logprobs is not None:
        for token_id, position in zip(output.token_ids, output.logprobs, strict=True):
            message.logprobs.append(_logprobs(token_id, position, num_top))
    if isinstance(output.stop_reason, str):
        message.stop_string = output.stop_reason
    elif output.stop_reason is not None:
        message.stop_token_id = output.stop_reason
    if usage is not None:
        message.usage.CopyFrom(pb.Usage(**usage._asdict()))
    return message


class GenerationServicer:
    def __init__(
        self,
        clients: Mapping[str, EngineClient],
        admission: Admission | None = None,
        api_keys: APIKeys | None = None,
    ) -> None:
        """``admission`` bounds each model's requests in flight (default: the config's default
        bound), shared with the HTTP app; ``api_keys`` guards every rpc but Health (default:
        open)."""
        self.clients = clients
        self.admission = admission or Admission.with_default_limits(clients)
        self.api_keys = api_keys or APIKeys()

    def _authorize(self, grpc_context: GrpcContext) -> None:
        if not self.api_keys.required:
            return
        metadata = dict(grpc_context.invocation_metadata() or ())
        self.api_keys.check(bearer_token(metadata.get(AUTHORIZATION)))

    async def _start(
        self, request: pb.GenerateRequest, grpc_context: GrpcContext
    ) -> tuple[str, RequestGroup]:
        self._authorize(grpc_context)
        client = pick_client(self.clients, request.model)
        which = request.WhichOneof("prompt")
        if which is None:
            raise RequestError("a prompt (text or token_ids) is required", "prompt")
        prompt = (
            client.tokenizer.encode(request.text)
            if which == "text"
            else list(request.token_ids.ids)
        )
        given = {
            field.name: list(value) if field.is_repeated else value
            for field, value in request.sampling_params.ListFields()
        }
        requested = given.pop("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
        defaults = client.generation_defaults
        max_tokens = completion_budget(
            requested, [len(prompt)], client.max_model_len, "prompt", defaults
        )
        params = sampling_params(max_tokens=max_tokens, **defaults.fill(given))
        request_id = f"grpc-{uuid.uuid4().hex}"
        limit = self.admission[client.model_name]
        group = await start_group(client, request_id, [prompt], params, request.priority, limit)
        return request_id, group

    async def Generate(
        self, request: pb.GenerateRequest, grpc_context: GrpcContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            request_id, group = await self._start(request, grpc_context)
            num_top = request.sampling_params.logprobs
            try:
                async for _, delta in group:
                    usage = group.token_counts() if delta.finished else None
                    yield _response(request_id, delta.outputs[0], num_top, usage)
            finally:
                group.close()
        except Exception as error:
            _fail(grpc_context, error)

    async def Complete(
        self, request: pb.GenerateRequest, grpc_context: GrpcContext
    ) -> pb.GenerateResponse:
        try:
            request_id, group = await self._start(request, grpc_context)
            try:
                async for _ in group:
                    pass
            finally:
                group.close()
        except Exception as error:
            _fail(grpc_context, error)
            return pb.GenerateResponse()
        output = group.outputs[0].outputs[0]
        num_top = request.sampling_params.logprobs
        return _response(request_id, output, num_top, group.token_counts())

    async def ListModels(
        self, request: pb.ListModelsRequest, grpc_context: GrpcContext
    ) -> pb.ListModelsResponse:
        try:
            self._authorize(grpc_context)
        except Exception as error:
            _fail(grpc_context, error)
            return pb.ListModelsResponse()
        models = [
            pb.Model(name=name, max_model_len=client.max_model_len)
            for name, client in self.clients.items()
        ]
        return pb.ListModelsResponse(models=models)

    async def Health(
        self, request: pb.HealthRequest, grpc_context: GrpcContext
    ) -> pb.HealthResponse:
        # Open to all, as GET /health: probes send no keys.
        try:
            await check_all(self.clients)
        except Exception as error:
            _fail(grpc_context, error)
        return pb.HealthResponse()


async def start_grpc_server(
    servicer: GenerationServicer, address: str
) -> tuple[grpc.aio.Server, int]:
    """Starts a ``grpc.aio`` server for ``servicer`` on ``address`` ("host:port", port 0 picks
    a free one); returns the server and its port."""
    server = grpc.aio.server()
    add_GenerationServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    await server.start()
    return server, port
