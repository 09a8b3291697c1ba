"""Where an HTTP request's time to first token goes, as the router sees it.

``RequestTimingMiddleware`` stamps each request's arrival in the router, the moment its body has
been read, and the moment the first byte of its response body leaves; the engine client stamps
when it called the workers and when their first output came back, with the engine's own time to
first token from that output's metrics. The router's added latency is its own part of the TTFT:
from the whole request to the first byte out, less the wait on the workers. The log keeps the
most recent requests' timings for the benchmark (and, later, the metrics).
"""

import collections
import contextvars
import time
from dataclasses import asdict, dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pdserve.engine.outputs import RequestOutput

MAX_TIMINGS = 4096


@dataclass
class RequestTiming:
    """``time.monotonic()`` seconds in the router's process, except ``engine_ttft`` (a span)."""

    arrival: float
    body_received: float | None = None  # the request's last body bytes were read
    upstream_call: float | None = None  # the first call to a worker pool
    upstream_first: float | None = None  # that pool's first output arrived
    first_byte: float | None = None  # the response's first body bytes after that output
    engine_ttft: float | None = None  # a worker engine's arrival to first token

    @property
    def router_seconds(self) -> float | None:
        """The router's own share of the TTFT: from the whole request to the first byte out,
        less the wait on the workers. Under Serve, the body comes from the HTTP proxy after the
        request's start (a call back to the proxy), which is the proxy's hop, not the router's."""
        if None in (self.body_received, self.first_byte, self.upstream_call, self.upstream_first):
            return None
        return (self.first_byte - self.body_received) - (self.upstream_first - self.upstream_call)


_current: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar(
    "pdserve_request_timing", default=None
)


def mark_upstream_call() -> None:
    timing = _current.get()
    if timing is not None and timing.upstream_call is None:
        timing.upstream_call = time.monotonic()


def mark_upstream_output(output: RequestOutput) -> None:
    """Called with each output from the workers: the first stamps the wait, the first with
    metrics gives the engine's TTFT."""
    timing = _current.get()
    if timing is None:
        return
    if timing.upstream_first is None:
        timing.upstream_first = time.monotonic()
    metrics = output.metrics
    if timing.engine_ttft is None and metrics is not None and metrics.first_token_time:
        timing.engine_ttft = metrics.first_token_time - metrics.arrival_time


class TimingLog:
    def __init__(self, maxlen: int = MAX_TIMINGS) -> None:
        self._timings: collections.deque[RequestTiming] = collections.deque(maxlen=maxlen)

    def add(self, timing: RequestTiming) -> None:
        self._timings.append(timing)

    def take(self) -> list[dict]:
        """The logged requests' timings, oldest first, with ``router_seconds``; empties the log."""
        timings, self._timings = self._timings, collections.deque(maxlen=self._timings.maxlen)
        return [{**asdict(t), "router_seconds": t.router_seconds} for t in timings]


class RequestTimingMiddleware:
    """Pure ASGI middleware (it must not buffer a streamed body) that times each HTTP request."""

    def __init__(self, app: ASGIApp, log: TimingLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timing = RequestTiming(arrival=time.monotonic())
        token = _current.set(timing)

        async def timed_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                timing.body_received = time.monotonic()
            return message

        async def timed_send(message: Message) -> None:
            # The first body bytes after the workers' first output (a chat stream's role chunk
            # can go out before it).
            if (
                timing.first_byte is None
                and timing.upstream_first is not None
                and message["type"] == "http.response.body"
                and message.get("body")
            ):
                timing.first_byte = time.monotonic()
            await send(message)

        try:
            await self.app(scope, timed_receive, timed_send)
        finally:
            _current.reset(token)
            if timing.upstream_call is not None:  # requests that reached a worker
                self.log.add(timing)
