"""pdserve's metrics: vLLM's v1 names, types and buckets, exported through Ray's metrics pipeline.

Ray 2.60 takes no ``:`` in a metric name, so vLLM's ``vllm:x`` is ``pdserve_x`` here, and Ray's
exporter prefixes ``ray_`` (and counters end in ``_total``): Prometheus, the rules and the
dashboard see ``ray_pdserve_time_to_first_token_seconds_bucket``,
``ray_pdserve_prompt_tokens_total``. Every node's metrics agent serves its replicas' metrics;
``GET /metrics`` on the HTTP port gathers them from every node (``router/api/metrics_endpoint.py``).

Ray's histograms keep exact counts and buckets, but build ``_sum`` from bucket midpoints: totals
come from counters (``prompt_tokens``), never from a histogram's sum. Ray exports a gauge's value
only for a report or two after it was set (the SLA targets, set once, vanished from Prometheus a
few seconds after start), so a gauge that holds a value until it changes goes through
``HeldGauges``, which sets it again every ``HELD_GAUGE_PERIOD_S``. A counter's series for label
values known in advance (pools, finished reasons, failure reasons, route decisions, statuses) is
exported at 0 from the start (``count_from_zero``), as Prometheus advises, so ``rate()`` and the
alert rules read a healthy cluster as 0 rather than as no data.

The metric objects talk to Ray's core worker, so they are made in the process that records them
(a replica), not at import.
"""

import threading
import time
from collections.abc import Iterable, Sequence

from ray.util import metrics

from pdserve.serving import ray_compat

PREFIX = "pdserve_"
# Below the shortest interval at which Ray's processes report (2 s on a cluster pdserve starts).
HELD_GAUGE_PERIOD_S = 1.0
EXPORTER_PREFIX = "ray_"
# The names Prometheus gets for the metrics made in this process (a histogram's series appears
# once it has observed a value, but its name is still ours).
EXPORTED_NAMES: set[str] = set()
WORKER_TAGS = ("model_name", "pool", "replica")
ROUTER_TAGS = ("model_name",)

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
KV_TRANSFER_SECONDS_BUCKETS = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
]  # fmt: skip


def one_two_five_buckets(max_value: int) -> list[float]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(float(mantissa * scale))
        scale *= 10


def _export(name: str, *suffixes: str) -> str:
    exported = EXPORTER_PREFIX + PREFIX + name
    EXPORTED_NAMES.update(exported + suffix for suffix in suffixes)
    return PREFIX + name


def counter(name: str, description: str, tags: Sequence[str]) -> metrics.Counter:
    name = _export(name, "_total")
    return metrics.Counter(name, description=description, tag_keys=tuple(tags))


def count_from_zero(counter: metrics.Counter, tag_sets: Iterable[dict[str, str]]) -> None:
    """Exports each of ``counter``'s series in ``tag_sets`` now, at 0 until something is
    counted in it."""
    for tags in tag_sets:
        ray_compat.record_zero(counter, tags)


def gauge(name: str, description: str, tags: Sequence[str]) -> metrics.Gauge:
    return metrics.Gauge(_export(name, ""), description=description, tag_keys=tuple(tags))


def histogram(
    name: str, description: str, buckets: Sequence[float], tags: Sequence[str]
) -> metrics.Histogram:
    name = _export(name, "_bucket", "_count", "_sum")
    return metrics.Histogram(
        name, description=description, boundaries=list(buckets), tag_keys=tuple(tags)
    )


class HeldGauges:
    """Gauge values that hold until set again: each is set now and then every
    ``HELD_GAUGE_PERIOD_S`` from a thread of its own, so Ray keeps exporting it."""

    def __init__(self, period_s: float = HELD_GAUGE_PERIOD_S) -> None:
        self._values: dict[tuple[int, frozenset], tuple[metrics.Gauge, float, dict]] = {}
        self._lock = threading.Lock()
        self._period_s = period_s
        threading.Thread(target=self._hold, name="pdserve-gauges", daemon=True).start()

    def set(self, gauge: metrics.Gauge, value: float, tags: dict[str, str]) -> None:
        with self._lock:
            self._values[id(gauge), frozenset(tags.items())] = (gauge, value, tags)
        gauge.set(value, tags)

    def _hold(self) -> None:
        while True:
            time.sleep(self._period_s)
            with self._lock:
                held = list(self._values.values())
            for gauge, value, tags in held:
                gauge.set(value, tags)
