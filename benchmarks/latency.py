"""Token latencies of streamed outputs: the clock that takes them as chunks arrive, and the
distribution that summarises them.

A chunk can carry several tokens (the engine merges the deltas a slow consumer has not taken, and
the cluster streams them in batches). As vLLM counts it, a chunk of k tokens that arrives g
seconds after the previous one adds k gaps of g / k; the tokens a first chunk carries beyond the
first arrive with it, at TTFT, and add gaps of 0. So a stream of n tokens has n - 1 gaps whatever
its chunks, and their mean is (last token - first token) / (n - 1), aiperf's ITL and vLLM's TPOT.
"""

import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Timing(NamedTuple):
    ttft: float  # seconds from the request's send to its first token
    itls: list[float]  # one gap per token after the first, seconds
    num_tokens: int


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
            self.itls += [0.0] * (num_tokens - 1)
        else:
            self.itls += [(now - self.last) / num_tokens] * num_tokens
        self.last = now
        self.num_tokens += num_tokens

    def timing(self, expected_tokens: int) -> Timing:
        if self.ttft is None or self.num_tokens != expected_tokens:
            raise RuntimeError(f"asked for {expected_tokens} tokens, got {self.num_tokens}")
        return Timing(self.ttft, self.itls, self.num_tokens)


class Distribution(NamedTuple):
    mean: float
    p50: float
    p90: float
    p99: float


def distribution(values: Sequence[float]) -> Distribution:
    """Mean and percentiles (numpy's linear interpolation, as vLLM's bench); NaN when empty."""
    if len(values) == 0:
        return Distribution(*[float("nan")] * len(Distribution._fields))
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return Distribution(float(np.mean(values)), float(p50), float(p90), float(p99))
