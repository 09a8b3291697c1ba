"""Migration's bookkeeping without Ray: what a continuation asks for, and a stream that goes on
through lost replicas with no token twice or missing (the real kills: tests/e2e/test_migration.py).
"""

import asyncio
from collections.abc import AsyncIterator

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from pdserve.engine.errors import EngineStoppedError
from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.dispatch import migration
from pdserve.router.dispatch.migration import continuation, migrating
from pdserve.serving.messages import GenerateRequest

BLOCK_SIZE = 4
PROMPT = [5, 6, 7, 8, 9, 10]


def _request(**params: object) -> GenerateRequest:
    hashes: list[bytes] = []
    extend_block_hashes(hashes, PROMPT, BLOCK_SIZE)
    request = GenerateRequest("r", PROMPT, SamplingParams(**params), 2, tuple(hashes))
    request.replicas["decode"] = "replica-1"
    return request


def test_a_continuation_is_the_prompt_plus_what_was_sent_with_the_budget_left() -> None:
    request = _request(max_tokens=10, min_tokens=5, temperature=0.0)
    moved = continuation(request, [1, 2, 3], BLOCK_SIZE)
    assert moved.prompt_token_ids == [*PROMPT, 1, 2, 3]
    assert (moved.params.max_tokens, moved.params.min_tokens) == (7, 2)
    assert moved.params.temperature == 0.0
    assert (moved.request_id, moved.priority) == ("r", 2)
    expected: list[bytes] = []
    extend_block_hashes(expected, [*PROMPT, 1, 2, 3], BLOCK_SIZE)
    assert moved.block_hashes == tuple(expected) and len(expected) == 2
    assert moved.replicas == {}  # placed afresh
    assert request.prompt_token_ids == PROMPT  # the original is untouched
    assert continuation(request, [1] * 6, BLOCK_SIZE).params.min_tokens == 0


def _chunk(tokens: list[int], cached: int = 0, finished: bool = False) -> RequestOutput:
    completion = CompletionOutput(0, "", tokens, finish_reason="length" if finished else None)
    return RequestOutput("r", None, [], [completion], finished, num_cached_tokens=cached)


async def _stream(
    chunks: list[RequestOutput], lost: Exception | None = None
) -> AsyncIterator[RequestOutput]:
    for chunk in chunks:
        yield chunk
    if lost is not None:
        raise lost


def _read(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    async def read() -> list[RequestOutput]:
        return [chunk async for chunk in stream]

    return asyncio.run(read())


def test_the_stream_goes_on_after_each_lost_replica() -> None:
    resumed: list[list[int]] = []
    later = [
        _stream([_chunk([3], cached=9), _chunk([4])], ActorUnavailableError("gone", None)),
        _stream([_chunk([5]), _chunk([6], finished=True)]),
    ]

    def resume(sent: list[int]) -> AsyncIterator[RequestOutput]:
        resumed.append(sent)
        return later.pop(0)

    first = _stream([_chunk([1, 2], cached=4)], ActorDiedError())
    chunks = _read(migrating("r", first, resume, migration_limit=2))
    assert [t for c in chunks for t in c.outputs[0].token_ids] == [1, 2, 3, 4, 5, 6]
    assert resumed == [[1, 2], [1, 2, 3, 4]]
    assert chunks[-1].finished
    assert {c.num_cached_tokens for c in chunks} == {4}  # the first replica's, as the API reports


def test_past_the_limit_the_request_fails_and_other_errors_pass_through() -> None:
    def resume(sent: list[int]) -> AsyncIterator[RequestOutput]:
        return _stream([_chunk([9])], ActorDiedError())

    seen: list[RequestOutput] = []

    async def read(stream: AsyncIterator[RequestOutput]) -> None:
        async for chunk in stream:
            seen.append(chunk)

    first = _stream([_chunk([1])], ActorDiedError())
    with pytest.raises(EngineStoppedError, match="moved 1 times"):
        asyncio.run(read(migrating("r", first, resume, migration_limit=1)))
    assert [c.outputs[0].token_ids for c in seen] == [[1], [9]]

    broken = _stream([_chunk([1])], ValueError("not a lost replica"))
    with pytest.raises(ValueError):
        _read(migrating("r", broken, resume, migration_limit=3))
    with pytest.raises(EngineStoppedError, match="moved 0 times"):
        _read(migrating("r", _stream([], ActorDiedError()), resume, migration_limit=0))


async def _hanging(chunks: list[RequestOutput], closed: list[bool]) -> AsyncIterator[RequestOutput]:
    """A replica whose host went silent: its chunks, then nothing, ever (no error either)."""
    try:
        for chunk in chunks:
            yield chunk
        await asyncio.Event().wait()
    finally:
        closed.append(True)


@pytest.mark.timeout(10)  # unnoticed, the stream would hang
def test_a_silent_stream_whose_replica_left_the_pool_moves_and_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(migration, "LOST_SILENCE_S", 0.05)
    closed: list[bool] = []
    resumed: list[list[int]] = []

    def resume(sent: list[int]) -> AsyncIterator[RequestOutput]:
        resumed.append(sent)
        return _stream([_chunk([3], finished=True)])

    first = _hanging([_chunk([1, 2])], closed)
    chunks = _read(migrating("r", first, resume, migration_limit=1, lost=lambda: True))
    assert [t for c in chunks for t in c.outputs[0].token_ids] == [1, 2, 3]
    assert resumed == [[1, 2]] and closed == [True]


def test_a_slow_stream_moves_only_once_its_replica_left_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(migration, "LOST_SILENCE_S", 0.05)
    gone = {"now": False}

    async def slow() -> AsyncIterator[RequestOutput]:
        # Silent for several spans of LOST_SILENCE_S while its replica is in the pool (a long
        # queue, a long prefill): waited for. A replica leaving the pool that still streams
        # (stopping gracefully): read to its end.
        yield _chunk([1])
        await asyncio.sleep(0.3)
        gone["now"] = True
        for token in (2, 3):
            yield _chunk([token], finished=token == 3)
            await asyncio.sleep(0.01)

    def resume(sent: list[int]) -> AsyncIterator[RequestOutput]:
        raise AssertionError(f"moved after {sent}")

    chunks = _read(migrating("r", slow(), resume, migration_limit=1, lost=lambda: gone["now"]))
    assert [t for c in chunks for t in c.outputs[0].token_ids] == [1, 2, 3]
