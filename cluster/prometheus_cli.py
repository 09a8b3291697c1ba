"""``pdserve prometheus``: the Prometheus the SLA planner reads, for a cluster ``pdserve serve`` did
not start (``ray up``): run it on the head, where Ray's dashboard writes the service-discovery
file that lists every node's metrics agent (``deploy/prometheus/prometheus.yml``) and where the
planner runs (its ``resources`` ask for the head's). It serves on loopback, its data in a
temporary folder, as long as the cluster lives (``head_process.py``).
"""

import argparse

from pdserve.cluster.head_process import joined, until_stopped
from pdserve.cluster.prometheus import PrometheusServer
from pdserve.serving.config import DEFAULT_PROMETHEUS_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default="auto", help="the Ray cluster to join")
    parser.add_argument("--port", type=int, default=DEFAULT_PROMETHEUS_PORT, help="on loopback")


def run(args: argparse.Namespace) -> int:
    stopping = joined(args.address)
    prometheus = PrometheusServer(args.port)
    try:
        print(f"pdserve prometheus: {prometheus.url}", flush=True)
        print("  Ctrl-C stops Prometheus", flush=True)
        until_stopped(stopping, "pdserve prometheus")
    finally:
        prometheus.stop()
    return 0
