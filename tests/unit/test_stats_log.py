"""The replica's periodic stats line: rates over the interval, quiet when idle."""

from pdserve.engine.stats import EngineStats, IterationStats
from pdserve.serving.stats_log import StatsLog


def _stats(running: int = 0, queries: int = 0, hits: int = 0, usage: float = 0.0) -> EngineStats:
    return EngineStats(
        num_running=running,
        num_waiting=0,
        kv_cache_usage=usage,
        num_free_blocks=10,
        num_blocks=10,
        num_queued_prefill_tokens=0,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        num_preemptions=0,
    )


def test_a_busy_interval_logs_its_rates() -> None:
    log = StatsLog("decode-tiny", interval_s=10.0, now=100.0)
    log.add(IterationStats(num_prompt_tokens=500, num_generation_tokens=120))
    assert log.line(_stats(running=3), now=105.0) is None  # not due yet
    line = log.line(_stats(running=3, queries=400, hits=100, usage=0.125), now=110.0)
    assert line == (
        "decode-tiny: prompt 50.0 tok/s, generation 12.0 tok/s, running 3, waiting 0, "
        "KV 12.5%, prefix-cache hit rate 25.0%"
    )


def test_the_hit_rate_is_the_intervals_own() -> None:
    log = StatsLog("p", interval_s=1.0, now=0.0)
    log.add(IterationStats(num_prompt_tokens=1))
    assert log.line(_stats(queries=100, hits=100), now=1.0).endswith("hit rate 100.0%")
    log.add(IterationStats(num_prompt_tokens=1))
    assert log.line(_stats(queries=200, hits=100), now=2.0).endswith("hit rate 0.0%")


def test_idle_replicas_stay_quiet_after_one_closing_line() -> None:
    log = StatsLog("p", interval_s=1.0, now=0.0)
    log.add(IterationStats(num_generation_tokens=5))
    assert log.line(_stats(), now=1.0) is not None
    assert log.line(_stats(), now=2.0) is not None  # the interval after work: its rates fall to 0
    assert log.line(_stats(), now=3.0) is None
    assert log.line(_stats(running=1), now=4.0) is not None
