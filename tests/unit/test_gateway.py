"""The gateway's real HAProxy in front of stand-ins for the router replicas (local HTTP servers
that hold each request until told): each replica holds its bound; the next request is refused by
HAProxy itself (429, OpenAI's envelope, ``Retry-After``) without reaching a replica, while other
paths are still answered; a change in the replicas reloads it; with none, 503; it ends with the
process that started it."""

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pdserve.cluster.gateway import (
    CONTROL_PER_REPLICA,
    POLL_S,
    RESERVED_FILES,
    Gateway,
    render,
)
from pdserve.cluster.serve import free_port
from pdserve.router.api.errors import RETRY_AFTER_S, ErrorResponse

pytestmark = pytest.mark.timeout(60)
WAIT_S = 20.0


class Replica(ThreadingHTTPServer):
    """Answers Serve's liveness path at once; holds every POST until ``release``."""

    daemon_threads = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrived = threading.Semaphore(0)
        self.posts = 0
        self.released = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # HAProxy's health checks hang up once they read the status

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    server: Replica

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(self.server.name.encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.server.posts += 1
        self.server.arrived.release()
        self.server.released.wait(WAIT_S)
        self._answer(b"done")


Answer = tuple[int, Message, bytes]  # status, headers (names in any case), body


def _send(url: str, method: str = "POST") -> Answer:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    made = [Replica("a"), Replica("b")]
    yield made
    for replica in made:
        replica.released.set()
        replica.shutdown()


def test_past_the_bound_haproxy_refuses_with_openai_429(
    replicas: list[Replica], tmp_path: Path
) -> None:
    replica = replicas[0]
    access_log = tmp_path / "access.log"
    gateway = Gateway(lambda: [replica.address], 1, "127.0.0.1", free_port(), access_log)
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    try:
        answers: list[Answer] = []
        first = threading.Thread(target=lambda: answers.append(_send(url)))
        first.start()
        assert replica.arrived.acquire(timeout=WAIT_S)  # the replica's one slot is taken
        more = [threading.Thread(target=lambda: answers.append(_send(url))) for _ in range(2)]
        for thread in more:
            thread.start()
        refused = _wait_for(lambda: [a for a in answers if a[0] == 429][1:])  # both, at once
        assert replica.posts == 1  # the refusal never reached the replica
        base = f"http://127.0.0.1:{gateway.port}"
        assert _send(f"{base}/v1/chat/completions")[0] == 429  # one bound for both paths
        # The other paths have slots of their own: a probe or a scrape is still answered.
        assert _send(f"{base}/health", "GET")[:3:2] == (200, b"a")
        _, headers, body = refused[0]
        assert headers.get("Retry-After") == str(RETRY_AFTER_S)
        assert headers.get("Content-Type") == "application/json"
        assert headers.get("Connection") == "close"  # a refused client holds no connection
        error = ErrorResponse.model_validate(json.loads(body)).error
        assert (error.type, error.code) == ("server_error", "too_many_requests")
        replica.released.set()
        for thread in [first, *more]:
            thread.join(WAIT_S)
        assert sorted(a[0] for a in answers) == [200, 429, 429]
        assert replica.posts == 1
        assert gateway.max_connections() > 0
        # HAProxy logs a request once its stream ends, which may be after its client has read it.
        lines = _wait_for(lambda: _lines_once(access_log, 5))  # the five requests above
    finally:
        gateway.stop()
    # A line per request, ACCESS_LOG_FORMAT's fields: the refusals never queued for a replica.
    by_path = sorted((fields[3], int(fields[4]), int(fields[8])) for fields in lines)
    completions, chat = "/v1/completions", "/v1/chat/completions"
    assert by_path == [
        ("/health", 200, 0), (chat, 429, -1), (completions, 200, 0), (completions, 429, -1),
        (completions, 429, -1),
    ]  # fmt: skip


def test_the_gateway_follows_the_replicas_and_answers_503_without_any(
    replicas: list[Replica],
) -> None:
    current = [replicas[0].address]
    gateway = Gateway(lambda: list(current), 4, "127.0.0.1", free_port())
    base = f"http://127.0.0.1:{gateway.port}"
    try:
        assert _send(f"{base}/v1/models", "GET")[2] == b"a"
        current[:] = [replicas[1].address]  # Serve replaced the replica
        _wait_for(lambda: _send(f"{base}/v1/models", "GET")[2] == b"b")
        current.clear()
        _, headers, body = _wait_for(lambda: _only_if_503(_send(f"{base}/v1/models", "GET")))
        assert headers.get("Retry-After") == str(RETRY_AFTER_S)
        assert ErrorResponse.model_validate(json.loads(body)).error.code == "unavailable"
        assert _send(f"{base}/-/gateway", "GET")[0] == 503
    finally:
        gateway.stop()


def _lines_once(log: Path, count: int) -> list[list[str]] | None:
    """The access log's lines, split into fields, once it has ``count`` of them."""
    lines = [line.split() for line in log.read_text().splitlines()]
    return lines if len(lines) >= count else None


def _only_if_503(answer: Answer) -> Answer | None:
    return answer if answer[0] == 503 else None


def _wait_for(probe: Callable[[], Any]) -> Any:
    """``probe()``'s first truthy answer, polled for a few reloads at most."""
    for _ in range(int(10 * POLL_S / 0.1)):
        answer = probe()
        if answer:
            return answer
        threading.Event().wait(0.1)
    pytest.fail("the gateway did not get there in time")


def test_each_replica_is_held_to_the_bound(tmp_path: Path) -> None:
    servers = [("127.0.0.1", 30000), ("10.0.0.2", 30001)]
    config = render(servers, 7, "0.0.0.0", 8000, tmp_path, 20_000)
    assert "bind 0.0.0.0:8000" in config
    # A file per client connection, after the replicas' slots (generation, control, a check).
    assert f"maxconn {20_000 - 2 * (7 + CONTROL_PER_REPLICA + 1) - RESERVED_FILES}\n" in config
    assert "option http-server-close" in config  # no idle connection holds a replica's file
    assert "default-server maxconn 7 " in config
    assert "server router0 127.0.0.1:30000" in config
    assert "server router1 10.0.0.2:30001" in config
    assert "return status 429" in config and "be_conn_free(routers)" in config
    control = f"server router1 10.0.0.2:30001 maxconn {CONTROL_PER_REPLICA} track routers/router1"
    assert control in config
    # A request that raced another for the last slot and waited past `timeout queue`: the 429.
    for backend in ("routers", "control"):
        section = config.split(f"\nbackend {backend}\n")[1].split("\nbackend ")[0]
        assert f"errorfile 503 {tmp_path / '429.http'}" in section


def _gateway_process(port: int, first: str = "") -> subprocess.Popen:
    """A process of its own that runs ``first``, then a gateway on ``port`` in front of one
    stand-in replica, prints its ``max_connections()`` once up, and waits to be killed."""
    code = (
        "import resource, time\n"
        "from pdserve.cluster.gateway import Gateway\n"
        "from pdserve.tests.unit.test_gateway import Replica\n"
        f"{first}\n"
        f"gateway = Gateway(lambda: [Replica('a').address], 1, '127.0.0.1', {port})\n"
        "print(gateway.max_connections(), flush=True)\n"
        "time.sleep(120)\n"
    )
    return subprocess.Popen([sys.executable, "-P", "-c", code], stdout=subprocess.PIPE, text=True)


def test_haproxy_ends_with_the_process_that_started_it() -> None:
    """A gateway's process killed outright (as a Ray driver whose cluster went away may be)
    leaves no HAProxy holding its port."""
    port = free_port()
    owner = _gateway_process(port)
    try:
        assert int(owner.stdout.readline()) > 0  # up: it holds connections
        assert _send(f"http://127.0.0.1:{port}/v1/models", "GET")[2] == b"a"
    finally:
        owner.kill()
        owner.wait()
    _wait_for(lambda: not _listening(port))


def test_idle_connections_past_half_the_file_limit_keep_no_new_client_waiting() -> None:
    """A burst's clients hold a file each in HAProxy, not two: with a file limit of 1,000,
    600 connections that have sent nothing (as a burst's, before its requests are written)
    leave room for a new client, answered at once (before, HAProxy held half the limit and the
    new client waited in the accept queue behind them)."""
    port = free_port()
    owner = _gateway_process(port, "resource.setrlimit(resource.RLIMIT_NOFILE, (1000, 1000))")
    idle: list[socket.socket] = []
    try:
        assert int(owner.stdout.readline()) > 600
        for _ in range(600):
            idle.append(socket.create_connection(("127.0.0.1", port)))
        with socket.create_connection(("127.0.0.1", port), timeout=5.0) as client:
            client.sendall(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\n\r\n")
            assert client.recv(64).split()[1] == b"200"  # a timeout fails it
    finally:
        for connection in idle:
            connection.close()
        owner.kill()
        owner.wait()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
