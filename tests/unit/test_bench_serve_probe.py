"""``bench serve --probe-interval``'s new clients: from a process of its own, one every interval
sends a one-token stream to a real local HTTP server and reads its status line, whether or not
the one before has its answer; the summary counts each status, the ``Retry-After`` headers and
the times; a server that is not there counts as status 0."""

import itertools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from pdserve.benchmarks.serve_bench.probe import Probe, summarize
from pdserve.cluster.serve import free_port

pytestmark = pytest.mark.timeout(60)
RUN_S = 1.0
INTERVAL_S = 0.02
SERVED_AFTER_S = 0.3  # an admitted stream's head comes with its first token, later


class _Handler(BaseHTTPRequestHandler):
    """Every other POST refused 429 with Retry-After at once, the rest 200 after
    ``SERVED_AFTER_S``: what a gateway and the router behind it answer."""

    arrivals = itertools.count(1)  # next() is atomic: the server answers on many threads
    paths: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        _Handler.paths.append(self.path)
        refused = next(_Handler.arrivals) % 2 == 1
        if not refused:
            time.sleep(SERVED_AFTER_S)
        self.send_response(429 if refused else 200)
        if refused:
            self.send_header("retry-after", "1")
        self.send_header("content-length", "0")
        self.end_headers()


@pytest.fixture
def server() -> Iterator[str]:
    made = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=made.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{made.server_address[1]}"
    made.shutdown()


def test_the_probe_counts_each_status_and_its_retry_after(server: str) -> None:
    with Probe(server, "tiny", INTERVAL_S, api_key=None) as probe:
        time.sleep(RUN_S)
    assert probe.summary is not None
    refused, served = probe.summary["429"], probe.summary["200"]
    # A client every interval, though each admitted one waits: not one per served answer.
    assert refused["count"] >= RUN_S / INTERVAL_S / 4
    assert abs(refused["count"] - served["count"]) <= 1
    assert served["p50_ms"] >= SERVED_AFTER_S * 1e3
    assert refused["retry_after"] == refused["count"] and served["retry_after"] == 0
    assert 0 < refused["p50_ms"] <= refused["p99_ms"] <= refused["max_ms"] < RUN_S * 1e3
    assert set(_Handler.paths) == {"/v1/completions"}


def test_no_server_is_status_0() -> None:
    with Probe(f"http://127.0.0.1:{free_port()}", "tiny", INTERVAL_S, api_key=None) as probe:
        time.sleep(RUN_S / 4)
    assert probe.summary is not None and list(probe.summary) == ["0"]


def test_the_summary_spreads_each_status_s_times() -> None:
    answers = [(429, True, 0.001 * (i + 1)) for i in range(100)] + [(200, False, 2.0)]
    summary = summarize(answers)
    assert summary["429"]["count"] == 100 and summary["429"]["retry_after"] == 100
    assert summary["429"]["max_ms"] == pytest.approx(100.0)
    assert summary["429"]["p50_ms"] == pytest.approx(50.5)
    assert summary["200"] == {
        "count": 1, "retry_after": 0, "mean_ms": 2000.0, "p50_ms": 2000.0, "p90_ms": 2000.0,
        "p99_ms": 2000.0, "max_ms": 2000.0,
    }  # fmt: skip
