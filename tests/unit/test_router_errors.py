"""Engine errors → OpenAI's envelope, HTTP status, Retry-After and gRPC status code."""

from http import HTTPStatus

import grpc
import pytest

from pdserve.engine.errors import (
    ContextLengthError,
    EngineOverloadedError,
    EngineStoppedError,
    RequestError,
)
from pdserve.router.api.errors import (
    RETRY_AFTER_S,
    APIError,
    invalid_api_key,
    model_not_found,
    to_api_error,
    too_many_requests,
)

INVALID = "invalid_request_error"
CONTEXT = "This model's maximum context length is 8 tokens."


@pytest.mark.parametrize(
    ("error", "status", "type_", "param", "code", "grpc_code"),
    [
        (RequestError("bad", "top_p"), 400, INVALID, "top_p", None, "INVALID_ARGUMENT"),
        (
            ContextLengthError(CONTEXT, "prompt"),
            400,
            INVALID,
            "prompt",
            "context_length_exceeded",
            "INVALID_ARGUMENT",
        ),
        (model_not_found("m"), 404, INVALID, "model", "model_not_found", "NOT_FOUND"),
        (invalid_api_key(), 401, INVALID, None, "invalid_api_key", "UNAUTHENTICATED"),
        (
            too_many_requests("m", 8),
            429,
            "server_error",
            None,
            "too_many_requests",
            "RESOURCE_EXHAUSTED",
        ),
        (
            EngineOverloadedError("busy"),
            503,
            "server_error",
            None,
            "overloaded",
            "RESOURCE_EXHAUSTED",
        ),
        (EngineStoppedError("down"), 503, "server_error", None, "engine_stopped", "UNAVAILABLE"),
        # A plain ValueError is a server bug: bad input raises RequestError.
        (ValueError("oops"), 500, "server_error", None, None, "INTERNAL"),
        (KeyError("x"), 500, "server_error", None, None, "INTERNAL"),
    ],
)
def test_each_error_maps_to_its_status_everywhere(
    error: Exception, status: int, type_: str, param: str | None, code: str | None, grpc_code: str
) -> None:
    api_error = to_api_error(error)
    assert api_error.kind.status == HTTPStatus(status)
    assert grpc.StatusCode[api_error.kind.grpc_code] == grpc.StatusCode[grpc_code]
    assert api_error.envelope() == {
        "error": {"message": api_error.message, "type": type_, "param": param, "code": code}
    }
    assert str(error) in api_error.message
    retry_after = code in ("overloaded", "too_many_requests")  # the router's or the engines'
    retry = {"Retry-After": str(RETRY_AFTER_S)} if retry_after else {}
    assert api_error.headers() == retry


def test_api_errors_pass_through_unchanged() -> None:
    error = model_not_found("gpt-9")
    assert to_api_error(error) is error
    assert isinstance(error, APIError) and error.param == "model" and "gpt-9" in error.message
