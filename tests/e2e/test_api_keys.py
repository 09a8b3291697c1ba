"""API keys over both transports: without one of the server's keys a call gets 401 in OpenAI's
envelope (HTTP) or UNAUTHENTICATED (gRPC), with either key it is served; the health probes stay
open; no key, right or wrong, shows up in an answer or a log line."""

import json
import logging
import urllib.error
import urllib.request
from email.message import Message

import grpc
import openai
import pytest

from pdserve.router.api.grpc_service import pb, pb_grpc
from pdserve.tests.e2e.conftest import API_KEYS

MODEL = "tiny"
MODELS = [MODEL, "tiny-overloaded"]  # what the keyed servers serve
WRONG_KEY = "sk-test-wrong-key"
TIMEOUT_S = 60.0
COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
REQUEST = pb.GenerateRequest(
    model=MODEL, text="hello", sampling_params=pb.SamplingParams(max_tokens=2)
)
# Authorization values that carry none of the server's keys.
REFUSED = {
    "none": None,
    "wrong key": f"Bearer {WRONG_KEY}",
    "not bearer": f"Basic {API_KEYS[0]}",
    "bearer without a key": "Bearer ",
    "a key's prefix": f"Bearer {API_KEYS[0][:-1]}",
}


def _call(
    url: str, authorization: str | None, body: dict | None = None
) -> tuple[int, Message, bytes]:
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


@pytest.mark.parametrize("authorization", REFUSED.values(), ids=REFUSED.keys())
@pytest.mark.parametrize(("path", "body"), [("/v1/models", None), ("/v1/completions", COMPLETION)])
def test_http_without_a_key_gets_401_in_the_envelope(
    keyed_http_url: str,
    path: str,
    body: dict | None,
    authorization: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        status, headers, answer = _call(keyed_http_url + path, authorization, body)
    assert status == 401
    assert headers.get_content_type() == "application/json"
    error = json.loads(answer)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert error["param"] is None and "Authorization: Bearer" in error["message"]
    for key in (*API_KEYS, WRONG_KEY):
        assert key.encode() not in answer and key not in caplog.text


@pytest.mark.parametrize("key", API_KEYS)
def test_http_with_either_key_is_served(keyed_http_url: str, key: str) -> None:
    with openai.OpenAI(base_url=f"{keyed_http_url}/v1", api_key=key, max_retries=0) as sdk:
        assert [model.id for model in sdk.models.list().data] == MODELS
        completion = sdk.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    assert completion.usage.completion_tokens >= 1


def test_the_sdk_reports_a_wrong_key_as_authentication_error(keyed_http_url: str) -> None:
    with (
        openai.OpenAI(base_url=f"{keyed_http_url}/v1", api_key=WRONG_KEY, max_retries=0) as sdk,
        pytest.raises(openai.AuthenticationError) as refused,
    ):
        sdk.models.list()
    assert refused.value.code == "invalid_api_key"


def test_health_and_the_openapi_document_stay_open(keyed_http_url: str) -> None:
    assert _call(keyed_http_url + "/health", None)[0] == 200
    status, _, document = _call(keyed_http_url + "/openapi.json", None)
    assert status == 200
    schemes = json.loads(document)["components"]["securitySchemes"]
    assert schemes == {
        "HTTPBearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "one of the server's API keys",
        }
    }


@pytest.fixture
def stub(keyed_grpc_channel: grpc.Channel) -> pb_grpc.GenerationStub:
    return pb_grpc.GenerationStub(keyed_grpc_channel)


def _metadata(authorization: str | None) -> tuple[tuple[str, str], ...]:
    return () if authorization is None else (("authorization", authorization),)


@pytest.mark.parametrize("authorization", REFUSED.values(), ids=REFUSED.keys())
def test_grpc_without_a_key_is_unauthenticated(
    stub: pb_grpc.GenerationStub, authorization: str | None
) -> None:
    metadata = _metadata(authorization)
    calls = {
        "Complete": lambda: stub.Complete(REQUEST, timeout=TIMEOUT_S, metadata=metadata),
        "Generate": lambda: list(stub.Generate(REQUEST, timeout=TIMEOUT_S, metadata=metadata)),
        "ListModels": lambda: stub.ListModels(
            pb.ListModelsRequest(), timeout=TIMEOUT_S, metadata=metadata
        ),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        assert all(key not in refused.value.details() for key in (*API_KEYS, WRONG_KEY))


@pytest.mark.parametrize("key", API_KEYS)
def test_grpc_with_either_key_is_served(stub: pb_grpc.GenerationStub, key: str) -> None:
    metadata = _metadata(f"Bearer {key}")
    response = stub.Complete(REQUEST, timeout=TIMEOUT_S, metadata=metadata)
    assert response.usage.completion_tokens >= 1
    models = stub.ListModels(pb.ListModelsRequest(), timeout=TIMEOUT_S, metadata=metadata)
    assert [model.name for model in models.models] == MODELS


def test_grpc_health_stays_open(stub: pb_grpc.GenerationStub) -> None:
    assert stub.Health(pb.HealthRequest(), timeout=TIMEOUT_S) == pb.HealthResponse()
