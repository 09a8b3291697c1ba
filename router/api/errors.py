"""API errors in OpenAI's envelope, and how engine errors map onto HTTP and gRPC statuses.

One table (``ErrorKind``) serves both transports, so a refusal reads the same over HTTP and gRPC:
``{"error": {"message", "type", "param", "code"}}`` with an HTTP status, or a gRPC status code.
"""

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from pdserve.engine.errors import (
    ContextLengthError,
    EngineOverloadedError,
    EngineStoppedError,
    RequestError,
)

# Seconds an overloaded server asks clients to wait before retrying (the `Retry-After` header).
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ErrorKind:
    status: HTTPStatus
    type: str  # OpenAI's error type
    grpc_code: str  # the name of a grpc.StatusCode, so this module needs no grpc import


INVALID_REQUEST = ErrorKind(HTTPStatus.BAD_REQUEST, "invalid_request_error", "INVALID_ARGUMENT")
UNAUTHENTICATED = ErrorKind(HTTPStatus.UNAUTHORIZED, "invalid_request_error", "UNAUTHENTICATED")
NOT_FOUND = ErrorKind(HTTPStatus.NOT_FOUND, "invalid_request_error", "NOT_FOUND")
# The router's own limit on requests in flight (router/api/admission.py): OpenAI answers "the engine
# is currently overloaded" with a 429 of type server_error.
TOO_MANY_REQUESTS = ErrorKind(HTTPStatus.TOO_MANY_REQUESTS, "server_error", "RESOURCE_EXHAUSTED")
OVERLOADED = ErrorKind(HTTPStatus.SERVICE_UNAVAILABLE, "server_error", "RESOURCE_EXHAUSTED")
UNAVAILABLE = ErrorKind(HTTPStatus.SERVICE_UNAVAILABLE, "server_error", "UNAVAILABLE")
INTERNAL = ErrorKind(HTTPStatus.INTERNAL_SERVER_ERROR, "server_error", "INTERNAL")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error envelope: the body of every error response."""

    error: ErrorDetail


class APIError(Exception):
    """A request refused or failed, ready to be sent as OpenAI's error envelope."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def envelope(self) -> dict[str, Any]:
        detail = ErrorDetail(
            message=self.message, type=self.kind.type, param=self.param, code=self.code
        )
        return ErrorResponse(error=detail).model_dump()

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def context_length_error(
    max_model_len: int, num_prompt: int, max_tokens: int, param: str
) -> APIError:
    """OpenAI's wording for a prompt plus completion that does not fit the model."""
    return APIError(
        INVALID_REQUEST,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} in the "
        "completion). Please reduce the length of the prompt or completion.",
        param=param,
        code="context_length_exceeded",
    )


def model_not_found(model: str) -> APIError:
    return APIError(
        NOT_FOUND, f"The model `{model}` does not exist.", param="model", code="model_not_found"
    )


def too_many_requests(model: str, limit: int) -> APIError:
    """The router's refusal past a model's ``max_concurrent_requests``."""
    return APIError(
        TOO_MANY_REQUESTS,
        f"The model `{model}` is overloaded: {limit} of its requests are in flight already. "
        "Please retry later.",
        code="too_many_requests",
        retry_after_s=RETRY_AFTER_S,
    )


def invalid_api_key() -> APIError:
    """A missing or wrong key; the message never echoes what the client sent."""
    return APIError(
        UNAUTHENTICATED,
        "Incorrect or missing API key. Provide it in an Authorization header using Bearer "
        "auth (Authorization: Bearer YOUR_KEY).",
        code="invalid_api_key",
    )


def to_api_error(error: Exception) -> APIError:
    """Maps what the engine (or request validation) raised onto the error the client sees."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, ContextLengthError):
        return APIError(INVALID_REQUEST, str(error), error.param, "context_length_exceeded")
    if isinstance(error, RequestError):
        return APIError(INVALID_REQUEST, str(error), error.param)
    if isinstance(error, EngineOverloadedError):
        return APIError(OVERLOADED, str(error), code="overloaded", retry_after_s=RETRY_AFTER_S)
    if isinstance(error, EngineStoppedError):
        return APIError(UNAVAILABLE, str(error), code="engine_stopped")
    # Anything else is a server bug, a plain ValueError included: bad input raises RequestError.
    return APIError(INTERNAL, f"internal error: {type(error).__name__}: {error}")
