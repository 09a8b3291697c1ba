"""``pdserve gateway``: the gateway (``gateway.py``) in front of a running cluster's router, for a
cluster that ``pdserve serve`` did not start (``ray up`` and ``serve deploy``): run it on the head,
where the router's replicas run, on the port clients use, with Serve's HTTP proxy elsewhere
(deploy/serve-cluster.yaml).

It joins the cluster at ``--address``, waits for the pdserve app's router to answer, and holds each
router replica to the requests that replica bounds itself to (its models'
``max_concurrent_requests``, summed) until Ctrl-C, or until the cluster's GCS stops taking
connections (``ray stop``, ``ray down``), so that it leaves no process behind it.
"""

import argparse
import functools
import signal
import socket
import threading
import time
from pathlib import Path

import ray
from ray.serve.exceptions import RayServeException

from pdserve.cluster.gateway import Gateway, ingress_servers
from pdserve.cluster.ports import ANY_HOST
from pdserve.cluster.ray_driver import init_ray
from pdserve.cluster.replicas import each_answer
from pdserve.cluster.serve import APP_NAME
from pdserve.serving.config import DEFAULT_HTTP_PORT, ROUTER_DEPLOYMENT

WAIT_LOG_S = 30.0  # how often it says it is still waiting for the router
POLL_S = 1.0
GCS_CHECK_S = 2.0  # how often it checks that the cluster is still there
GCS_MISSES = 3  # checks in a row the GCS refused before the gateway stops


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default="auto", help="the Ray cluster to join")
    parser.add_argument("--host", default=ANY_HOST, help="where the gateway listens")
    parser.add_argument("--port", type=int, default=DEFAULT_HTTP_PORT, help="its HTTP port")
    parser.add_argument(
        "--access-log", type=Path, help="a line per request (cluster/gateway.py: ACCESS_LOG_FORMAT)"
    )


def router_bound(stopping: threading.Event) -> int | None:
    """The requests one router replica holds at most, once one answers (None: told to stop)."""
    waited_since = time.monotonic()
    while not stopping.is_set():
        try:
            answers = each_answer(ROUTER_DEPLOYMENT, "requests_in_flight")
        except (RayServeException, KeyError):  # Serve, or the app, not there yet
            answers = []
        if answers:
            return sum(answers[0]["bounds"].values())
        if time.monotonic() - waited_since >= WAIT_LOG_S:
            print(f"pdserve gateway: waiting for the {APP_NAME} app's router", flush=True)
            waited_since = time.monotonic()
        stopping.wait(POLL_S)
    return None


def gcs_answers(address: str) -> bool:
    """Whether the GCS at ``address`` (host:port) takes a connection."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=GCS_CHECK_S):
            return True
    except OSError:
        return False


def until_stopped(stopping: threading.Event, gcs: str) -> None:
    """Returns on Ctrl-C, or once the GCS has refused ``GCS_MISSES`` checks in a row."""
    misses = 0
    while misses < GCS_MISSES and not stopping.wait(GCS_CHECK_S):
        misses = 0 if gcs_answers(gcs) else misses + 1
    if misses >= GCS_MISSES:
        print(f"pdserve gateway: the cluster's GCS at {gcs} is gone; stopping", flush=True)


def run(args: argparse.Namespace) -> int:
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    init_ray(address=args.address, log_to_driver=False)
    per_replica = router_bound(stopping)
    if per_replica is None:
        return 0
    servers = functools.partial(ingress_servers, APP_NAME)
    gateway = Gateway(servers, per_replica, args.host, args.port, access_log=args.access_log)
    try:
        print(
            f"pdserve gateway: http://{args.host}:{args.port} -> {len(gateway.servers)} router "
            f"replicas, {per_replica} requests each, {gateway.max_connections()} connections",
            flush=True,
        )
        print("  Ctrl-C stops the gateway", flush=True)
        until_stopped(stopping, ray.get_runtime_context().gcs_address)
    finally:
        gateway.stop()
    return 0
