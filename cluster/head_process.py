"""A process a ``ray up`` cluster's head runs beside Ray (``pdserve gateway``, ``pdserve
prometheus``): it joins the cluster, and lives until Ctrl-C or SIGTERM, or until the cluster's GCS
stops taking connections (``ray stop``, ``ray down``), so that it leaves no process behind it.
"""

import signal
import socket
import threading

import ray

from pdserve.cluster.ray_driver import init_ray

GCS_CHECK_S = 2.0  # how often it checks that the cluster is still there
GCS_MISSES = 3  # checks in a row the GCS refused before the process stops


def joined(address: str) -> threading.Event:
    """Joins the cluster at ``address``; the event Ctrl-C and SIGTERM set."""
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    init_ray(address=address, log_to_driver=False)
    return stopping


def gcs_answers(address: str) -> bool:
    """Whether the GCS at ``address`` (host:port) takes a connection."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=GCS_CHECK_S):
            return True
    except OSError:
        return False


def until_stopped(stopping: threading.Event, name: str) -> None:
    """Returns once ``stopping`` is set, or once the joined cluster's GCS has refused
    ``GCS_MISSES`` checks in a row (saying so, as ``name``)."""
    gcs, misses = ray.get_runtime_context().gcs_address, 0
    while misses < GCS_MISSES and not stopping.wait(GCS_CHECK_S):
        misses = 0 if gcs_answers(gcs) else misses + 1
    if misses >= GCS_MISSES:
        print(f"{name}: the cluster's GCS at {gcs} is gone; stopping", flush=True)
