"""The OpenAI-compatible HTTP API over one ``EngineClient`` per served model.

Every failure leaves as OpenAI's error envelope: FastAPI's 422 validation errors (and malformed
JSON) become 400s, engine refusals map through ``errors.to_api_error``. A client that disconnects
cancels its request, streamed or not, so its KV blocks are freed at once.
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
from pdserve.router.chat import CHAT
from pdserve.router.completions import COMPLETIONS
from pdserve.router.endpoint import Call, Endpoint, answer_stream, answer_whole
from pdserve.router.engine_client import EngineClient, check_all, pick_client
from pdserve.router.errors import INVALID_REQUEST, APIError, ErrorKind, to_api_error
from pdserve.router.metrics import ResponseCounter, RouterMetrics
from pdserve.router.metrics_endpoint import cluster_metrics
from pdserve.router.openai_requests import ChatCompletionRequest, CompletionRequest
from pdserve.router.openai_responses import ModelCard, ModelList
from pdserve.router.sse import EventStreamResponse, event_stream
from pdserve.router.timing import RequestTimingMiddleware, TimingLog

# nginx's "client closed request": nobody reads it, but the access log says what happened.
CLIENT_CLOSED_REQUEST = 499
T = TypeVar("T")


def build_http_app(
    clients: Mapping[str, EngineClient],
    timing_log: TimingLog | None = None,
    metrics: RouterMetrics | None = None,
) -> FastAPI:
    """``clients`` maps each served model name to its engine; the first is the default model.
    With ``timing_log``, every request that reaches an engine logs its timings there. With
    ``metrics`` (in a Ray cluster), responses are counted and ``GET /metrics`` serves the
    cluster's metrics."""
    app = FastAPI(title="pdserve", summary="OpenAI-compatible LLM serving")
    if timing_log is not None:
        app.add_middleware(RequestTimingMiddleware, log=timing_log)
    created = int(time.time())
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        await check_all(clients)
        return Response(status_code=200)

    @app.get("/v1/models")
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
        call = Call(body, pick_client(clients, body.model), endpoint.id_prefix)
        if body.stream:
            return EventStreamResponse(event_stream(await answer_stream(endpoint, call)))
        return await _cancel_on_disconnect(raw, answer_whole(endpoint, call))

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, raw: Request) -> BaseModel | Response:
        return await answer(COMPLETIONS, body, raw)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> BaseModel | Response:
        return await answer(CHAT, body, raw)

    if metrics is not None:

        @app.get("/metrics", response_class=PlainTextResponse)
        async def prometheus_metrics() -> Response:
            return Response(await cluster_metrics(), media_type=CONTENT_TYPE_LATEST)

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
        # Routing errors (unknown path, wrong method): HTTP only, so no gRPC code applies.
        kind = ErrorKind(HTTPStatus(error.status_code), "invalid_request_error", "UNKNOWN")
        return _error_response(APIError(kind, str(error.detail)))

    for error_type in (APIError, RequestError, EngineOverloadedError, EngineStoppedError):
        app.add_exception_handler(error_type, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, api_error)
