"""The chaos benchmark's kills: one replica every ``kill_every_s`` seconds of the run, of each role
in ``--kill`` in turn (round robin): of its pool's live replicas, one that carries the most
requests."""

import asyncio
import itertools
import random
import time
from typing import NamedTuple

from pdserve.benchmarks.chaos_replicas import (
    ROLES,
    MigrationCount,
    kill_replica,
    role_deployment,
)


class Kill(NamedTuple):
    at_s: float  # from the run's start
    deployment: str
    replica: str | None  # None: the pool had no live replica to kill
    carried: int  # requests running or waiting on it as it answered just before the kill
    counted_s: float  # from the run's start: when it was asked, a moment before ``at_s``


def parse_roles(text: str) -> list[str]:
    """``"decode,prefill,router"`` -> the roles to kill in turn; ``""``: no kills (a baseline
    run)."""
    roles = [role.strip() for role in text.split(",") if role.strip()]
    unknown = [role for role in roles if role not in ROLES]
    if unknown:
        raise ValueError(f"--kill takes roles among {', '.join(ROLES)}, got {', '.join(unknown)}")
    return roles


def kill_plan(roles: list[str], every_s: float, seconds: float) -> list[tuple[float, str]]:
    """(seconds from the start, role) of each kill: at every_s, 2 every_s, ... before the run's
    end, the roles in turn."""
    if every_s <= 0:
        raise ValueError(f"--kill-every must be > 0 s, got {every_s}")
    if not roles:
        return []
    times = itertools.takewhile(lambda at: at < seconds, (every_s * k for k in itertools.count(1)))
    return [(at, roles[k % len(roles)]) for k, at in enumerate(times)]


async def run_kills(
    plan: list[tuple[float, str]],
    model: str,
    start: float,
    rng: random.Random,
    migrated: MigrationCount,
) -> list[Kill]:
    """Kills as ``plan`` says, from ``start`` (``time.monotonic()``); each kill as it went. Before
    a router kill, ``migrated`` hears the router replicas' counts."""
    kills = []
    for at, role in plan:
        await asyncio.sleep(start + at - time.monotonic())
        deployment = role_deployment(role, model)
        if role == "router":
            await asyncio.to_thread(migrated.look)
        counted = time.monotonic() - start
        # Ray's state API and ray.kill block: off the loop, which carries the streams.
        replica, carried = await asyncio.to_thread(kill_replica, deployment, model, rng)
        kills.append(Kill(time.monotonic() - start, deployment, replica, carried, counted))
    return kills
