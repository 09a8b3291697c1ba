"""A real Prometheus scraping a small exporter on loopback, for the tests of what the planner
reads: the exporter serves a ``prometheus_client`` collector on a port of its own, and can stop
and start again as a node does."""

from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from pdserve.cluster.prometheus import PrometheusServer
from pdserve.cluster.serve import free_port


class Exporter:
    """``collector`` on a port of its own."""

    def __init__(self, collector: Collector) -> None:
        self.port, self.collector = free_port(), collector
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        self._server = None
        self.start()

    def start(self) -> None:
        self._server, _ = start_http_server(self.port, "127.0.0.1", self.registry)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def scraping(exporter: Exporter, every_s: float, folder: Path) -> PrometheusServer:
    """A Prometheus that scrapes ``exporter`` every ``every_s`` seconds (whole seconds)."""
    path = folder / "prometheus.yml"
    path.write_text(
        f"global: {{scrape_interval: {every_s:.0f}s, evaluation_interval: {every_s:.0f}s}}\n"
        "scrape_configs:\n"
        "  - job_name: pdserve\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    return PrometheusServer(free_port(), path)
