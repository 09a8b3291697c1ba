"""A snapshot of the engine's state and counters, for metrics and routing."""

from dataclasses import dataclass


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
