"""One planning interval for every model: check the data, observe, decide, apply, record, log.

No Ray here: the Serve deployment (``deployment.py``) hands it Prometheus
(``prometheus_source.py``), Serve's controller (``serve_scaler.py``), Ray's metrics
(``planner_metrics.py``) and its logger. A model whose data is missing holds its counts
(``data_health.py``); the others are planned as usual.
"""

import logging

from pdserve.cluster.planner.data_health import DataHealth, Problem, data_problem, live_sources
from pdserve.cluster.planner.model_planner import ModelPlanner, Observation
from pdserve.cluster.planner.planner_metrics import PlannerMetrics
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

# The shortest window the planner reads: three of Prometheus' 5 s scrapes (deploy/prometheus/),
# so a short interval still sees each counter rise between two samples.
MIN_WINDOW_S = 15.0


def _policy(pool: PoolConfig, planner: PlannerConfig) -> PoolPolicy:
    return PoolPolicy(pool.lowest, pool.highest, planner.max_step, planner.scale_down_intervals)


def model_planner(served: ServedModel, planner: PlannerConfig) -> ModelPlanner:
    profile = Profile.load(planner.profile)
    targets = Targets(served.sla.ttft_ms / 1000, served.sla.itl_ms / 1000)
    prefill = _policy(served.prefill, planner) if served.disaggregated else None
    decode = _policy(served.decode, planner)
    max_batch = served.engine_config().max_num_seqs
    return ModelPlanner(served.name, profile, targets, prefill, decode, max_batch)


class ClusterPlanner:
    def __init__(
        self,
        config: ClusterConfig,
        source: PrometheusSource,
        scaler: ServeScaler,
        metrics: PlannerMetrics,
        logger: logging.Logger,
    ) -> None:
        self.window_s = max(config.planner.interval_s, MIN_WINDOW_S)
        self.models = {m.name: m for m in config.models}
        self.planners = {m.name: model_planner(m, config.planner) for m in config.models}
        self.current = {m.name: (m.prefill.replicas, m.decode.replicas) for m in config.models}
        self.source = source
        self.scaler = scaler
        self.metrics = metrics
        self.logger = logger
        self.health = DataHealth(logger)
        self.decisions: list[str] = []  # every decision's log line, for tests and operators
        for name, counts in self.current.items():
            metrics.targets(name, counts)

    def plan(self) -> None:
        """One interval: each model with fresh data is planned, each without holds."""
        try:
            ages, unreachable = self.source.ages(), None
        except OSError as error:  # refused, timed out, or an HTTP error status
            ages = {}
            unreachable = Problem(
                "unreachable", f"Prometheus at {self.source.api.url} does not answer: {error}"
            )
        usable = [name for name in self.planners if self._usable(name, ages, unreachable)]
        if not usable:
            return
        seen = self.source.observe(usable, self.window_s)
        running_now = self.scaler.running()
        for name in usable:
            self._apply(name, seen[name], running_now)

    def _apply(self, name: str, seen: Observation, running_now: dict[str, int]) -> None:
        """Decides the model's counts from what was seen, sets them in Serve, records them."""
        planner, current = self.planners[name], self.current[name]
        decision = planner.step(seen, current)
        pools = [("prefill", decision.prefill, current[0]), ("decode", decision.decode, current[1])]
        if not self.models[name].disaggregated:
            pools = pools[1:]
        running = {}
        for pool, target, before in pools:
            deployment = pool_deployment(pool, name)
            if target != before:
                self.scaler.scale(deployment, target)
            running[pool] = running_now[deployment]
        self.current[name] = (decision.prefill, decision.decode)
        self.metrics.targets(name, self.current[name])
        self.metrics.record(name, seen, running, planner.corrections)
        self.logger.info("planner: %s", decision.reason)
        self.decisions.append(decision.reason)

    def _usable(
        self, name: str, ages: dict[tuple[str, str], float], unreachable: Problem | None
    ) -> bool:
        counts = self.current[name]
        problem = unreachable or data_problem(ages, name, live_sources(counts), self.window_s)
        usable = self.health.update(name, problem, counts)
        self.metrics.health(name, usable)
        return usable
