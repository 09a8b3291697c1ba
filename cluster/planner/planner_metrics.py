"""What the planner saw and decided, per model, for the dashboard and the alerts.

``planner_target_replicas`` is each pool's count as the planner last set it, from its start on:
``PdserveReplicaDown`` (deploy/prometheus/rules.yml) compares the healthy replicas with it, and
with the router's ``pool_target_replicas`` (the config's count) only where no planner runs.
"""

from pdserve.cluster.planner.model_planner import Observation
from pdserve.serving.metrics import ROUTER_TAGS, HeldGauges, gauge


class PlannerMetrics:
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
        self.data_healthy = gauge(
            "planner_data_healthy",
            "1 while Prometheus gives the planner fresh data of the model, 0 while it holds the "
            "pools for lack of it (cluster/planner/data_health.py).",
            t,
        )
        self._held = HeldGauges()

    def targets(self, model: str, counts: tuple[int, int]) -> None:
        """The (prefill, decode) counts the planner has set."""
        for pool, target in zip(("prefill", "decode"), counts, strict=True):
            self._held.set(self.target, target, {"model_name": model, "pool": pool})

    def health(self, model: str, healthy: bool) -> None:
        self._held.set(self.data_healthy, float(healthy), {"model_name": model})

    def record(
        self,
        model: str,
        seen: Observation,
        running: dict[str, int],
        corrections: tuple[float, float],
    ) -> None:
        """One decision's figures: what it saw, the replicas running, its corrections."""
        tags = {"model_name": model}
        for pool, count in running.items():
            self._held.set(self.running, count, {**tags, "pool": pool})
        for figure in Observation.__dataclass_fields__:
            value = getattr(seen, figure)
            if value is not None:
                self._held.set(self.observed, value, {**tags, "figure": figure})
        for pool, value in zip(("prefill", "decode"), corrections, strict=True):
            self._held.set(self.corrections, value, {**tags, "pool": pool})
