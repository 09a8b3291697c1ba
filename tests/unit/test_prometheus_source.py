"""What the planner reads of a model from a real Prometheus (Debian package ``prometheus``): an
exporter serves the series a cluster's router and pool replicas export, named as Ray's exporter
names them, and ``PrometheusSource.observe`` turns the last window into each figure of an
``Observation``: rates and means from counters that grow steadily, pool figures from gauges."""

import shutil
import time
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily

from pdserve.cluster.planner.prometheus_source import PrometheusSource
from pdserve.cluster.prometheus import PrometheusAPI
from pdserve.tests.scraped import Exporter, scraping

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs the prometheus binary: Debian package `prometheus` (make test installs it)",
    ),
]

MODEL = "m"
SCRAPE_S, WINDOW_S = 1.0, 4.0
# Counters, per second: 2 requests arrive and get their first token, each with 100 prompt and 20
# generated tokens, 0.25 s to its first token, and 20 inter-token gaps of 10 ms.
COUNTERS = {
    "route_decisions_total": 2.0,
    "time_to_first_token_seconds_count": 2.0,
    "time_to_first_token_seconds_sum": 2.0 * 0.25,
    "prompt_tokens_total": 2.0 * 100,
    "generation_tokens_total": 2.0 * 20,
    "inter_token_latency_seconds_count": 2.0 * 20,
    "inter_token_latency_seconds_sum": 2.0 * 20 * 0.01,
}
# Gauges per (pool, replica): requests running and waiting, KV usage. The first prefill replica
# holds 5 prompts, 4 beyond the one it prefills; the second none.
POOLS = {
    ("prefill", "p0"): (3.0, 2.0, 0.1),
    ("prefill", "p1"): (0.0, 0.0, 0.0),
    ("decode", "d0"): (4.0, 1.0, 0.5),
    ("decode", "d1"): (2.0, 0.0, 0.9),
}


class ClusterSeries:
    def __init__(self) -> None:
        self.start = time.time()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        elapsed = time.time() - self.start
        for name, per_s in COUNTERS.items():
            family = GaugeMetricFamily(f"ray_pdserve_{name}", "", labels=["model_name"])
            family.add_metric([MODEL], per_s * elapsed)
            yield family
        gauges = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
        for i, name in enumerate(gauges):
            labels = ["model_name", "pool", "replica"]
            family = GaugeMetricFamily(f"ray_pdserve_{name}", "", labels=labels)
            for (pool, replica), values in POOLS.items():
                family.add_metric([MODEL, pool, replica], values[i])
            yield family


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory) -> Iterator[str]:
    exporter = Exporter(ClusterSeries())
    server = scraping(exporter, SCRAPE_S, tmp_path_factory.mktemp("prometheus"))
    try:
        api, deadline = PrometheusAPI(server.url), time.monotonic() + 30.0
        # A window's worth of scrapes, and one more.
        while (
            api.by_label("count_over_time(ray_pdserve_prompt_tokens_total[1m])", "model_name").get(
                MODEL, 0
            )
            < WINDOW_S / SCRAPE_S + 1
        ):
            assert time.monotonic() < deadline, "Prometheus never scraped the exporter"
            time.sleep(SCRAPE_S)
        yield server.url
    finally:
        server.stop()
        exporter.stop()


def test_each_figure_of_the_window(prometheus_url: str) -> None:
    seen = PrometheusSource(prometheus_url).observe([MODEL, "unserved"], WINDOW_S)
    got = seen[MODEL]
    # increase() extrapolates a window's samples to its edges: a steady counter's rate is exact
    # within the scrape times' jitter; the means are ratios of two such increases.
    assert got.rate == pytest.approx(2.0, rel=0.05)
    assert got.isl == pytest.approx(100.0) and got.osl == pytest.approx(20.0)
    assert got.ttft_s == pytest.approx(0.25) and got.itl_s == pytest.approx(0.01)
    assert got.decode_batch == pytest.approx(3.0)  # mean over the decode replicas
    assert got.decode_kv_usage == pytest.approx(0.9)  # the fullest
    assert got.decode_waiting == pytest.approx(1.0)  # summed
    # Prompts beyond one on each prefill replica, running or waiting, summed over the pool.
    assert got.prefill_queued == pytest.approx(4.0)
    # A model without series has no figures, and no load.
    none = seen["unserved"]
    assert none.rate == 0.0 and none.ttft_s is None and none.prefill_queued is None
