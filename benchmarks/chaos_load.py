"""``pdserve bench chaos``'s load: client loops, each sending greedy streamed completions back to
back until the run's end, and abandoning a fraction of them mid-stream (the client closes the
connection after a random number of tokens).

Every stream ends one way: completed (exactly its ``max_tokens`` tokens: ``ignore_eos``),
abandoned by the client, refused before it started (HTTP 429 or 503: admission said no), cut
(failed while a router replica was killed: the replica that held its connection may have been
that one), or failed (an error after the server accepted it, or a wrong length). Each stream keeps
its prompt and the token ids it received, for the greedy check (``chaos_greedy.py``).
"""

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Literal, NamedTuple

from pdserve.benchmarks.openai_http import (
    COMPLETIONS,
    OpenAIClient,
    OpenAIError,
    completion_body,
    token_ids,
)
from pdserve.benchmarks.serve_bench.datasets import BenchRequest

Ending = Literal["completed", "abandoned", "refused", "cut", "failed"]
ENDINGS: tuple[Ending, ...] = ("completed", "abandoned", "refused", "cut", "failed")
# Too many requests, overloaded or stopped: refusals the client may retry, not a broken stream.
REFUSAL_STATUSES = frozenset({429, 503})
WRONG_LENGTH = "wrong length"
# After a refusal or a failure: a server that answers at once would otherwise be hammered.
RETRY_PAUSE_S = 0.5


class Outcome(NamedTuple):
    ending: Ending
    tokens: int  # received
    max_tokens: int
    error: str | None  # refused, cut or failed: why
    prompt: str
    token_ids: tuple[int, ...]  # received
    span: tuple[float, float]  # time.monotonic() at its send and at its end


def abandon_point(rng: random.Random, max_tokens: int, fraction: float) -> int | None:
    """After how many tokens the client closes the stream, for ``fraction`` of streams; None: it
    reads to the end. At least one token and fewer than all, so the server is mid-stream."""
    if max_tokens < 2 or rng.random() >= fraction:
        return None
    return rng.randint(1, max_tokens - 1)


async def send(
    client: OpenAIClient, model: str, request: BenchRequest, abandon_after: int | None
) -> Outcome:
    """One greedy streamed completion; its ending is returned, never raised."""
    body = completion_body(model, request.prompt, request.output_len)
    ids: list[int] = []
    start = time.monotonic()

    def outcome(ending: Ending, error: str | None = None) -> Outcome:
        span = (start, time.monotonic())
        return Outcome(
            ending, len(ids), request.output_len, error, request.prompt, tuple(ids), span
        )

    try:
        # aclosing: leaving the loop early closes the response, so the server sees the disconnect
        async with contextlib.aclosing(client.events(COMPLETIONS, body)) as events:
            async for event in events:
                for choice in event.get("choices") or []:
                    ids += token_ids((choice.get("logprobs") or {}).get("tokens") or [])
                # A chunk may carry several tokens: one that brings the last is not left early.
                if abandon_after is not None and abandon_after <= len(ids) < request.output_len:
                    return outcome("abandoned")
    except OpenAIError as error:
        return outcome("refused" if error.status in REFUSAL_STATUSES else "failed", str(error))
    except Exception as error:  # counted and reported: the run goes on
        return outcome("failed", f"{type(error).__name__}: {error}")
    if len(ids) != request.output_len:
        return outcome("failed", WRONG_LENGTH)
    return outcome("completed")


async def client_loop(
    client: OpenAIClient,
    model: str,
    draw: Callable[[], BenchRequest],
    rng: random.Random,
    disconnect_fraction: float,
    until: float,
) -> list[Outcome]:
    """Requests back to back until ``until`` (``time.monotonic()``); the last runs to its end."""
    outcomes = []
    while time.monotonic() < until:
        request = draw()
        abandon_after = abandon_point(rng, request.output_len, disconnect_fraction)
        outcome = await send(client, model, request, abandon_after)
        outcomes.append(outcome)
        if outcome.ending in ("refused", "failed"):
            await asyncio.sleep(RETRY_PAUSE_S)
    return outcomes


async def run_load(
    client: OpenAIClient,
    model: str,
    draw: Callable[[], BenchRequest],
    streams: int,
    disconnect_fraction: float,
    until: float,
    seed: int,
) -> list[Outcome]:
    """``streams`` client loops at once; every stream's outcome, once all have ended."""
    loops = [
        client_loop(client, model, draw, random.Random(f"{seed}/{i}"), disconnect_fraction, until)
        for i in range(streams)
    ]
    return [outcome for outcomes in await asyncio.gather(*loops) for outcome in outcomes]


def cut_by_router_kills(
    outcomes: list[Outcome], kills: list[tuple[float, float]]
) -> tuple[list[Outcome], int]:
    """``outcomes`` with each failed stream that was under way when a router replica was killed
    counted as cut instead; and how many of those were sent while the kill's replica was being
    counted (``kills``: (counted, killed), ``time.monotonic()``), which its count may miss."""

    def cut(outcome: Outcome) -> bool:
        start, end = outcome.span
        return outcome.ending == "failed" and any(start <= at <= end for _, at in kills)

    endings = [outcome._replace(ending="cut") if cut(outcome) else outcome for outcome in outcomes]
    uncounted = sum(
        o.ending == "cut" and any(counted <= o.span[0] <= at for counted, at in kills)
        for o in endings
    )
    return endings, uncounted
