"""A worker replica's metrics: the engine's state, its work and its KV transfers, sent to Ray.

A thread of the replica calls ``record`` every ``METRICS_PERIOD_S``, so the engine thread only
counts (``engine/stats.py``) and never waits on Ray. Cumulative counts (prefix cache,
preemptions, transfers) are turned into counter increments here.
"""

from dataclasses import dataclass
from typing import get_args

from ray.util import metrics

from pdserve.engine.request import RequestStatus
from pdserve.engine.stats import EngineStats, IterationStats
from pdserve.kvtransfer.stats import FailureReason, TransferStats
from pdserve.serving.metrics import (
    ITERATION_TOKENS_BUCKETS,
    KV_TRANSFER_SECONDS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    WORKER_TAGS,
    count_from_zero,
    counter,
    gauge,
    histogram,
    one_two_five_buckets,
)

METRICS_PERIOD_S = 1.0


@dataclass
class _Cumulative:
    """The cumulative counts as last recorded, to increment counters by what is new."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    kv_bytes: int = 0
    kv_seconds: float = 0.0
    kv_transfers: int = 0
    kv_leases_expired: int = 0
    kv_recomputes: int = 0


class WorkerMetrics:
    def __init__(
        self, model_name: str, pool: str, replica: str, max_model_len: int, backend: str
    ) -> None:
        self._tags = {"model_name": model_name, "pool": pool, "replica": replica}
        self._backend = backend
        self._last = _Cumulative()
        self._last_failures: dict[str, int] = {}
        t = WORKER_TAGS
        tokens = one_two_five_buckets(max_model_len)
        self.running = gauge("num_requests_running", "Requests in model execution batches.", t)
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be processed.", t)
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.", t)
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up.", t)
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found cached.", t)
        self.preemptions = counter("num_preemptions", "Cumulative preemptions.", t)
        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens processed.", t)
        self.generation_tokens = counter("generation_tokens", "Generation tokens processed.", t)
        self.success = counter(
            "request_success", "Requests finished, by reason.", (*t, "finished_reason")
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens per engine step.", ITERATION_TOKENS_BUCKETS, t
        )
        self.prompt_len = histogram("request_prompt_tokens", "Prompt tokens.", tokens, t)
        self.output_len = histogram("request_generation_tokens", "Generated tokens.", tokens, t)
        latency = REQUEST_LATENCY_BUCKETS
        self.queue_time = histogram(
            "request_queue_time_seconds", "Time in WAITING phase for request.", latency, t
        )
        self.prefill_time = histogram(
            "request_prefill_time_seconds", "Time in PREFILL phase for request.", latency, t
        )
        self.decode_time = histogram(
            "request_decode_time_seconds", "Time in DECODE phase for request.", latency, t
        )
        self.engine_e2e = histogram(
            "request_inference_time_seconds",
            "Time from arrival to finish in the engine.",
            latency,
            t,
        )
        kv = (*t, "backend")
        self.kv_bytes = counter("kv_transfer_bytes", "KV bytes moved between replicas.", kv)
        self.kv_transfers = counter("kv_transfers", "KV transfers completed.", kv)
        self.kv_seconds = histogram(
            "kv_transfer_seconds", "Seconds per KV transfer.", KV_TRANSFER_SECONDS_BUCKETS, kv
        )
        self.kv_failures = counter(
            "kv_transfer_failures", "KV transfers that failed, by reason.", (*kv, "reason")
        )
        self.kv_leases_expired = counter(
            "kv_lease_expiries", "Exported KV blocks whose lease ran out unread.", kv
        )
        self.kv_recomputes = counter(
            "kv_transfer_recomputes", "Remote prefills recomputed here after a failed pull.", kv
        )
        self._count_from_zero()

    def _count_from_zero(self) -> None:
        """Every counter's series of this replica at 0, each finished and failure reason too."""
        tags, kv_tags = self._tags, {**self._tags, "backend": self._backend}
        for metric in (
            self.prefix_queries,
            self.prefix_hits,
            self.preemptions,
            self.prompt_tokens,
            self.generation_tokens,
        ):
            count_from_zero(metric, [tags])
        finished = [s.value for s in RequestStatus if s.finished]
        count_from_zero(self.success, [{**tags, "finished_reason": r} for r in finished])
        for metric in (
            self.kv_bytes,
            self.kv_transfers,
            self.kv_leases_expired,
            self.kv_recomputes,
        ):
            count_from_zero(metric, [kv_tags])
        reasons = get_args(FailureReason)
        count_from_zero(self.kv_failures, [{**kv_tags, "reason": r} for r in reasons])

    def record(
        self,
        stats: EngineStats,
        work: IterationStats,
        transfer: TransferStats,
        num_recomputes: int,
    ) -> None:
        # The engine thread updates `transfer` as we go: each figure is read once, and the
        # increments and the next baseline both come from that one reading, so none is lost.
        now = _Cumulative(
            stats.prefix_cache_queries,
            stats.prefix_cache_hits,
            stats.num_preemptions,
            transfer.bytes_moved,
            transfer.transfer_seconds,
            transfer.num_transfers,
            transfer.num_leases_expired,
            num_recomputes,
        )
        failures = dict(transfer.failures)
        last, tags = self._last, self._tags
        self.running.set(stats.num_running, tags)
        self.waiting.set(stats.num_waiting, tags)
        self.kv_usage.set(stats.kv_cache_usage, tags)
        _inc(self.prefix_queries, now.prefix_cache_queries - last.prefix_cache_queries, tags)
        _inc(self.prefix_hits, now.prefix_cache_hits - last.prefix_cache_hits, tags)
        _inc(self.preemptions, now.num_preemptions - last.num_preemptions, tags)
        _inc(self.prompt_tokens, work.num_prompt_tokens, tags)
        _inc(self.generation_tokens, work.num_generation_tokens, tags)
        for n in work.iteration_tokens:
            self.iteration_tokens.observe(n, tags)
        for done in work.finished:
            self.success.inc(1, {**tags, "finished_reason": done.finish_reason})
            self.prompt_len.observe(done.num_prompt_tokens, tags)
            self.output_len.observe(done.num_generation_tokens, tags)
            self.queue_time.observe(done.queue_time, tags)
            self.prefill_time.observe(done.prefill_time, tags)
            self.decode_time.observe(done.decode_time, tags)
            self.engine_e2e.observe(done.e2e_time, tags)
        self._record_transfers(now, failures)
        self._last, self._last_failures = now, failures

    def _record_transfers(self, now: _Cumulative, failures: dict[str, int]) -> None:
        tags, last = {**self._tags, "backend": self._backend}, self._last
        num_new = now.kv_transfers - last.kv_transfers
        _inc(self.kv_transfers, num_new, tags)
        _inc(self.kv_bytes, now.kv_bytes - last.kv_bytes, tags)
        if num_new:  # the mean of the new ones: the connector keeps sums, not each transfer
            mean = (now.kv_seconds - last.kv_seconds) / num_new
            for _ in range(num_new):
                self.kv_seconds.observe(mean, tags)
        _inc(self.kv_leases_expired, now.kv_leases_expired - last.kv_leases_expired, tags)
        _inc(self.kv_recomputes, now.kv_recomputes - last.kv_recomputes, tags)
        for reason, count in failures.items():
            new = count - self._last_failures.get(reason, 0)
            _inc(self.kv_failures, new, {**tags, "reason": reason})


def _inc(metric: metrics.Counter, amount: float, tags: dict[str, str]) -> None:
    if amount > 0:  # Ray refuses non-positive increments
        metric.inc(amount, tags)
