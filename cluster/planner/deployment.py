"""The SLA planner as a Serve deployment: one replica per cluster, beside the router and pools.

Every ``planner.interval_s`` its thread runs one ``ClusterPlanner`` interval
(``cluster_planner.py``): read the last interval from Prometheus, let each model's
``ModelPlanner`` decide both pools' sizes in one step, apply them through Serve's controller
(``serve_scaler.py``: no redeploy, streams in flight live on; a replica being removed takes no new
requests and finishes its streams within Serve's graceful-shutdown timeout), log one line per
decision and export the figures it decided from. A model whose data is missing holds its counts.
"""

import logging
import threading
import time

from ray import serve

from pdserve.cluster.planner.cluster_planner import ClusterPlanner
from pdserve.cluster.planner.planner_metrics import PlannerMetrics
from pdserve.cluster.planner.prometheus_source import PrometheusSource
from pdserve.cluster.planner.serve_scaler import ServeScaler
from pdserve.serving.config import ClusterConfig
from pdserve.serving.logs import log_replica_lines

logger = logging.getLogger(__name__)


class Planner:
    def __init__(self, config: dict) -> None:
        log_replica_lines()
        cluster = ClusterConfig.model_validate(config)
        self.interval_s = cluster.planner.interval_s
        self.planner = ClusterPlanner(
            cluster,
            PrometheusSource(cluster.planner.prometheus),
            ServeScaler(serve.get_replica_context().app_name),
            PlannerMetrics(),
            logger,
        )
        threading.Thread(target=self._loop, name="pdserve-planner", daemon=True).start()

    def history(self) -> list[str]:
        """Every decision so far, one line each, oldest first."""
        return list(self.planner.decisions)

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval_s)
            try:
                self.planner.plan()
            except Exception:  # a controller hiccup, Prometheus lost mid-read: next interval
                logger.exception("planner: this interval's decision failed")
