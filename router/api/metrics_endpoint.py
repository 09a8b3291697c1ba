"""``GET /metrics``: the cluster's pdserve metrics in Prometheus' text format, where vLLM users
and aiperf look for them.

Each Ray node's metrics agent serves the metrics of the processes on it; this asks every live node
and joins their ``ray_pdserve_*`` families into one page (a family's samples from all nodes under
one HELP/TYPE, as the format requires). Prometheus itself scrapes the agents through Ray's
service discovery (``deploy/prometheus/``); this page is the same data, one hop later.
"""

import asyncio
import urllib.request
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

EXPORTED_PREFIX = "ray_pdserve_"
FETCH_TIMEOUT_S = 5.0


def merge_families(pages: Iterable[str], prefix: str = EXPORTED_PREFIX) -> list[Metric]:
    """The families whose names start with ``prefix``, each one's samples from every page."""
    families: dict[str, Metric] = {}
    for page in pages:
        for family in text_string_to_metric_families(page):
            if not family.name.startswith(prefix):
                continue
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            merged.samples.extend(family.samples)
    return list(families.values())


def render(families: list[Metric]) -> bytes:
    class _Families:
        def collect(self) -> Iterator[Metric]:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families())
    return generate_latest(registry)


def _agent_urls() -> list[str]:
    import ray

    return [
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for node in ray.nodes()
        if node["Alive"]
    ]


def _fetch(url: str) -> str:
    # A node that does not answer leaves its samples out of this page, not the whole page.
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return response.read().decode()
    except OSError:
        return ""


async def cluster_metrics() -> bytes:
    """Every live node's pdserve metrics as one Prometheus text page."""
    urls = await asyncio.to_thread(_agent_urls)
    pages = await asyncio.gather(*(asyncio.to_thread(_fetch, url) for url in urls))
    return render(merge_families(pages))
