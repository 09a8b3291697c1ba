"""The planner fails safe: with Prometheus down, holding no series of a model, or only samples
older than the window, it holds both pools' counts, logs one line per change of state, exports
health 0, and plans again once the data returns.

First against a stub source (each state in turn, no Prometheus), then against a real Prometheus
(Debian package ``prometheus``) scraping a small exporter of pdserve's live series: nothing
listening, no series of the model, a target that stops answering, samples that stop advancing.
No Ray: the planner's Serve controller and Ray metrics are stand-ins that record what it did.
"""

import logging
import shutil
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily

from pdserve.cluster.planner import cluster_planner
from pdserve.cluster.planner.cluster_planner import ClusterPlanner
from pdserve.cluster.planner.data_health import live_sources
from pdserve.cluster.planner.model_planner import Observation
from pdserve.cluster.planner.profile import DecodePoint, PrefillPoint, Profile
from pdserve.cluster.planner.prometheus_source import (
    POOL_SERIES,
    ROUTER,
    ROUTER_SERIES,
    PrometheusSource,
)
from pdserve.cluster.prometheus import PrometheusAPI, PrometheusServer, local_url
from pdserve.cluster.serve import free_port
from pdserve.serving.config import ClusterConfig, pool_deployment
from pdserve.tests.scraped import Exporter, scraping

MODEL = "m"
STAMPED = "stamped"  # exported with timestamps of its own (LiveSeries)
START = (2, 2)  # prefill, decode: each may go from 1 to 3
IDLE = Observation(0.0, None, None, None, None, None)  # fresh data that wants the minimum
FRESH = {(MODEL, ROUTER): 1.0, (MODEL, "prefill"): 1.0, (MODEL, "decode"): 1.0}
HOLDS = 4  # intervals planned while the data is missing
SCRAPE_S = 1.0  # the real Prometheus' scrape interval
WAIT_S = 20.0  # longest wait for the real Prometheus to show a change
SHORT_WINDOW_S = 3.0  # the window when samples must go stale within a test
BACK = f"planner: {MODEL}: data is back; planning resumes"


class Scaler:
    """Serve's controller as the planner sees it: each pool at the count last set."""

    def __init__(self, config: ClusterConfig) -> None:
        self.calls: list[tuple[str, int]] = []
        self.counts = {
            pool_deployment(pool, m.name): getattr(m, pool).replicas
            for m in config.models
            for pool in ("prefill", "decode")
        }

    def scale(self, deployment: str, replicas: int) -> None:
        self.calls.append((deployment, replicas))
        self.counts[deployment] = replicas

    def running(self) -> dict[str, int]:
        return dict(self.counts)


class Metrics:
    """The planner's exported figures, as the last values set."""

    def __init__(self) -> None:
        self.healthy: dict[str, bool] = {}
        self.targets_set: dict[str, tuple[int, int]] = {}

    def targets(self, model: str, counts: tuple[int, int]) -> None:
        self.targets_set[model] = counts

    def health(self, model: str, healthy: bool) -> None:
        self.healthy[model] = healthy

    def record(self, *figures: object) -> None:
        pass


class StubSource:
    """Prometheus as the planner reads it, set to each state in turn."""

    def __init__(self) -> None:
        self.api = PrometheusSource("http://stub").api
        self.sample_ages: dict[tuple[str, str], float] = dict(FRESH)
        self.error: OSError | None = None

    def ages(self) -> dict[tuple[str, str], float]:
        if self.error is not None:
            raise self.error
        return dict(self.sample_ages)

    def observe(self, models: list[str], window_s: float) -> dict[str, Observation]:
        return dict.fromkeys(models, IDLE)


@pytest.fixture
def config(tmp_path: Path) -> ClusterConfig:
    profile = Profile(
        model=MODEL,
        prefill=(PrefillPoint(16, 0.016), PrefillPoint(1024, 1.0)),
        decode=tuple(DecodePoint(b, c, 0.01 + 0.001 * b) for b in (1, 32) for c in (128, 1024)),
    )
    profile.save(tmp_path / "profile.json")
    pool = {"replicas": 2, "min_replicas": 1, "max_replicas": 3}
    model = {"name": MODEL, "path": str(tmp_path), "prefill": pool, "decode": pool}
    planner = {"enabled": True, "interval_s": 5.0, "profile": str(tmp_path / "profile.json")}
    return ClusterConfig.model_validate({"models": [model], "planner": planner})


def _named(config: ClusterConfig, name: str) -> ClusterConfig:
    return config.model_copy(
        update={"models": [config.models[0].model_copy(update={"name": name})]}
    )


def _planner(config: ClusterConfig, source) -> tuple[ClusterPlanner, Scaler, Metrics]:
    scaler, metrics = Scaler(config), Metrics()
    logger = logging.getLogger("pdserve.test-planner")
    return ClusterPlanner(config, source, scaler, metrics, logger), scaler, metrics


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


MISSING = {
    "unreachable": ("error", urllib.error.URLError(ConnectionRefusedError(111, "refused"))),
    "no series": ("sample_ages", {}),
    "no series of its decode": (
        "sample_ages",
        {k: v for k, v in FRESH.items() if k[1] != "decode"},
    ),
    "stale": ("sample_ages", {**FRESH, (MODEL, ROUTER): 60.0}),
}


@pytest.mark.parametrize("state", list(MISSING))
def test_missing_data_holds_the_pools_logs_once_and_resumes(config, caplog, state) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.test-planner")
    source = StubSource()
    planner, scaler, metrics = _planner(config, source)
    assert metrics.targets_set == {MODEL: START}  # PdserveReplicaDown's target from the start
    attribute, value = MISSING[state]
    setattr(source, attribute, value)
    for _ in range(HOLDS):  # read as no load, these intervals would shrink both pools
        planner.plan()
    assert scaler.calls == [] and planner.current[MODEL] == START
    assert metrics.healthy == {MODEL: False} and planner.decisions == []
    (warning,) = _lines(caplog, logging.WARNING)
    assert warning.startswith(f"planner: {MODEL}: holding prefill 2, decode 2") and state in warning
    source.error, source.sample_ages = None, dict(FRESH)
    for _ in range(2):  # idle for scale_down_intervals: down by a step
        planner.plan()
    assert metrics.healthy == {MODEL: True}
    assert _lines(caplog, logging.INFO)[0] == BACK
    assert scaler.calls == [("prefill-m", 1), ("decode-m", 1)]
    assert metrics.targets_set == {MODEL: (1, 1)} and len(planner.decisions) == 2


def test_a_new_kind_of_problem_logs_again_and_its_changing_figures_do_not(config, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.test-planner")
    source = StubSource()
    planner, _, _ = _planner(config, source)
    for age in (20.0, 30.0, 40.0):  # older each interval: still the one state
        source.sample_ages = {**FRESH, (MODEL, "decode"): age}
        planner.plan()
    source.error = urllib.error.URLError(TimeoutError("timed out"))
    planner.plan()
    planner.plan()
    first, second = _lines(caplog, logging.WARNING)
    assert "decode is 20 s old, over the 15 s window (stale)" in first
    assert "Prometheus at http://stub does not answer" in second and "(unreachable)" in second


def test_a_pool_at_zero_need_not_export() -> None:
    # A pool scaled to zero exports nothing: waiting for its series would hold it at zero.
    assert live_sources((0, 1)) == [ROUTER, "decode"]
    assert live_sources((2, 1)) == [ROUTER, "prefill", "decode"]


# -- against a real Prometheus ---------------------------------------------------------------

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="needs the prometheus binary: Debian package `prometheus` (make test installs it)",
)


class LiveSeries:
    """What a pdserve cluster always exports of a model, as Ray's exporter names it: of ``MODEL``
    as Ray does, and of ``STAMPED`` with each sample's own timestamp, which stops advancing at
    ``frozen_at`` (Unix seconds) while the target answers on, as a federated or pushed series
    can. Prometheus marks neither kind stale while its target answers, nor the second ever."""

    def __init__(self) -> None:
        self.frozen_at: float | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        router = GaugeMetricFamily(ROUTER_SERIES, "", labels=["model_name"])
        pools = GaugeMetricFamily(POOL_SERIES, "", labels=["model_name", "pool", "replica"])
        stamp = time.time() if self.frozen_at is None else self.frozen_at
        for model, timestamp in ((MODEL, None), (STAMPED, stamp)):
            router.add_metric([model], 0.5, timestamp=timestamp)
            for pool in ("prefill", "decode"):
                pools.add_metric([model, pool, "r0"], 0.0, timestamp=timestamp)
        yield router
        yield pools


@pytest.fixture(scope="module")
def exporter() -> Iterator[Exporter]:
    exporter = Exporter(LiveSeries())
    yield exporter
    exporter.stop()


@pytest.fixture(scope="module")
def prometheus(exporter: Exporter, tmp_path_factory) -> Iterator[PrometheusServer]:
    server = scraping(exporter, SCRAPE_S, tmp_path_factory.mktemp("prometheus"))
    try:
        api, deadline = PrometheusAPI(server.url), time.monotonic() + WAIT_S
        while (MODEL,) not in api.sample_ages(ROUTER_SERIES, ("model_name",)):
            assert time.monotonic() < deadline, "Prometheus never scraped the exporter"
            time.sleep(SCRAPE_S)
        yield server
    finally:
        server.stop()


def _plan_until(
    planner: ClusterPlanner, metrics: Metrics, healthy: bool, model: str = MODEL
) -> float:
    """Plans each scrape interval until the model's health is ``healthy``; the seconds taken."""
    start = time.monotonic()
    while True:
        planner.plan()
        if metrics.healthy[model] == healthy:
            return time.monotonic() - start
        assert time.monotonic() - start < WAIT_S, f"health never became {healthy}"
        time.sleep(SCRAPE_S)


def test_prometheus_down_holds(config, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.test-planner")
    planner, scaler, metrics = _planner(config, PrometheusSource(local_url(free_port())))
    for _ in range(HOLDS):
        planner.plan()
    assert scaler.calls == [] and metrics.healthy == {MODEL: False}
    (warning,) = _lines(caplog, logging.WARNING)
    assert "does not answer" in warning


@pytest.mark.slow
@needs_prometheus
def test_a_real_prometheus_without_the_models_series_holds(config, prometheus, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.test-planner")
    planner, scaler, metrics = _planner(
        _named(config, "unscraped"), PrometheusSource(prometheus.url)
    )
    for _ in range(HOLDS):
        planner.plan()
    assert scaler.calls == [] and metrics.healthy == {"unscraped": False}
    (warning,) = _lines(caplog, logging.WARNING)
    assert "Prometheus holds no series of its router, prefill, decode (no series)" in warning


@pytest.mark.slow
@needs_prometheus
def test_a_target_that_stops_holds_within_the_window_and_its_return_resumes(
    config, exporter, prometheus, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.test-planner")
    planner, scaler, metrics = _planner(config, PrometheusSource(prometheus.url))
    _plan_until(planner, metrics, healthy=True)
    exporter.stop()  # Prometheus' next scrape fails, and it marks the target's series stale
    try:
        assert _plan_until(planner, metrics, healthy=False) < planner.window_s
        held, scaled, decided = planner.current[MODEL], list(scaler.calls), len(planner.decisions)
        for _ in range(HOLDS):  # read as no load, these intervals would shrink both pools
            planner.plan()
        assert scaler.calls == scaled and planner.current[MODEL] == held
        assert len(planner.decisions) == decided
        (warning,) = _lines(caplog, logging.WARNING)
        assert "(no series)" in warning
    finally:
        exporter.start()
    _plan_until(planner, metrics, healthy=True)
    assert len(planner.decisions) == decided + 1  # planning resumed
    assert _lines(caplog, logging.INFO).count(BACK) == 1


@pytest.mark.slow
@needs_prometheus
def test_samples_older_than_the_window_hold(config, exporter, prometheus, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="pdserve.test-planner")
    monkeypatch.setattr(cluster_planner, "MIN_WINDOW_S", SHORT_WINDOW_S)
    config = _named(config, STAMPED)
    config = config.model_copy(
        update={"planner": config.planner.model_copy(update={"interval_s": SCRAPE_S})}
    )
    planner, scaler, metrics = _planner(config, PrometheusSource(prometheus.url))
    _plan_until(planner, metrics, healthy=True, model=STAMPED)
    exporter.collector.frozen_at = time.time()  # the target answers on, with this sample
    try:
        assert _plan_until(planner, metrics, healthy=False, model=STAMPED) < WAIT_S
        held, scaled = planner.current[STAMPED], list(scaler.calls)
        for _ in range(HOLDS):
            planner.plan()
        assert scaler.calls == scaled and planner.current[STAMPED] == held
    finally:
        exporter.collector.frozen_at = None
    (warning,) = _lines(caplog, logging.WARNING)
    assert f"over the {SHORT_WINDOW_S:.0f} s window (stale)" in warning
    _plan_until(planner, metrics, healthy=True, model=STAMPED)
