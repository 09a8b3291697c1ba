"""Prometheus for pdserve: a server on loopback, and the one client of its HTTP API.

``PrometheusServer`` is ``pdserve serve --prometheus``: the real ``prometheus`` binary (Debian
package ``prometheus``) with ``deploy/prometheus/prometheus.yml``, which scrapes every Ray node's
metrics agent through the service-discovery file Ray's dashboard writes in Ray's temp folder
(``/tmp/ray``, or where ``RAY_TMPDIR`` put it: the config is then rewritten to read it there).
Its data lives in a temporary directory, gone when it stops: a cluster that outlives one
``pdserve serve`` wants a Prometheus of its own (deploy/README.md).

``PrometheusAPI`` reads any Prometheus (PromQL instant queries, metric names) for the planner,
``pdserve bench ramp`` and the tests.
"""

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from pdserve.cluster.child_process import dying_with_parent
from pdserve.cluster.readiness import end, wait_ready
from pdserve.serving.config import DEFAULT_PROMETHEUS_PORT

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheus.yml"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2
QUERY_TIMEOUT_S = 10.0


def local_url(port: int) -> str:
    """Where a ``PrometheusServer`` on ``port`` answers."""
    return f"http://127.0.0.1:{port}"


class PrometheusNotInstalled(RuntimeError):
    pass


def prometheus_binary() -> str:
    """The ``prometheus`` on PATH; raises ``PrometheusNotInstalled`` naming the package."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusNotInstalled(
            "the prometheus binary is not on PATH: install the Debian package `prometheus` "
            "(apt-get install prometheus) or Prometheus' own release"
        )
    return binary


class PrometheusServer:
    """A running ``prometheus``; ``stop`` ends it and removes its data."""

    def __init__(
        self, port: int = DEFAULT_PROMETHEUS_PORT, config: Path = CONFIG, ray_temp_dir: str = ""
    ) -> None:
        """``ray_temp_dir``: the folder where Ray writes the service-discovery file, if not the
        one ``config`` names."""
        self.port = port
        self.url = local_url(port)
        self._data = tempfile.mkdtemp(prefix="pdserve-prometheus-")
        if ray_temp_dir:
            config = config_reading_ray_files_in(config, Path(ray_temp_dir), Path(self._data))
        self._log = open(Path(self._data) / "prometheus.log", "wb")  # noqa: SIM115
        self._process = subprocess.Popen(
            dying_with_parent(
                [
                    prometheus_binary(),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self._data}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-lifecycle",
                ]
            ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_ready(
                self._process,
                "prometheus",
                f"{self.url}/-/ready",
                Path(self._data) / "prometheus.log",
                START_TIMEOUT_S,
                POLL_S,
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        end(self._process, STOP_TIMEOUT_S)
        self._log.close()
        shutil.rmtree(self._data, ignore_errors=True)


def config_reading_ray_files_in(config: Path, ray_temp_dir: Path, folder: Path) -> Path:
    """A copy of ``config`` in ``folder`` whose scrapes read Ray's service-discovery files from
    ``ray_temp_dir`` and whose rule files are those beside ``config``."""
    settings = yaml.safe_load(config.read_text())
    settings["rule_files"] = [str(config.parent / rules) for rules in settings["rule_files"]]
    for job in settings["scrape_configs"]:
        for discovery in job.get("file_sd_configs", []):
            discovery["files"] = [str(ray_temp_dir / Path(f).name) for f in discovery["files"]]
    copy = folder / config.name
    copy.write_text(yaml.safe_dump(settings, sort_keys=False))
    return copy


class Series(NamedTuple):
    labels: dict[str, str]
    value: float  # at the query's instant
    at: float  # that instant: the evaluation time Prometheus answered for, on its own clock


class PrometheusAPI:
    """Prometheus' HTTP API at ``url``; a refused query raises (bad PromQL: ``HTTPError`` 400)."""

    def __init__(self, url: str, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, promql: str) -> list[Series]:
        """An instant query's series."""
        data = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}), promql)
        return [
            Series(s["metric"], float(s["value"][1]), float(s["value"][0])) for s in data["result"]
        ]

    def by_label(self, promql: str, label: str) -> dict[str, float]:
        """An instant query's value per value of ``label``; NaN (a ratio of nothing) left out."""
        return {s.labels.get(label, ""): s.value for s in self.query(promql) if s.value == s.value}

    def sample_ages(self, selector: str, by: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        """Per values of the labels ``by``, how old the newest sample of ``selector`` (a series
        selector, no function) is: its timestamp against the query's evaluation time, both from
        the same answer, on Prometheus' clock. Series Prometheus has marked stale (their target
        stopped answering) or last saw beyond its lookback are absent."""
        newest = self.query(f"max by ({', '.join(by)}) (timestamp({selector}))")
        return {tuple(s.labels.get(label, "") for label in by): s.at - s.value for s in newest}

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus holds a series of."""
        return set(self._get("/api/v1/label/__name__/values", "metric names"))

    def _get(self, path: str, what: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=self.timeout_s) as response:
            answer = json.load(response)
        if answer.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {what!r}: {answer}")
        return answer["data"]
