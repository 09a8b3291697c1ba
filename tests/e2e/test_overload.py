"""The router's bound on requests in flight (router/api/admission.py): past a model's
``max_concurrent_requests`` one more request is refused at once, 429 with ``Retry-After`` over
HTTP and RESOURCE_EXHAUSTED over gRPC, both counting against one bound; and every way a request
ends gives its slot back, so the count returns to 0.

The servers' ``tiny`` waits at a gate (tests/e2e/gated_client.py) before it reaches the engine,
which holds requests in flight for as long as a test needs.
"""

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from email.message import Message
from typing import Any

import grpc
import pytest

from pdserve.router.api.admission import Admission
from pdserve.router.api.errors import RETRY_AFTER_S
from pdserve.router.api.grpc_service import pb, pb_grpc
from pdserve.tests.e2e.conftest import LIMITED_MAX_REQUESTS
from pdserve.tests.e2e.gated_client import GatedClient

MODEL = "tiny"
OVERLOADED_MODEL = "tiny-overloaded"
COMPLETIONS = "/v1/completions"
SHORT = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "temperature": 0}
LONG_TOKENS = 1500  # far longer than a test waits: only a cancellation ends it in time
LONG = {**SHORT, "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True}
TIMEOUT_S = 60.0
# A refusal takes no engine time: well under this even on a busy 2-core machine.
REFUSAL_S = 2.0
POLL_S = 0.01
GRPC_DEADLINE_S = 0.5
InFlight = Callable[[], int]  # tiny's requests in flight now


def _request(url: str, body: dict[str, Any]) -> urllib.request.Request:
    data = json.dumps(body).encode()
    return urllib.request.Request(url, data, {"content-type": "application/json"}, method="POST")


def _post(url: str, body: dict[str, Any]) -> tuple[int, Message, bytes]:
    """The status, headers (looked up without regard to case) and body of the answer."""
    try:
        with urllib.request.urlopen(_request(url, body), timeout=TIMEOUT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(POLL_S)


@pytest.fixture
def gate(gated_client: GatedClient) -> Iterator[threading.Event]:
    """The gate of ``tiny``, closed for the test (opened again after it, whatever happened)."""
    gated_client.gate.clear()
    yield gated_client.gate
    gated_client.gate.set()


@pytest.fixture
def stub(limited_grpc_channel: grpc.Channel) -> pb_grpc.GenerationStub:
    return pb_grpc.GenerationStub(limited_grpc_channel)


@pytest.fixture
def in_flight(admission: Admission) -> Iterator[InFlight]:
    """``tiny``'s requests in flight now; the test ends only when every slot is back."""
    yield lambda: admission.in_flight()[MODEL]
    _wait_until(lambda: admission.in_flight() == {MODEL: 0, OVERLOADED_MODEL: 0}, "all freed")


def _grpc_request(max_tokens: int = SHORT["max_tokens"]) -> pb.GenerateRequest:
    params = pb.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return pb.GenerateRequest(model=MODEL, text="hello", sampling_params=params)


def test_past_the_bound_both_transports_refuse_at_once(
    limited_http_url: str,
    stub: pb_grpc.GenerationStub,
    gate: threading.Event,
    in_flight: InFlight,
) -> None:
    url = limited_http_url + COMPLETIONS
    with ThreadPoolExecutor(LIMITED_MAX_REQUESTS) as pool:
        # One whole, one streamed: both hold a slot while they wait.
        bodies = [SHORT, {**SHORT, "stream": True}][:LIMITED_MAX_REQUESTS]
        held: list[Future] = [pool.submit(_post, url, body) for body in bodies]
        _wait_until(lambda: in_flight() == LIMITED_MAX_REQUESTS, "the bound is reached")

        start = time.monotonic()
        status, headers, body = _post(url, SHORT)
        assert time.monotonic() - start < REFUSAL_S
        assert status == 429
        assert headers.get("Retry-After") == str(RETRY_AFTER_S)
        error = json.loads(body)["error"]
        assert error["type"] == "server_error" and error["code"] == "too_many_requests"
        assert error["param"] is None and MODEL in error["message"]

        for call in (stub.Complete, lambda r, timeout: list(stub.Generate(r, timeout=timeout))):
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                call(_grpc_request(), timeout=TIMEOUT_S)
            assert time.monotonic() - start < REFUSAL_S
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert MODEL in refused.value.details()
        assert in_flight() == LIMITED_MAX_REQUESTS  # refusals take no slot

        gate.set()
        assert [future.result(TIMEOUT_S)[0] for future in held] == [200] * len(held)
    _wait_until(lambda: in_flight() == 0, "the held requests gave their slots back")
    assert _post(url, SHORT)[0] == 200  # and the model serves again


def _whole(url: str, gate: threading.Event, in_flight: InFlight) -> None:
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, url, SHORT)
        _wait_until(lambda: in_flight() == 1, "it holds a slot")
        gate.set()
        assert answer.result(TIMEOUT_S)[0] == 200


def _streamed_to_the_end(url: str, gate: threading.Event, in_flight: InFlight) -> None:
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, url, {**SHORT, "stream": True})
        _wait_until(lambda: in_flight() == 1, "it holds a slot")
        gate.set()
        status, _, body = answer.result(TIMEOUT_S)
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")


def _refused_by_the_engine(url: str, gate: threading.Event, in_flight: InFlight) -> None:
    # tiny-overloaded admits nothing: the engine's refusal (503) after the router's admission.
    status, _, body = _post(url, {**SHORT, "model": OVERLOADED_MODEL})
    assert status == 503 and json.loads(body)["error"]["code"] == "overloaded"


def _disconnected_while_waiting(stream: bool) -> Callable[..., None]:
    def leave(url: str, gate: threading.Event, in_flight: InFlight) -> None:
        host, port = url.removeprefix("http://").split("/")[0].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        body = json.dumps({**SHORT, "stream": stream})
        connection.request("POST", COMPLETIONS, body, {"content-type": "application/json"})
        _wait_until(lambda: in_flight() == 1, "it holds a slot")
        connection.close()  # the client leaves before its first token

    return leave


def _stream_cancelled_mid_way(url: str, gate: threading.Event, in_flight: InFlight) -> None:
    gate.set()
    with urllib.request.urlopen(_request(url, LONG), timeout=TIMEOUT_S) as response:
        assert response.readline().startswith(b"data: ")
        assert in_flight() == 1
    # Leaving the block closed the connection, long before the 1,500 tokens.


HTTP_PATHS = {
    "whole": _whole,
    "streamed to the end": _streamed_to_the_end,
    "refused by the engine": _refused_by_the_engine,
    "client left a whole request": _disconnected_while_waiting(stream=False),
    "client left a stream before its first token": _disconnected_while_waiting(stream=True),
    "stream cancelled mid-way": _stream_cancelled_mid_way,
}


@pytest.mark.parametrize("path", HTTP_PATHS.values(), ids=HTTP_PATHS.keys())
def test_every_http_ending_gives_the_slot_back(
    path: Callable[..., None],
    limited_http_url: str,
    gate: threading.Event,
    in_flight: InFlight,
) -> None:
    path(limited_http_url + COMPLETIONS, gate, in_flight)
    _wait_until(lambda: in_flight() == 0, "the slot is back")


def _grpc_complete(
    stub: pb_grpc.GenerationStub, gate: threading.Event, in_flight: InFlight
) -> None:
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(stub.Complete, _grpc_request(), timeout=TIMEOUT_S)
        _wait_until(lambda: in_flight() == 1, "it holds a slot")
        gate.set()
        assert answer.result(TIMEOUT_S).finish_reason == "length"


def _grpc_past_its_deadline(
    stub: pb_grpc.GenerationStub, gate: threading.Event, in_flight: InFlight
) -> None:
    with pytest.raises(grpc.RpcError) as expired:
        stub.Complete(_grpc_request(), timeout=GRPC_DEADLINE_S)  # the gate stays closed
    assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def _grpc_stream_cancelled(
    stub: pb_grpc.GenerationStub, gate: threading.Event, in_flight: InFlight
) -> None:
    gate.set()
    call = stub.Generate(_grpc_request(LONG_TOKENS), timeout=TIMEOUT_S)
    assert next(call).token_ids
    assert in_flight() == 1
    call.cancel()


GRPC_PATHS = {
    "Complete": _grpc_complete,
    "past its deadline": _grpc_past_its_deadline,
    "Generate cancelled mid-way": _grpc_stream_cancelled,
}


@pytest.mark.parametrize("path", GRPC_PATHS.values(), ids=GRPC_PATHS.keys())
def test_every_grpc_ending_gives_the_slot_back(
    path: Callable[..., None],
    stub: pb_grpc.GenerationStub,
    gate: threading.Event,
    in_flight: InFlight,
) -> None:
    path(stub, gate, in_flight)
    _wait_until(lambda: in_flight() == 0, "the slot is back")
