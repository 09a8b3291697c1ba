"""One run: requests sent at their scheduled offsets (at most ``max_concurrency`` in flight when
set: a request due while the limit is reached waits for a slot, and its times start when it is
sent), a progress bar of completed requests, and a ``Record`` per request."""

import asyncio
import contextlib
import time

from tqdm import tqdm

from pdserve.benchmarks.latency import TokenClock
from pdserve.benchmarks.openai_http import NO_USAGE
from pdserve.benchmarks.serve_bench.backends import Backend
from pdserve.benchmarks.serve_bench.datasets import BenchRequest
from pdserve.benchmarks.serve_bench.metrics import Record

NO_TOKENS = "the stream ended with no token"


async def send_one(backend: Backend, request: BenchRequest, start: float) -> Record:
    """Sends ``request``; a failure is recorded with its error, never raised."""
    clock, usage, error = TokenClock(), NO_USAGE, None
    try:
        usage = await backend.send(request, clock)
        if clock.ttft is None:
            error = NO_TOKENS
    except Exception as failure:  # counted and reported: the run goes on
        error = f"{type(failure).__name__}: {failure}"
    e2el = time.perf_counter() - clock.sent
    prompt_tokens, output_tokens, cached_tokens = usage
    return Record(
        sent_s=clock.sent - start,
        prompt_tokens=request.prompt_len if prompt_tokens is None else prompt_tokens,
        output_tokens=clock.num_tokens if output_tokens is None else output_tokens,
        cached_tokens=cached_tokens,
        max_tokens=request.output_len,
        ttft_s=clock.ttft,
        itls_s=clock.itls,
        e2el_s=e2el,
        error=error,
    )


async def run_schedule(
    backend: Backend,
    requests: list[BenchRequest],
    offsets: list[float],
    max_concurrency: int | None,
    progress: tqdm,
) -> tuple[list[Record], float]:
    """Sends request i at ``offsets[i]``; returns the records and the run's seconds."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(offset: float, request: BenchRequest) -> Record:
        await asyncio.sleep(start + offset - time.perf_counter())
        async with slots or contextlib.nullcontext():
            record = await send_one(backend, request, start)
        progress.update(1)
        return record

    records = await asyncio.gather(*(one(o, r) for o, r in zip(offsets, requests, strict=True)))
    return list(records), time.perf_counter() - start
