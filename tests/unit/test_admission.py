"""The router's bound on requests in flight: slots up to the bound, the 429 past it, each slot
given back once; a request group holds its slot until it closes, refused or not."""

import asyncio
from collections.abc import Coroutine
from http import HTTPStatus
from typing import Any, TypeVar

import pytest

from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.api.admission import Admission, InFlightLimit
from pdserve.router.api.errors import RETRY_AFTER_S, APIError
from pdserve.router.api.request_group import start_group
from pdserve.serving.config import DEFAULT_MAX_CONCURRENT_REQUESTS
from pdserve.tests.unit.test_router_request_group import ScriptedClient

LIMIT = 2
TIMEOUT_S = 10.0
T = TypeVar("T")


def test_slots_up_to_the_bound_then_a_429_with_retry_after() -> None:
    limit = InFlightLimit("m", LIMIT)
    slots = [limit.acquire() for _ in range(LIMIT)]
    assert limit.in_flight == LIMIT and not limit.can_acquire()
    with pytest.raises(APIError) as refused:
        limit.acquire()
    error = refused.value
    assert error.kind.status == HTTPStatus.TOO_MANY_REQUESTS
    assert error.kind.grpc_code == "RESOURCE_EXHAUSTED"
    assert error.code == "too_many_requests" and "`m`" in error.message
    assert error.headers() == {"Retry-After": str(RETRY_AFTER_S)}
    assert limit.in_flight == LIMIT  # a refusal takes nothing
    slots[0].release()
    assert limit.can_acquire() and limit.in_flight == LIMIT - 1


def test_a_slot_is_given_back_once_however_often_released() -> None:
    limit = InFlightLimit("m", LIMIT)
    kept, released = limit.acquire(), limit.acquire()
    for _ in range(3):
        released.release()
    assert limit.in_flight == 1
    kept.release()
    assert limit.in_flight == 0


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        InFlightLimit("m", 0)


def test_admission_counts_each_model_apart() -> None:
    admission = Admission({"a": 1, "b": 3})
    admission["a"].acquire()
    admission["b"].acquire()
    admission["b"].acquire()
    assert admission.in_flight() == {"a": 1, "b": 2}
    assert (admission["a"].limit, admission["b"].limit) == (1, 3)
    defaults = Admission.with_default_limits(["x", "y"])
    assert [defaults[m].limit for m in "xy"] == [DEFAULT_MAX_CONCURRENT_REQUESTS] * 2


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT_S))


def test_a_group_holds_its_slot_until_it_closes() -> None:
    limit = InFlightLimit("scripted", LIMIT)

    async def scenario() -> list[int]:
        seen = []
        group = await start_group(ScriptedClient(), "req", [[1], [2]], SamplingParams(), 0, limit)
        seen.append(limit.in_flight)  # one slot for the whole group, however many prompts
        await group.finish()
        seen.append(limit.in_flight)
        return seen

    assert _run(scenario()) == [1, 0]


def test_an_engine_refusal_gives_the_slot_back() -> None:
    limit = InFlightLimit("scripted", LIMIT)

    async def scenario() -> None:
        client = ScriptedClient(refuse=("req-1",))
        await start_group(client, "req", [[1]], SamplingParams(n=2), 0, limit)

    with pytest.raises(Exception, match="busy"):
        _run(scenario())
    assert limit.in_flight == 0


def test_a_full_model_refuses_before_any_engine_request() -> None:
    limit = InFlightLimit("scripted", 1)
    client = ScriptedClient()

    async def scenario() -> None:
        group = await start_group(client, "a", [[1]], SamplingParams(), 0, limit)
        try:
            with pytest.raises(APIError):
                await start_group(client, "b", [[1]], SamplingParams(), 0, limit)
        finally:
            group.close()

    _run(scenario())
    assert list(client.params) == ["a-0"] and limit.in_flight == 0
