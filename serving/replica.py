"""A worker replica's engine and KV connector, built and reported the same way in both pools."""

import contextlib
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ray import serve

from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.kv_events import KVEventLog
from pdserve.engine.llm_engine import LLMEngine
from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.engine_hooks import ConnectorHooks
from pdserve.kvtransfer.factory import make_connector
from pdserve.kvtransfer.layout import KVLayout
from pdserve.serving.config import ServedModel
from pdserve.serving.logs import log_replica_lines
from pdserve.serving.stats_log import StatsLog
from pdserve.serving.worker_metrics import METRICS_PERIOD_S, WorkerMetrics

# Linux: the process's sizes in pages, the resident set second (psutil is no dependency of ours).
STATM = Path("/proc/self/statm")


def start_engine(served: ServedModel) -> tuple[AsyncLLMEngine, KVConnector]:
    """Loads the model, starts the engine thread and registers its KV cache for transfer."""
    config = served.engine_config()
    connectors: list[KVConnector] = []

    def hooks(engine: LLMEngine) -> ConnectorHooks:
        layout = KVLayout.of(served.name, engine.model_config, config)
        transfer = served.kv_transfer
        connector = make_connector(
            engine.kv_cache,
            layout,
            engine.free_kv,
            transfer.backend,
            lease_seconds=transfer.lease_seconds,
            timeout=transfer.timeout_seconds,
            verify=transfer.verify,
            fault_injection=transfer.fault_injection,
            fault_every=transfer.fault_every,
        )
        connectors.append(connector)
        return ConnectorHooks(connector)

    engine = AsyncLLMEngine(
        config,
        kv_hooks=hooks,
        collect_stats=served.metrics,
        kv_events=served.routing.policy == "kv_aware",
    )
    return engine, connectors[0]


def resident_set_bytes() -> int | None:
    """This process's resident set size now; None where there is no /proc (not Linux)."""
    try:
        resident_pages = int(STATM.read_text().split()[1])
    except OSError:
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def pin_process(core: int) -> None:
    """Pins every thread of this process, and those it starts later, to ``core`` (Linux)."""
    for thread_id in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread_id), {core})


class RoutingReports:
    """A replica's routing stats as the routers read them: its stats, its prefix cache's changes,
    the report's number and its stamp on this replica's own clock. A router ages a report on its
    own clock from when it first hears that number, and reads the stamp only against this
    replica's other stamps (router/dispatch/placement.py), so hosts' clocks need not agree."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._numbers = itertools.count()

    def make(self, stats: dict, kv_events: KVEventLog | None) -> dict:
        report = {**stats, "report_seq": next(self._numbers), "made_at": self._clock()}
        if kv_events is not None:
            report["kv_events"] = kv_events.report()
        return report


class EngineReplica:
    """What both pools' replicas share: the engine, its connector, metrics, stats and health."""

    pool: str  # "prefill" or "decode", the metrics' label

    def __init__(self, served: dict) -> None:
        log_replica_lines()
        self.served = ServedModel.model_validate(served)
        cores = getattr(self.served, self.pool).cpus
        if cores:
            pin_process(cores[serve.get_replica_context().rank.rank % len(cores)])
        self.engine, self.connector = start_engine(self.served)
        self._routing_reports = RoutingReports()
        if not self.served.metrics:  # nothing counted, nothing to report
            return
        replica = serve.get_replica_context().replica_id.unique_id
        self._metrics = WorkerMetrics(
            self.served.name,
            self.pool,
            replica,
            self.engine.engine.max_model_len,
            self.connector.backend,
        )
        self._stats_log = None
        if self.served.log_stats_interval_s > 0:
            name = f"{self.pool}-{self.served.name} {replica}"
            self._stats_log = StatsLog(name, self.served.log_stats_interval_s, time.monotonic())
        threading.Thread(target=self._report, name="pdserve-metrics", daemon=True).start()

    def stats(self) -> dict:
        """This replica's state for routing and tests: engine stats, transfer counters, its id,
        its process's resident memory (``pdserve bench chaos`` watches it across kills)."""
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "rss_bytes": resident_set_bytes(),
            **dataclasses.asdict(self.engine.stats),
            "kv_pinned_blocks": self.connector.num_pinned_blocks,
            "kv_transfer_failures": self.engine.num_transfer_failures,
            **{f"kv_{name}": value for name, value in vars(self.connector.stats).items()},
            "kv_num_failures": self.connector.stats.num_failures,
        }

    def record_routing_stats(self) -> dict:
        """Serve calls this periodically; the KV-aware router reads it
        (router/dispatch/placement.py)."""
        return self._routing_reports.make(self.stats(), self.engine.kv_events)

    async def check_health(self) -> None:
        self.engine.check_health()

    def _report(self) -> None:
        # Off the engine thread and the replica's loop: Ray's metric calls take microseconds each.
        while self.engine.is_running:
            time.sleep(METRICS_PERIOD_S)
            stats, work = self.engine.stats, self.engine.take_iteration_stats()
            self._metrics.record(
                stats, work, self.connector.stats, self.engine.num_transfer_failures
            )
            if self._stats_log is not None:
                self._stats_log.add(work)
                self._stats_log.maybe_log(stats, time.monotonic())
