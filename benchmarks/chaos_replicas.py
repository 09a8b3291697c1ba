"""The chaos benchmark's view of the cluster, from a driver joined to it: killing a pool's or
the router's replica, every live replica's stats once the pools and the router are whole again,
and the router replicas' migration count. What a replica is and how its stats are read:
``cluster/replicas.py``.
"""

import random
import time

from pdserve.cluster.replicas import (
    answering_replica_stats,
    each_answer,
    live_replica_stats,
    live_replicas,
)
from pdserve.serving.config import ROUTER_DEPLOYMENT, pool_deployment
from pdserve.serving.ray_compat import kill_replica_actor

POOLS = ("prefill", "decode")
ROLES = (*POOLS, "router")
POLL_S = 0.5


def role_deployment(role: str, model: str) -> str:
    """The deployment whose replicas a kill of ``role`` takes: the model's pool, or the router."""
    return ROUTER_DEPLOYMENT if role == "router" else pool_deployment(role, model)


def carried_requests(deployment: str, model: str) -> dict[str, int]:
    """Each answering replica's requests of ``model`` by replica id: a pool replica's running
    and waiting, a router replica's in flight."""
    if deployment == ROUTER_DEPLOYMENT:
        answers = each_answer(deployment, "requests_in_flight")
        return {answer["replica"]: answer["models"].get(model, 0) for answer in answers}
    stats = answering_replica_stats(deployment)
    return {replica: s["num_running"] + s["num_waiting"] for replica, s in stats.items()}


def kill_replica(deployment: str, model: str, rng: random.Random) -> tuple[str | None, int]:
    """Kills one of the deployment's live replicas that carries the most requests of ``model``
    (as it answered just before; a replica that did not answer counts as carrying none), chosen
    at random among equals: a kill of an idle replica would test nothing. Returns its id and
    those requests, or (None, 0) if the deployment has no live replica. Serve starts a
    replacement by itself."""
    replicas = live_replicas(deployment)
    if not replicas:
        return None, 0
    answered = carried_requests(deployment, model)
    carried = {replica: answered.get(replica, 0) for replica in replicas}
    most = max(carried.values())
    replica = rng.choice(sorted(r for r, n in carried.items() if n == most))
    kill_replica_actor(replicas[replica])
    return replica, most


def pool_stats(model: str, timeout_s: float) -> dict[str, dict[str, dict | None]]:
    """Each of the model's pools' live replicas' stats: deployment -> replica id -> stats."""
    deadline = time.monotonic() + timeout_s
    deployments = [pool_deployment(role, model) for role in POOLS]
    return {deployment: live_replica_stats(deployment, deadline) for deployment in deployments}


def router_size() -> int:
    """The router's replicas that answer."""
    return len(each_answer(ROUTER_DEPLOYMENT, "requests_in_flight"))


def settled(pools: dict[str, dict[str, dict | None]], sizes: dict[str, int], routers: int) -> bool:
    """Whether each pool is back at its size (``sizes``: replicas per deployment), every
    replica answered with all its KV blocks free, and ``routers`` router replicas answer."""
    replicas = [stats for by_id in pools.values() for stats in by_id.values()]
    restored = all(len(pools.get(deployment, {})) >= n for deployment, n in sizes.items())
    free = all(s is not None and s["num_free_blocks"] == s["num_blocks"] for s in replicas)
    return restored and free and router_size() >= routers


def settled_pool_stats(
    model: str, sizes: dict[str, int], routers: int, timeout_s: float
) -> dict[str, dict[str, dict | None]]:
    """``pool_stats`` once Serve has replaced every killed replica (each pool back at its size
    in ``sizes``, the router at ``routers``) and every replica has all its KV blocks free (the
    abort of an abandoned or migrated request frees them a moment after its stream ends), or as
    last heard when ``timeout_s`` runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        pools = pool_stats(model, max(0.0, deadline - time.monotonic()))
        if settled(pools, sizes, routers) or time.monotonic() >= deadline:
            return pools
        time.sleep(POLL_S)


def migrations_by_replica(model: str) -> dict[str, int]:
    """Each answering router replica's count of the model's requests moved off a dead decode
    replica (``router/dispatch/migration.py``), by replica id."""
    answers = each_answer(ROUTER_DEPLOYMENT, "route_decisions")
    return {a["replica"]: a["models"].get(model, {}).get("migrated", 0) for a in answers}


def migrations(model: str) -> int:
    """The router replicas' migrations of the model, summed over those that answer."""
    return sum(migrations_by_replica(model).values())


class MigrationCount:
    """Migrations since it was made, over every router replica it heard: a killed replica's
    count goes with it, so ``look`` before a router kill keeps what it had counted."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._first = migrations_by_replica(model)
        self._last = dict(self._first)

    def look(self) -> None:
        self._last |= migrations_by_replica(self.model)

    def total(self) -> int:
        self.look()
        return sum(n - self._first.get(replica, 0) for replica, n in self._last.items())
