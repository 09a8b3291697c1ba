"""``pdserve gateway``: the gateway (``gateway.py``) in front of a running cluster's router, for a
cluster that ``pdserve serve`` did not start (``ray up`` and ``serve deploy``): run it on the head,
where the router's replicas run, on the port clients use, with Serve's HTTP proxy elsewhere
(deploy/serve-cluster.yaml).

It joins the cluster at ``--address``, waits for the pdserve app's router to answer, and holds each
router replica to the requests that replica bounds itself to (its models'
``max_concurrent_requests``, summed) as long as the cluster lives (``head_process.py``).
"""

import argparse
import functools
import threading
import time
from pathlib import Path

from ray.serve.exceptions import RayServeException

from pdserve.cluster.gateway import Gateway, ingress_servers
from pdserve.cluster.head_process import joined, until_stopped
from pdserve.cluster.ports import ANY_HOST
from pdserve.cluster.replicas import each_answer
from pdserve.cluster.serve import APP_NAME
from pdserve.serving.config import DEFAULT_HTTP_PORT, ROUTER_DEPLOYMENT

WAIT_LOG_S = 30.0  # how often it says it is still waiting for the router
POLL_S = 1.0


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


def run(args: argparse.Namespace) -> int:
    stopping = joined(args.address)
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
        until_stopped(stopping, "pdserve gateway")
    finally:
        gateway.stop()
    return 0
