"""The router's metrics: latency where the client sees it, responses by status, route decisions.

TTFT, ITL and end-to-end latency are timed per engine request from the moment the router calls
the workers, over the chunks it forwards: a disaggregated request's TTFT holds its prefill and
the hops between the pools. A chunk of k tokens that came d seconds after the one before counts
k inter-token latencies of d / k, so the ITLs of a request add up to its decode time.
"""

import time
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping
from contextlib import aclosing
from http import HTTPStatus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pdserve.engine.outputs import RequestOutput
from pdserve.serving.config import ServedModel
from pdserve.serving.metrics import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    ROUTER_TAGS,
    TTFT_BUCKETS,
    HeldGauges,
    count_from_zero,
    counter,
    gauge,
    histogram,
)

OTHER_PATH = "other"  # the path label of a response to a path the app does not serve


class RouterMetrics:
    def __init__(self) -> None:
        t = ROUTER_TAGS
        self.ttft = histogram(
            "time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS, t
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS, t
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
            t,
        )
        self.route_decisions = counter(
            "route_decisions",
            "Where prompts prefilled: remote (prefill pool) or local (decode replica), and why.",
            (*t, "decision", "reason"),
        )
        self.route_cached_tokens = counter(
            "route_cached_tokens",
            "Prompt tokens served from a prefix cache, by route decision.",
            (*t, "decision"),
        )
        self.migrations = counter(
            "request_migrations",
            "Requests moved to another decode replica after theirs was lost "
            "(router/dispatch/migration.py).",
            t,
        )
        self.http_responses = counter(
            "http_responses", "HTTP responses by status code.", ("path", "status")
        )
        # The targets the alert rules and the dashboard compare with (deploy/prometheus/).
        self.sla_ttft = gauge("sla_ttft_seconds", "The model's TTFT target (sla.ttft_ms).", t)
        self.sla_itl = gauge("sla_itl_seconds", "The model's ITL target (sla.itl_ms).", t)
        # Where a planner runs, its planner_target_replicas supersede this (the config's count).
        self.target_replicas = gauge(
            "pool_target_replicas", "Replicas a pool starts with (its config).", (*t, "pool")
        )
        self._held = HeldGauges()

    def publish(self, served: ServedModel, routes: Collection[tuple[str, str]]) -> None:
        """The model's targets, and its counters at 0: ``routes`` are the (decision, reason)
        pairs its requests can take."""
        tags = {"model_name": served.name}
        self._held.set(self.sla_ttft, served.sla.ttft_ms / 1000, tags)
        self._held.set(self.sla_itl, served.sla.itl_ms / 1000, tags)
        for pool, config in (("prefill", served.prefill), ("decode", served.decode)):
            self._held.set(self.target_replicas, config.replicas, {**tags, "pool": pool})
        count_from_zero(
            self.route_decisions, [{**tags, "decision": d, "reason": r} for d, r in routes]
        )
        decisions = sorted({decision for decision, _ in routes})
        count_from_zero(self.route_cached_tokens, [{**tags, "decision": d} for d in decisions])
        count_from_zero(self.migrations, [tags])

    def publish_responses(self, statuses: Mapping[str, Collection[str]]) -> None:
        """Each path's ``statuses`` (those its operations document) at 0, and "other" at 404."""
        known = {**statuses, OTHER_PATH: [str(HTTPStatus.NOT_FOUND.value)]}
        count_from_zero(
            self.http_responses,
            [{"path": path, "status": status} for path, codes in known.items() for status in codes],
        )

    def count_decision(self, model_name: str, decision: str, reason: str) -> None:
        tags = {"model_name": model_name, "decision": decision, "reason": reason}
        self.route_decisions.inc(1, tags)

    def count_migration(self, model_name: str) -> None:
        self.migrations.inc(1, {"model_name": model_name})

    async def observe(
        self, model_name: str, decision: str, chunks: AsyncGenerator[RequestOutput, None]
    ) -> AsyncIterator[RequestOutput]:
        """Passes ``chunks`` through, timing them (an engine request: one completion). Closing
        this closes ``chunks`` at once, which cancels the workers' calls."""
        tags = {"model_name": model_name}
        start = time.monotonic()
        last: float | None = None
        async with aclosing(chunks):
            async for chunk in chunks:
                now = time.monotonic()
                num_tokens = len(chunk.outputs[0].token_ids)
                if num_tokens and last is None:
                    self.ttft.observe(now - start, tags)
                elif num_tokens:
                    for _ in range(num_tokens):
                        self.itl.observe((now - last) / num_tokens, tags)
                if num_tokens:
                    last = now
                if chunk.finished:
                    self.e2e.observe(now - start, tags)
                    if chunk.num_cached_tokens:
                        self.route_cached_tokens.inc(
                            chunk.num_cached_tokens, {**tags, "decision": decision}
                        )
                yield chunk


class ResponseCounter:
    """ASGI middleware: counts each HTTP response by path and status code; a path the app does
    not serve counts as "other", so a scanner cannot add series."""

    def __init__(self, app: ASGIApp, metrics: RouterMetrics, paths: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                path = scope["path"] if scope["path"] in self.paths else OTHER_PATH
                tags = {"path": path, "status": str(message["status"])}
                self.metrics.http_responses.inc(1, tags)
            await send(message)

        await self.app(scope, receive, counting_send)
