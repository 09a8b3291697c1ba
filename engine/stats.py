"""A snapshot of the engine's state and counters, for metrics and routing."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by requests (cached-but-free ones excluded)
    num_free_blocks: int
    num_blocks: int
    num_queued_prefill_tokens: int  # prompt tokens admitted or waiting, not computed yet
    prefix_cache_queries: int  # cumulative prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # cumulative prompt tokens found there
    num_preemptions: int  # cumulative


@dataclass(frozen=True)
class FinishedRequestStats:
    """One request that ended on this engine, as vLLM's request-level metrics see it."""

    finish_reason: str  # "stop", "length" or "abort"
    num_prompt_tokens: int
    num_generation_tokens: int
    queue_time: float  # seconds from arrival to first scheduled (or its remote KV landing)
    prefill_time: float  # from first scheduled to the first token
    decode_time: float  # from the first token to the end
    e2e_time: float  # from arrival to the end


@dataclass
class IterationStats:
    """What the engine did since the stats were last taken, for counters and histograms.

    Tokens count where they are computed: a prompt when its first token is sampled here, each
    token this engine samples. A decode replica's copy of a remote prefill's first token counts
    on the prefill replica only, so the pools' sums are the requests' totals.
    """

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    iteration_tokens: list[int] = field(default_factory=list)  # tokens run in each step
    finished: list[FinishedRequestStats] = field(default_factory=list)

    def add(self, other: "IterationStats") -> None:
        self.num_prompt_tokens += other.num_prompt_tokens
        self.num_generation_tokens += other.num_generation_tokens
        self.iteration_tokens += other.iteration_tokens
        self.finished += other.finished
