"""The OpenAI-compatible HTTP API over one ``EngineClient`` per served model.

Every failure leaves as OpenAI's error envelope: FastAPI's 422 validation errors (and malformed
JSON) become 400s, engine refusals map through ``errors.to_api_error``. A client that disconnects
cancels its request, streamed or not, so its KV blocks are freed at once. The ``/v1/`` routes ask
for an API key when the app has any (``api_keys.py``); each model's requests in flight are bounded
(``admission.py``); ``/openapi.json`` documents what each route answers (``openapi_docs.py``).
"""

import asyncio
import time
from collections.abc import Awaitable, Mapping
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from pdserve.engine.errors import EngineOverloadedError, EngineStoppedError, RequestError
from pdserve.router.api import openapi_docs
from pdserve.router.api.admission import Admission
from pdserve.router.api.api_keys import APIKeys
from pdserve.router.api.chat import CHAT
from pdserve.router.api.completions import COMPLETIONS
from pdserve.router.api.endpoint import Call, Endpoint, answer_stream, answer_whole
from pdserve.router.api.engine_client import EngineClient, check_all, pick_client
from pdserve.router.api.errors import INVALID_REQUEST, APIError, ErrorKind, to_api_error
from pdserve.router.api.metrics_endpoint import cluster_metrics
from pdserve.router.api.openai_requests import ChatCompletionRequest, CompletionRequest
from pdserve.router.api.openai_responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ModelCard,
    ModelList,
)
from pdserve.router.api.sse import EventStreamResponse
from pdserve.router.metrics import ResponseCounter, RouterMetrics
from pdserve.router.timing import RequestTimingMiddleware, TimingLog

# nginx's "client closed request": nobody reads it, but the access log says what happened.
CLIENT_CLOSED_REQUEST = 499
T = TypeVar("T")


def build_http_app(
    clients: Mapping[str, EngineClient],
    timing_log: TimingLog | None = None,
    metrics: RouterMetrics | None = None,
    admission: Admission | None = None,
    api_keys: APIKeys | None = None,
) -> FastAPI:
    """``clients`` maps each served model name to its engine; the first is the default model.
    With ``timing_log``, every request that reaches an engine logs its timings there. With
    ``metrics`` (in a Ray cluster), responses are counted and ``GET /metrics`` serves the
    cluster's metrics. ``admission`` bounds each model's requests in flight (default: the
    config's default bound); ``api_keys`` guards ``/v1/`` (default: open)."""
    admission = admission or Admission.with_default_limits(clients)
    guard = (api_keys or APIKeys()).http_dependencies()
    # Documented only where it can happen: with keys required.
    unauthorized = openapi_docs.UNAUTHORIZED if guard else {}
    app = FastAPI(
        title="pdserve", summary="OpenAI-compatible LLM serving", responses=openapi_docs.GATEWAY
    )
    if timing_log is not None:
        app.add_middleware(RequestTimingMiddleware, log=timing_log)
    created = int(time.time())
    _install_error_handlers(app)

    # Open to all: load balancers and orchestrators probe it without keys.
    @app.get(
        "/health",
        response_class=Response,
        responses={**openapi_docs.STOPPED, **openapi_docs.SERVER_ERROR},
    )
    async def health() -> Response:
        await check_all(clients)
        return Response(status_code=200)

    @app.get(
        "/v1/models",
        dependencies=guard,
        responses={**openapi_docs.SERVER_ERROR, **unauthorized},
    )
    async def models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=name, created=created, max_model_len=client.max_model_len)
                for name, client in clients.items()
            ]
        )

    async def answer(
        endpoint: Endpoint, body: CompletionRequest | ChatCompletionRequest, raw: Request
    ) -> BaseModel | Response:
        client = pick_client(clients, body.model)
        call = Call(body, client, admission[client.model_name], endpoint.id_prefix)
        if not body.stream:
            return await _cancel_on_disconnect(raw, answer_whole(endpoint, call))
        # A client may leave before its first token, while the request waits for the engines.
        chunks = await _cancel_on_disconnect(raw, answer_stream(endpoint, call))
        return chunks if isinstance(chunks, Response) else EventStreamResponse(chunks)

    completion_responses = openapi_docs.generation_responses(Completion, Completion)
    chat_responses = openapi_docs.generation_responses(ChatCompletion, ChatCompletionChunk)

    @app.post(
        COMPLETIONS.path,
        response_model=None,
        dependencies=guard,
        responses={**completion_responses, **unauthorized},
    )
    async def completions(body: CompletionRequest, raw: Request) -> BaseModel | Response:
        return await answer(COMPLETIONS, body, raw)

    @app.post(
        CHAT.path,
        response_model=None,
        dependencies=guard,
        responses={**chat_responses, **unauthorized},
    )
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> BaseModel | Response:
        return await answer(CHAT, body, raw)

    if metrics is not None:
        # Open, as vLLM's: scrapers send no keys, and each node's Ray metrics port serves the
        # same numbers without any.
        @app.get("/metrics", response_class=PlainTextResponse, responses=openapi_docs.SERVER_ERROR)
        async def prometheus_metrics() -> Response:
            return Response(await cluster_metrics(), media_type=CONTENT_TYPE_LATEST)

    vocab_size = min(client.tokenizer.vocab_size for client in clients.values())
    openapi_docs.install_openapi(app, streamed=[ChatCompletionChunk], vocab_size=vocab_size)
    if metrics is not None:
        # Now, not at the first request: a scrape before any request finds the series at 0.
        metrics.publish_responses(openapi_docs.documented_statuses(app.openapi()))
        paths = frozenset(route.path for route in app.routes)
        app.add_middleware(ResponseCounter, metrics=metrics, paths=paths)
    return app


async def _cancel_on_disconnect(raw: Request, work: Awaitable[T]) -> T | Response:
    """Runs ``work`` until it ends or the client disconnects, whichever is first."""
    task = asyncio.ensure_future(work)
    disconnected = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        done, _ = await asyncio.wait((task, disconnected), return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnected.cancel()
        task.cancel()  # if still running: closes the request group, aborting its engine requests
    if task in done:
        return task.result()
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _wait_for_disconnect(raw: Request) -> None:
    # The body has been read, so the next message is the disconnect.
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.envelope(), status_code=error.kind.status, headers=error.headers())


def _message(problem: Mapping[str, Any]) -> str:
    # A validator's own ValueError reads better without pydantic's "Value error, " prefix.
    if problem["type"] == "value_error":
        return str(problem["ctx"]["error"])
    return problem["msg"]


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, error: Exception) -> JSONResponse:
        # An unexpected exception becomes a 500 here; Starlette then re-raises it to be logged.
        return _error_response(to_api_error(error))

    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        # Malformed JSON arrives here too (error type "json_invalid").
        problems = error.errors()
        if any(problem["type"] == "json_invalid" for problem in problems):
            return _error_response(APIError(INVALID_REQUEST, "the request body is not valid JSON"))
        fields = [".".join(str(p) for p in problem["loc"][1:]) for problem in problems]
        message = "; ".join(
            f"{field}: {_message(problem)}" if field else _message(problem)
            for field, problem in zip(fields, problems, strict=True)
        )
        return _error_response(APIError(INVALID_REQUEST, message, fields[0] or None))

    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        # Routing errors (unknown path, wrong method): HTTP only, so no gRPC code applies. Their
        # headers stay: a 405's `Allow` lists the path's methods (RFC 9110).
        kind = ErrorKind(HTTPStatus(error.status_code), "invalid_request_error", "UNKNOWN")
        response = _error_response(APIError(kind, str(error.detail)))
        response.headers.update(error.headers or {})
        return response

    for error_type in (APIError, RequestError, EngineOverloadedError, EngineStoppedError):
        app.add_exception_handler(error_type, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, api_error)
