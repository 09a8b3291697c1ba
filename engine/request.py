"""A request as the engine sees it: tokens, progress through the prompt, blocks, timings."""

import enum
import time
from dataclasses import dataclass, field

import torch

from pdserve.engine.outputs import RequestMetrics
from pdserve.engine.prefix_hash import BlockHash
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.stats import FinishedRequestStats


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"  # blocks reserved; the prompt's KV is coming from a peer
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self not in (
            RequestStatus.WAITING,
            RequestStatus.WAITING_FOR_KV,
            RequestStatus.RUNNING,
        )


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    priority: int = 0  # lower runs first under the "priority" scheduling policy, as in vLLM
    cache_salt: str = ""  # kept apart in the prefix cache from requests with another salt
    block_hashes: list[BlockHash] = field(
        default_factory=list
    )  # of the full blocks of known tokens
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    hold_kv: bool = False  # prefill role: on finish its blocks are held for a peer, not freed
    # time.monotonic() seconds: arrival, first scheduled, each generated token (the first is
    # TTFT), finish
    arrival_time: float = field(default_factory=time.monotonic)
    scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    # A seeded request's own generator, so its samples do not depend on who shares the batch.
    generator: torch.Generator | None = None

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def finished_stats(self) -> FinishedRequestStats:
        """This finished request's figures for the metrics (``engine/stats.py``)."""
        end = self.finished_time if self.finished_time is not None else time.monotonic()
        scheduled = self.scheduled_time if self.scheduled_time is not None else end
        first = self.first_token_time if self.first_token_time is not None else end
        return FinishedRequestStats(
            finish_reason=self.status.value,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=len(self.output_token_ids),
            queue_time=scheduled - self.arrival_time,
            prefill_time=max(0.0, first - scheduled),
            decode_time=end - first,
            e2e_time=end - self.arrival_time,
        )

    def metrics(self) -> RequestMetrics:
        return RequestMetrics(
            arrival_time=self.arrival_time,
            first_token_time=self.first_token_time,
            finished_time=self.finished_time,
            token_times=tuple(self.token_times),
            num_cached_tokens=self.num_cached_tokens,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids_between(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:  # a decode: only output tokens, without copying the prompt
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]
