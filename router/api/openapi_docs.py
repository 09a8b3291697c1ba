"""What the OpenAPI document says each operation answers: every status the server sends, with
the body it really has, and nothing else.

FastAPI documents a 200 and its 422 validation error on its own; this server turns validation
errors into 400s in OpenAI's error envelope (``http_app.py``), so the 422 is taken out of the
document and each error status is documented with ``ErrorResponse``. Every operation also lists
the refusals of the gateway in front of the router replicas (``GATEWAY``: 429 and 503 with
``Retry-After``), which answers them on any path. A generation endpoint
answers with JSON, or with server-sent events when ``stream`` is true: each event's ``data`` is a
chunk as JSON, an error envelope (a failure after the stream started), or ``[DONE]``.
"""

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from pdserve.router.api.errors import ErrorResponse
from pdserve.router.api.sse import DONE_DATA

REF_PREFIX = "#/components/schemas/"
# What FastAPI adds for its own 422, which this server never sends.
VALIDATION_STATUS = str(HTTPStatus.UNPROCESSABLE_ENTITY.value)
VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before retrying",
        "schema": {"type": "integer"},
    }
}
Responses = dict[int | str, dict[str, Any]]


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description, **extra}


SERVER_ERROR: Responses = {HTTPStatus.INTERNAL_SERVER_ERROR: _error("an unexpected server error")}
UNAUTHORIZED: Responses = {HTTPStatus.UNAUTHORIZED: _error("a missing or wrong API key")}
STOPPED: Responses = {
    HTTPStatus.SERVICE_UNAVAILABLE: _error(
        "a model's engine cannot serve, or (the gateway, with Retry-After) no router replica is up",
        headers=RETRY_AFTER,
    )
}
GENERATION_ERRORS: Responses = {
    HTTPStatus.BAD_REQUEST: _error(
        "an invalid request: malformed JSON, a field out of range, a prompt over the context"
    ),
    HTTPStatus.NOT_FOUND: _error("no such model"),
    HTTPStatus.TOO_MANY_REQUESTS: _error(
        "the model has max_concurrent_requests in flight in this router replica, or (the "
        "gateway) every router replica holds as many requests as it may",
        headers=RETRY_AFTER,
    ),
    HTTPStatus.SERVICE_UNAVAILABLE: _error(
        "the engines have no room for the request (with Retry-After), or cannot serve, or (the "
        "gateway) no router replica is up",
        headers=RETRY_AFTER,
    ),
    **SERVER_ERROR,
}


# What the gateway in front of the router replicas (cluster/gateway.py) answers on any path: every
# operation lists it (``FastAPI(responses=...)``) unless it says more of that status itself.
GATEWAY: Responses = {
    HTTPStatus.TOO_MANY_REQUESTS: _error(
        "the gateway: every router replica holds as many requests as it may", headers=RETRY_AFTER
    ),
    HTTPStatus.SERVICE_UNAVAILABLE: _error(
        "the gateway: no router replica is up", headers=RETRY_AFTER
    ),
}


def _event_schema(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event of a stream of ``chunk``s."""
    payload = {"anyOf": [{"$ref": REF_PREFIX + model.__name__} for model in (chunk, ErrorResponse)]}
    data = {
        "anyOf": [
            {"type": "string", "const": DONE_DATA},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
        ]
    }
    return {"type": "object", "required": ["data"], "properties": {"data": data}}


def generation_responses(whole: type[BaseModel], chunk: type[BaseModel]) -> Responses:
    """A generation endpoint's 200 (``whole`` as JSON, or a stream of ``chunk``s) and errors."""
    ok = {
        "model": whole,
        "description": "the answer: JSON, or server-sent events when `stream` is true",
        "content": {"text/event-stream": {"itemSchema": _event_schema(chunk)}},
    }
    return {HTTPStatus.OK: ok, **GENERATION_ERRORS}


def install_openapi(app: FastAPI, streamed: list[type[BaseModel]], vocab_size: int) -> None:
    """Makes ``app.openapi`` the truthful document: the models only streams name (``streamed``)
    join the components, FastAPI's 422 leaves, and a prompt's token ids are below
    ``vocab_size`` (the smallest vocabulary served: the engines refuse ids past theirs)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, streamed)
            _bound_token_ids(app.openapi_schema["components"]["schemas"], vocab_size)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, streamed: list[type[BaseModel]]) -> dict[str, Any]:
    document = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    for operations in document["paths"].values():
        for operation in operations.values():
            operation["responses"].pop(VALIDATION_STATUS, None)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    keyed = [(model, "serialization") for model in streamed]
    _, extra = models_json_schema(keyed, ref_template=REF_PREFIX + "{model}")
    schemas.update(extra.get("$defs", {}))
    return document


def _bound_token_ids(schemas: dict[str, Any], vocab_size: int) -> None:
    for member in schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]:
        items = member.get("items", {})
        token_id = items.get("items", items)  # token ids, or lists of them
        if token_id.get("type") == "integer":
            token_id["maximum"] = vocab_size - 1


def documented_statuses(document: dict[str, Any]) -> dict[str, list[str]]:
    """Each path of ``document``: the statuses its operations document."""
    return {
        path: sorted(
            {status for operation in operations.values() for status in operation["responses"]}
        )
        for path, operations in document["paths"].items()
    }
