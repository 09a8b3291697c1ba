"""The SLA planner as a Serve deployment: one replica per cluster, beside the router and pools.

Every ``planner.interval_s`` its thread reads the last interval from Prometheus, lets each
model's ``ModelPlanner`` decide both pools' sizes in one step, applies them through Serve's
controller (``serve_scaler.py``: no redeploy, streams in flight live on; a replica being removed
takes no new requests and finishes its streams within Serve's graceful-shutdown timeout), logs
one line per decision and exports the figures it decided from.
"""

import threading
import time

from ray import serve

from pdserve.cluster.planner.model_planner import Decision, ModelPlanner, Observation
from pdserve.cluster.planner.policy import PoolPolicy
from pdserve.cluster.planner.profile import Profile
from pdserve.cluster.planner.prometheus_source import PrometheusSource
from pdserve.cluster.planner.serve_scaler import ServeScaler
from pdserve.cluster.planner.sizing import Targets
from pdserve.serving.config import (
    ClusterConfig,
    PlannerConfig,
    PoolConfig,
    ServedModel,
    pool_deployment,
)
from pdserve.serving.logs import replica_logger
from pdserve.serving.metrics import ROUTER_TAGS, HeldGauges, gauge

# The shortest window the planner reads: three of Prometheus' 5 s scrapes (deploy/prometheus/),
# so a short interval still sees each counter rise between two samples.
MIN_WINDOW_S = 15.0


def _policy(pool: PoolConfig, planner: PlannerConfig) -> PoolPolicy:
    return PoolPolicy(pool.lowest, pool.highest, planner.max_step, planner.scale_down_intervals)


def model_planner(served: ServedModel, planner: PlannerConfig) -> ModelPlanner:
    profile = Profile.load(planner.profile)
    targets = Targets(served.sla.ttft_ms / 1000, served.sla.itl_ms / 1000)
    prefill = _policy(served.prefill, planner) if served.disaggregated else None
    return ModelPlanner(served.name, profile, targets, prefill, _policy(served.decode, planner))


class PlannerMetrics:
    """What the planner saw and decided, per model, for the dashboard."""

    def __init__(self) -> None:
        t = ROUTER_TAGS
        self.target = gauge("planner_target_replicas", "Replicas the planner set.", (*t, "pool"))
        self.running = gauge("pool_running_replicas", "Replicas running now.", (*t, "pool"))
        self.observed = gauge(
            "planner_observed", "The last interval as the planner read it.", (*t, "figure")
        )
        self.corrections = gauge(
            "planner_correction", "Observed over predicted, by pool.", (*t, "pool")
        )
        self._held = HeldGauges()

    def record(
        self,
        model: str,
        seen: Observation,
        decision: Decision,
        running: dict[str, int],
        corrections: tuple[float, float],
    ) -> None:
        tags = {"model_name": model}
        for pool, target in (("prefill", decision.prefill), ("decode", decision.decode)):
            self._held.set(self.target, target, {**tags, "pool": pool})
        for pool, count in running.items():
            self._held.set(self.running, count, {**tags, "pool": pool})
        for figure in ("rate", "isl", "osl", "ttft_s", "itl_s", "decode_batch"):
            value = getattr(seen, figure)
            if value is not None:
                self._held.set(self.observed, value, {**tags, "figure": figure})
        for pool, value in zip(("prefill", "decode"), corrections, strict=True):
            self._held.set(self.corrections, value, {**tags, "pool": pool})


class Planner:
    def __init__(self, config: dict) -> None:
        self.config = ClusterConfig.model_validate(config)
        planner = self.config.planner
        self.interval_s = planner.interval_s
        self.models = {m.name: m for m in self.config.models}
        self.planners = {m.name: model_planner(m, planner) for m in self.config.models}
        self.current = {m.name: (m.prefill.replicas, m.decode.replicas) for m in self.config.models}
        self.source = PrometheusSource(planner.prometheus)
        self.scaler = ServeScaler(serve.get_replica_context().app_name)
        self.metrics = PlannerMetrics()
        self.decisions: list[str] = []  # every decision's log line, for tests and operators
        threading.Thread(target=self._loop, name="pdserve-planner", daemon=True).start()

    def history(self) -> list[str]:
        """Every decision so far, one line each, oldest first."""
        return list(self.decisions)

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval_s)
            try:
                self.plan()
            except Exception:  # Prometheus down, a controller hiccup: try again next interval
                replica_logger().exception("planner: this interval's decision failed")

    def plan(self) -> None:
        seen = self.source.observe(list(self.planners), max(self.interval_s, MIN_WINDOW_S))
        running_now = self.scaler.running()
        for name, planner in self.planners.items():
            current = self.current[name]
            decision = planner.step(seen[name], current)
            pools = [
                ("prefill", decision.prefill, current[0]),
                ("decode", decision.decode, current[1]),
            ]
            if not self.models[name].disaggregated:
                pools = pools[1:]
            running = {}
            for pool, target, before in pools:
                deployment = pool_deployment(pool, name)
                if target != before:
                    self.scaler.scale(deployment, target)
                running[pool] = running_now[deployment]
            self.current[name] = (decision.prefill, decision.decode)
            self.metrics.record(name, seen[name], decision, running, planner.corrections)
            replica_logger().info("planner: %s", decision.reason)
            self.decisions.append(decision.reason)
