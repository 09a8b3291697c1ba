"""Per-request TTFT and inter-token latency of streamed outputs, from the in-process engine or over
the OpenAI HTTP API, with requests sent on a fixed (seeded Poisson, or all-at-once) schedule.
Tokens are timed as ``latency.TokenClock`` counts them.
"""

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from pdserve.benchmarks.latency import Timing, TokenClock, distribution
from pdserve.benchmarks.openai_http import COMPLETIONS, OpenAIClient, completion_body
from pdserve.benchmarks.workload import WorkItem
from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.sampling_params import SamplingParams


class Summary(NamedTuple):
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    tokens_per_s: float  # output tokens over the wall time from the first send to the last token


def greedy(max_tokens: int) -> SamplingParams:
    # logprobs=0 as the HTTP runs ask for (to count tokens per chunk), so the engines do alike.
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)


async def offline_request(engine: AsyncLLMEngine, request_id: str, item: WorkItem) -> Timing:
    clock = TokenClock()
    async for chunk in engine.generate(request_id, item.prompt, greedy(item.output_len)):
        clock.tick(len(chunk.outputs[0].token_ids))
    return clock.timing(item.output_len)


Send = Callable[[WorkItem], Awaitable[Timing]]


def offline_sender(engine: AsyncLLMEngine, prefix: str) -> Send:
    ids = itertools.count()
    return lambda item: offline_request(engine, f"{prefix}-{next(ids)}", item)


async def http_request(client: OpenAIClient, model: str, item: WorkItem) -> Timing:
    clock = TokenClock()
    await client.stream(COMPLETIONS, completion_body(model, item.prompt, item.output_len), clock)
    return clock.timing(item.output_len)


async def warm_up(send: Send, items: list[WorkItem]) -> None:
    await asyncio.gather(*(send(item) for item in items))


async def measure(send: Send, workload: list[WorkItem], offsets: list[float]) -> Summary:
    """Sends request i at ``offsets[i]``; summarises their timings over the wall time of it all."""
    start = time.perf_counter()

    async def one(offset: float, item: WorkItem) -> Timing:
        await asyncio.sleep(start + offset - time.perf_counter())
        return await send(item)

    timings = await asyncio.gather(*map(one, offsets, workload))
    return summarize(timings, time.perf_counter() - start)


def summarize(timings: list[Timing], seconds: float) -> Summary:
    ttft = distribution([t.ttft for t in timings])
    itl = distribution([gap for t in timings for gap in t.itls])  # 1-token outputs: no gaps
    tokens_per_s = sum(t.num_tokens for t in timings) / seconds
    return Summary(ttft.p50, ttft.p99, itl.p50, itl.p99, tokens_per_s)
