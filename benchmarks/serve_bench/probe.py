"""New clients beside a run (``--probe-interval``): every interval, from a process of its own,
one more client sends a streamed completion on a connection of its own, timed from its connect to
the server's status line.

A run's own requests are timed on the bench's event loop, which lags once thousands of them are
in flight: under a 10,000-request burst it saw refusals that took milliseconds as taking seconds.
The probe's clients run on threads of a process that does nothing else, so their times are what
one more client sees, the kernel's accept queue included. Each asks for one token and hangs up
once the status is in (an admitted probe is cancelled, as any client that leaves); one admitted
and waiting for its first token does not hold back the next, so refusals are timed all through
a burst.
"""

import http.client
import json
import multiprocessing
import threading
import time
import urllib.parse
from collections import defaultdict
from typing import Any

from pdserve.benchmarks.latency import distribution

TIMEOUT_S = 120.0  # an admitted probe waits for its stream's headers (its first token) this long
START_TIMEOUT_S = 60.0
MS = 1e3
ERROR = 0  # the status of a probe that got no answer (refused connection, timeout)


def _probe_once(
    url: str, body: bytes, headers: dict[str, str], answers: list[tuple[int, bool, float]]
) -> None:
    parts = urllib.parse.urlsplit(url)
    start = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    try:
        connection.request("POST", f"{parts.path.rstrip('/')}/v1/completions", body, headers)
        response = connection.getresponse()  # the status line and headers only
        answer = (response.status, response.getheader("retry-after") is not None)
    except (OSError, http.client.HTTPException):
        answer = (ERROR, False)
    finally:
        connection.close()
    answers.append((*answer, time.perf_counter() - start))  # appends are atomic


def _probe_loop(
    url: str,
    body: bytes,
    headers: dict[str, str],
    interval_s: float,
    ready: Any,  # multiprocessing.Event
    stop: Any,  # multiprocessing.Event
    out: Any,  # multiprocessing.Queue
) -> None:
    answers: list[tuple[int, bool, float]] = []
    clients = []
    ready.set()
    while not stop.is_set():
        client = threading.Thread(target=_probe_once, args=(url, body, headers, answers))
        client.start()
        clients.append(client)
        stop.wait(interval_s)
    for client in clients:  # each ends within TIMEOUT_S
        client.join()
    out.put(answers)


class Probe:
    """``with Probe(...) as probe:`` around a run; ``probe.summary`` after it."""

    def __init__(self, url: str, model: str, interval_s: float, api_key: str | None) -> None:
        request = {"model": model, "prompt": "probe", "max_tokens": 1, "stream": True}
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        context = multiprocessing.get_context("spawn")  # no copy of the bench's loop or threads
        self._ready, self._stop, self._out = context.Event(), context.Event(), context.Queue()
        body = json.dumps(request).encode()
        self._process = context.Process(
            target=_probe_loop,
            args=(url, body, headers, interval_s, self._ready, self._stop, self._out),
            daemon=True,
        )
        self.summary: dict[str, Any] | None = None

    def __enter__(self) -> "Probe":
        self._process.start()  # a fresh interpreter: the run starts once it probes
        if not self._ready.wait(START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the probe did not start in {START_TIMEOUT_S:g} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        answers = self._out.get(timeout=TIMEOUT_S + 10)
        self._process.join()
        self.summary = summarize(answers)


def summarize(answers: list[tuple[int, bool, float]]) -> dict[str, Any]:
    """Per status (0: no answer): how many, how many carried ``Retry-After``, and the seconds to
    the status line (ms: mean, p50, p90, p99, and the slowest)."""
    by_status: dict[int, list[tuple[bool, float]]] = defaultdict(list)
    for status, retry_after, seconds in answers:
        by_status[status].append((retry_after, seconds))
    summary: dict[str, Any] = {}
    for status, seen in sorted(by_status.items()):
        times = [seconds for _, seconds in seen]
        spread = {f"{k}_ms": v * MS for k, v in distribution(times)._asdict().items()}
        summary[str(status)] = {
            "count": len(seen),
            "retry_after": sum(retry_after for retry_after, _ in seen),
            **spread,
            "max_ms": max(times) * MS,
        }
    return summary
