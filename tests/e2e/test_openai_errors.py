"""Every bad request gets its HTTP status and OpenAI's error envelope, before any stream starts,
and the server keeps serving; /v1/models and /health; a stopped engine answers 503."""

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

MODEL = "tiny"
OVERLOADED_MODEL = "tiny-overloaded"
STOPPED_MODEL = "tiny-stopped"
MAX_MODEL_LEN = 2048  # the tiny preset's
TIMEOUT_S = 60.0
LONG_PROMPT = " ".join(["hello"] * (MAX_MODEL_LEN + 10))
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]

# (endpoint, body: raw bytes or JSON, status, param, code, words in the message)
BAD_REQUESTS = {
    "malformed JSON": (COMPLETIONS, b'{"model": "tiny", "prompt":', 400, None, None, "JSON"),
    "not an object": (COMPLETIONS, b"[1, 2]", 400, None, None, "dictionary"),
    "no prompt": (COMPLETIONS, {"model": MODEL}, 400, "prompt", None, "required"),
    "empty prompt": (COMPLETIONS, {"model": MODEL, "prompt": ""}, 400, "prompt", None, "empty"),
    "max_tokens not an int": (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "max_tokens": "many"},
        400,
        "max_tokens",
        None,
        "integer",
    ),
    "temperature not a number": (
        CHAT,
        {"model": MODEL, "messages": MESSAGES, "temperature": "hot"},
        400,
        "temperature",
        None,
        "number",
    ),
    "negative max_tokens": (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "max_tokens": -1},
        400,
        "max_tokens",
        None,
        "greater than or equal to 1",
    ),
    "top_p out of range": (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "top_p": 2},
        400,
        "top_p",
        None,
        "less than or equal to 1",
    ),
    "token id outside the vocabulary": (
        COMPLETIONS,
        {"model": MODEL, "prompt": [10**6]},
        400,
        "prompt",
        None,
        "vocabulary",
    ),
    "prompt over the context": (
        COMPLETIONS,
        {"model": MODEL, "prompt": LONG_PROMPT, "stream": True},
        400,
        "prompt",
        "context_length_exceeded",
        "maximum context length",
    ),
    "completion over the context": (
        CHAT,
        {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": MAX_MODEL_LEN},
        400,
        "messages",
        "context_length_exceeded",
        "maximum context length",
    ),
    "no messages": (CHAT, {"model": MODEL, "messages": []}, 400, "messages", None, "at least"),
    "user message without content": (
        CHAT,
        {"model": MODEL, "messages": [{"role": "user"}]},
        400,
        "messages.0",
        None,
        "a user message needs content",
    ),
    "a number as a boolean": (
        CHAT,
        {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": 0},
        400,
        "add_generation_prompt",
        None,
        "boolean",
    ),
    "image content": (
        CHAT,
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages.0.content",
        None,
        "only text",
    ),
    "top_logprobs without logprobs": (
        CHAT,
        {"model": MODEL, "messages": MESSAGES, "top_logprobs": 2},
        400,
        None,
        None,
        "logprobs",
    ),
    "unsupported logit_bias": (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "logit_bias": {"5": 10}},
        400,
        None,
        None,
        "logit_bias",
    ),
    "stream_options without stream": (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}},
        400,
        None,
        None,
        "stream",
    ),
    "echo with logprobs": (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "echo": True, "logprobs": 1},
        400,
        None,
        None,
        "echo",
    ),
    "unknown model": (
        COMPLETIONS,
        {"model": "gpt-9", "prompt": "x"},
        404,
        "model",
        "model_not_found",
        "gpt-9",
    ),
    "overloaded": (
        CHAT,
        {"model": OVERLOADED_MODEL, "messages": MESSAGES, "stream": True},
        503,
        None,
        "overloaded",
        "overloaded",
    ),
}


def _request(url: str, body: bytes | dict[str, Any] | None = None) -> tuple[int, Any, Any]:
    """(status, headers, parsed JSON body or None) of a GET, or of a POST when there is a body."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            status, headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, error.headers, error.read()
    return status, headers, json.loads(raw) if raw else None


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_request_gets_its_status_and_envelope(
    http_url: str, client: openai.OpenAI, case: str
) -> None:
    path, body, status, param, code, words = BAD_REQUESTS[case]
    got_status, headers, envelope = _request(http_url + path, body)
    assert got_status == status, envelope
    assert set(envelope) == {"error"}
    error = envelope["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert (error["param"], error["code"]) == (param, code)
    assert words in error["message"]
    assert ("Retry-After" in headers) == (status == 503)
    # The server keeps serving.
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=1).choices


def test_sdk_raises_its_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="gpt-9", prompt="x")
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}], stream=True
        )
    with pytest.raises(openai.InternalServerError) as overloaded:
        client.completions.create(model=OVERLOADED_MODEL, prompt="x")
    assert overloaded.value.status_code == 503
    assert overloaded.value.response.headers["Retry-After"] == "1"


def test_unknown_fields_are_ignored(http_url: str) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "future_field": {"a": 1}}
    status, _, response = _request(http_url + COMPLETIONS, body)
    assert status == 200 and response["usage"]["completion_tokens"] == 1


def test_unknown_path_gets_an_envelope(http_url: str) -> None:
    status, _, envelope = _request(http_url + "/v1/nothing")
    assert status == 404 and envelope["error"]["message"] == "Not Found"


def test_models_lists_every_served_model(client: openai.OpenAI) -> None:
    models = {model.id: model for model in client.models.list()}
    assert set(models) == {MODEL, OVERLOADED_MODEL}
    assert models[MODEL].model_extra["max_model_len"] == MAX_MODEL_LEN


def test_health(http_url: str, stopped_http_url: str) -> None:
    assert _request(http_url + "/health")[0] == 200
    status, _, envelope = _request(stopped_http_url + "/health")
    assert status == 503 and envelope["error"]["code"] == "engine_stopped"


def test_stopped_engine_answers_503(stopped_http_url: str) -> None:
    body = {"model": STOPPED_MODEL, "prompt": "x", "max_tokens": 1}
    status, headers, envelope = _request(stopped_http_url + COMPLETIONS, body)
    assert status == 503 and "Retry-After" not in headers
    assert envelope["error"]["code"] == "engine_stopped"


def test_an_undeclared_method_is_405_with_allow(http_url: str) -> None:
    request = urllib.request.Request(http_url + COMPLETIONS, method="GET")
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=TIMEOUT_S)
    assert answer.value.code == 405 and answer.value.headers["Allow"] == "POST"
    assert json.loads(answer.value.read())["error"]["type"] == "invalid_request_error"
