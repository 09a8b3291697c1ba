"""AsyncLLMEngine: streamed tokens equal the offline engine's; slow consumers get merged chunks;
closing a stream aborts and frees; bad requests, overload and shutdown fail fast, never hang."""

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.config import EngineConfig
from pdserve.engine.errors import (
    ContextLengthError,
    EngineOverloadedError,
    EngineStoppedError,
    RequestError,
)
from pdserve.engine.llm import LLM
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams

PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "Once upon a time",
    "a",
    "The quick brown fox jumps over the lazy dog because",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "In the beginning",
    "What is the meaning of life? The answer is",
]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
NUM_KV_BLOCKS = 512
T = TypeVar("T")
TIMEOUT_S = 30.0  # generous: CPU steps slow down a lot on a busy machine
POLL_S = 0.01


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[AsyncLLMEngine]:
    async_engine = AsyncLLMEngine(
        EngineConfig(model=str(tiny_model_dir), num_kv_blocks=NUM_KV_BLOCKS)
    )
    yield async_engine
    async_engine.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> list[RequestOutput]:
    return LLM(model=str(tiny_model_dir), num_kv_blocks=NUM_KV_BLOCKS).generate(PROMPTS, GREEDY)


def _small_engine(model_dir: Path, max_waiting_requests: int = 2) -> AsyncLLMEngine:
    config = EngineConfig(
        model=str(model_dir),
        num_kv_blocks=128,
        max_num_seqs=1,
        max_waiting_requests=max_waiting_requests,
    )
    return AsyncLLMEngine(config)


async def _collect(stream: AsyncIterator[RequestOutput], delay_s: float = 0) -> list[RequestOutput]:
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        await asyncio.sleep(delay_s)
    return chunks


async def _wait_idle(async_engine: AsyncLLMEngine, check_blocks: bool = True) -> None:
    # Polls (under `_run`'s deadline) until nothing is unfinished and every block is free again.
    inner = async_engine.engine
    while inner.has_unfinished_requests() or (
        check_blocks and inner.block_pool.num_free_blocks != inner.block_pool.num_blocks
    ):
        await asyncio.sleep(POLL_S)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    # Every test runs under a deadline: a stream that never ends must fail the test, not hang it.
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


def test_concurrent_streams_equal_offline(
    engine: AsyncLLMEngine, reference: list[RequestOutput]
) -> None:
    async def main() -> list[list[RequestOutput]]:
        streams = [engine.generate(f"c{i}", p, GREEDY) for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(*(_collect(s) for s in streams))

    for chunks, expected in zip(_run(main()), reference, strict=True):
        assert [t for c in chunks for t in c.token_ids] == expected.token_ids
        assert "".join(c.text for c in chunks) == expected.text
        assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert chunks[-1].finish_reason == "length"
    _run(_wait_idle(engine))


def test_slow_consumer_gets_merged_chunks(
    engine: AsyncLLMEngine, reference: list[RequestOutput]
) -> None:
    async def main() -> list[RequestOutput]:
        stream = engine.generate("slow", PROMPTS[0], GREEDY)
        first = await anext(stream)
        # Stay away until the engine has produced every token, so they wait to be merged.
        await _wait_idle(engine, check_blocks=False)
        return [first, *await _collect(stream)]

    chunks = _run(main())
    # The first chunk, then the rest (the final delta may land just after the engine went idle).
    assert len(chunks) <= 3 and max(len(c.token_ids) for c in chunks) > 1
    assert [t for c in chunks for t in c.token_ids] == reference[0].token_ids
    assert chunks[-1].finished and chunks[-1].finish_reason == "length"


@pytest.fixture
def aborted(engine: AsyncLLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    # The ids the inner engine is told to abort: proof that an abort, not a natural end, freed them.
    calls: list[str] = []
    real_abort = engine.engine.abort_request
    monkeypatch.setattr(
        engine.engine, "abort_request", lambda rid: (calls.append(rid), real_abort(rid))
    )
    return calls


def test_closing_the_stream_aborts_the_request(engine: AsyncLLMEngine, aborted: list[str]) -> None:
    async def main() -> RequestOutput:
        stream = engine.generate("closed", PROMPTS[1], LONG)
        first = await anext(stream)
        await stream.aclose()
        # Poll while this loop is still open: a closed loop would also get the request aborted.
        await _wait_idle(engine)
        return first

    assert not _run(main()).finished
    assert aborted == ["closed"]


def test_cancelling_the_consumer_aborts_the_request(
    engine: AsyncLLMEngine, aborted: list[str]
) -> None:
    async def main() -> None:
        consumer = asyncio.create_task(_collect(engine.generate("cancelled", PROMPTS[1], LONG)))
        await asyncio.sleep(0)  # the add is queued, its outcome not yet known: cancel now
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        while not aborted:  # the engine may not even have seen the add yet: wait for the abort
            await asyncio.sleep(POLL_S)
        await _wait_idle(engine)

    _run(main())
    assert aborted == ["cancelled"]


def test_abort_ends_the_stream_with_reason_abort(engine: AsyncLLMEngine) -> None:
    async def main() -> list[RequestOutput]:
        stream = engine.generate("aborted", PROMPTS[2], LONG)
        chunks = [await anext(stream)]
        engine.abort("aborted")
        return chunks + await _collect(stream)

    chunks = _run(main())
    assert chunks[-1].finished and chunks[-1].finish_reason == "abort"
    assert chunks[-1].metrics is not None and chunks[-1].metrics.finished_time is not None
    assert sum(len(c.token_ids) for c in chunks) < LONG.max_tokens
    _run(_wait_idle(engine))


def test_bad_requests_raise_at_once_and_queue_nothing(
    engine: AsyncLLMEngine, reference: list[RequestOutput]
) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    too_long = [5] * engine.engine.max_model_len

    async def main() -> list[RequestOutput]:
        with pytest.raises(RequestError, match="empty") as empty:
            await anext(engine.generate("empty", "", GREEDY))
        assert empty.value.param == "prompt"
        with pytest.raises(ContextLengthError):
            await anext(engine.generate("long", too_long, GREEDY))
        with pytest.raises(RequestError, match="n > 1"):
            await anext(engine.generate("n2", PROMPTS[0], SamplingParams(n=2)))
        assert not engine.engine.has_unfinished_requests()
        owner = engine.generate("dup", PROMPTS[3], GREEDY)
        first = await anext(owner)
        with pytest.raises(RequestError, match="already in use"):
            await anext(engine.generate("dup", PROMPTS[0], GREEDY))
        # The refused duplicate's cleanup must not abort the id's owner.
        return [first, *await _collect(owner)]

    chunks = _run(main())
    assert [t for c in chunks for t in c.token_ids] == reference[3].token_ids
    assert chunks[-1].finish_reason == "length"


def test_failed_step_fails_in_flight_streams_and_engine_recovers(
    engine: AsyncLLMEngine, reference: list[RequestOutput]
) -> None:
    inner = engine.engine

    def broken_step() -> list[RequestOutput]:
        del inner.step  # fail once: the class's step is back for the next call
        raise RuntimeError("boom")

    inner.step = broken_step  # the engine thread is idle, so it cannot be mid-step here
    with pytest.raises(RuntimeError, match="boom"):
        _run(_collect(engine.generate("x", PROMPTS[4], GREEDY)))
    _run(_wait_idle(engine))
    chunks = _run(_collect(engine.generate("y", PROMPTS[4], GREEDY)))
    assert [t for c in chunks for t in c.token_ids] == reference[4].token_ids


def test_overload_raises_then_everything_completes(tiny_model_dir: Path) -> None:
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    long = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)

    async def main(async_engine: AsyncLLMEngine) -> list[list[RequestOutput]]:
        running = async_engine.generate("running", PROMPTS[0], long)
        first = await anext(running)  # now it runs, and max_num_seqs=1 keeps the rest waiting
        waiting = [
            asyncio.create_task(_collect(async_engine.generate(f"w{i}", PROMPTS[i], short)))
            for i in range(2)
        ]
        await asyncio.sleep(0)  # let both tasks submit their adds
        with pytest.raises(EngineOverloadedError, match="2 requests waiting"):
            await anext(async_engine.generate("rejected", PROMPTS[2], short))
        rest = await _collect(running)
        return [[first, *rest], *await asyncio.gather(*waiting)]

    async_engine = _small_engine(tiny_model_dir)
    try:
        results = _run(main(async_engine))
        _run(_wait_idle(async_engine))
    finally:
        async_engine.shutdown()
    token_counts = [sum(len(c.token_ids) for c in chunks) for chunks in results]
    assert token_counts == [long.max_tokens, short.max_tokens, short.max_tokens]
    assert all(chunks[-1].finish_reason == "length" for chunks in results)


def test_shutdown_fails_in_flight_streams(tiny_model_dir: Path) -> None:
    async def main() -> None:
        async with _small_engine(tiny_model_dir) as async_engine:
            stream = async_engine.generate("in-flight", PROMPTS[0], LONG)
            await anext(stream)
            async_engine.shutdown()
            with pytest.raises(EngineStoppedError):
                await asyncio.wait_for(_collect(stream), TIMEOUT_S)
            with pytest.raises(EngineStoppedError):
                await anext(async_engine.generate("late", PROMPTS[0], GREEDY))
        inner = async_engine.engine
        assert inner.block_pool.num_free_blocks == inner.block_pool.num_blocks

    _run(main())


def test_the_engine_thread_builds_the_engine_and_its_kv_hooks(tiny_model_dir: Path) -> None:
    """One thread loads, allocates and steps (one OpenMP team: async_engine.py)."""
    builders = []

    def hooks(engine: Any) -> Any:
        builders.append(threading.current_thread().name)
        return None

    async_engine = AsyncLLMEngine(EngineConfig(model=str(tiny_model_dir)), kv_hooks=hooks)
    try:
        assert builders == [async_engine._thread.name]
        assert async_engine._thread is not threading.current_thread()
    finally:
        async_engine.shutdown()


def test_an_engine_that_cannot_be_built_raises_from_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        AsyncLLMEngine(EngineConfig(model=str(tmp_path / "missing")))
