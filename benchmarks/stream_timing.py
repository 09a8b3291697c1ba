"""Per-request TTFT and inter-token latency of streamed outputs, from the in-process engine or over
the OpenAI HTTP API, with requests sent on a fixed (seeded Poisson, or all-at-once) schedule.

A chunk can carry several tokens (the engine merges the deltas a slow consumer has not taken, and
the cluster streams them in batches). As vLLM counts it, a chunk of k tokens that arrives g
seconds after the previous one adds k gaps of g / k; the tokens a first chunk carries beyond the
first arrive with it, at TTFT, and add no gap.
"""

import asyncio
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import numpy as np
import openai

from pdserve.benchmarks.workload import WorkItem
from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.sampling_params import SamplingParams

# Extra OpenAI request fields: the exact output length, and each chunk's tokens as ids to count.
HTTP_EXTRA = {"ignore_eos": True, "return_tokens_as_token_ids": True}
HTTP_TIMEOUT_S = 600.0


class Timing(NamedTuple):
    ttft: float  # seconds from the request's send to its first token
    itls: list[float]  # one gap per token after the first, seconds
    num_tokens: int


class Summary(NamedTuple):
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    tokens_per_s: float  # output tokens over the wall time from the first send to the last token


class TokenClock:
    """Turns a stream's chunks, as they arrive, into a ``Timing``."""

    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.last = self.sent
        self.ttft: float | None = None
        self.itls: list[float] = []
        self.num_tokens = 0

    def tick(self, num_tokens: int) -> None:
        if num_tokens == 0:  # e.g. a last chunk with only the finish reason
            return
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self.sent
        else:
            self.itls += [(now - self.last) / num_tokens] * num_tokens
        self.last = now
        self.num_tokens += num_tokens

    def timing(self, expected_tokens: int) -> Timing:
        if self.ttft is None or self.num_tokens != expected_tokens:
            raise RuntimeError(f"asked for {expected_tokens} tokens, got {self.num_tokens}")
        return Timing(self.ttft, self.itls, self.num_tokens)


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


async def http_request(sdk: openai.AsyncOpenAI, model: str, item: WorkItem) -> Timing:
    clock = TokenClock()
    stream = await sdk.completions.create(
        model=model,
        prompt=item.prompt,
        max_tokens=item.output_len,
        temperature=0,
        logprobs=0,
        stream=True,
        extra_body=HTTP_EXTRA,
    )
    async for chunk in stream:
        for choice in chunk.choices:
            clock.tick(len(choice.logprobs.tokens) if choice.logprobs else 0)
    return clock.timing(item.output_len)


def http_client(url: str) -> openai.AsyncOpenAI:
    """An OpenAI client of the server at ``url`` (e.g. ``http://127.0.0.1:8000``, no /v1)."""
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT_S
    )


def arrival_offsets(num_requests: int, rate: float, seed: int) -> list[float]:
    """Send times from the start: a Poisson process of ``rate`` requests/s, the first at 0;
    ``rate`` inf sends them all at once."""
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets = [0.0]
    for _ in range(num_requests - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets


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
    ttfts = [t.ttft for t in timings]
    itls = [gap for t in timings for gap in t.itls] or [math.nan]  # 1-token outputs: no gaps
    return Summary(
        float(np.percentile(ttfts, 50)),
        float(np.percentile(ttfts, 99)),
        float(np.percentile(itls, 50)),
        float(np.percentile(itls, 99)),
        sum(t.num_tokens for t in timings) / seconds,
    )
