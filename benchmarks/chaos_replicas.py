"""The chaos benchmark's view of the cluster, from a driver joined to it: killing a pool's
replica, every live replica's stats once the pools are whole again, and the router's migration
count. What a replica is and how its stats are read: ``cluster/replicas.py``.
"""

import random
import time

from ray import serve

from pdserve.cluster.replicas import answering_replica_stats, live_replica_stats, live_replicas
from pdserve.cluster.serve import APP_NAME
from pdserve.serving.config import pool_deployment
from pdserve.serving.ray_compat import kill_replica_actor

ROLES = ("prefill", "decode")
POLL_S = 0.5


def kill_replica(deployment: str, rng: random.Random) -> tuple[str | None, int]:
    """Kills one of the deployment's live replicas that carries the most requests (running or
    waiting, as it answered just before; a replica that did not answer counts as carrying
    none), chosen at random among equals: a kill of an idle replica would test nothing. Returns
    its id and those requests, or (None, 0) if the deployment has no live replica. Serve starts
    a replacement by itself."""
    replicas = live_replicas(deployment)
    if not replicas:
        return None, 0
    stats = answering_replica_stats(deployment)
    carried = {
        replica: stats[replica]["num_running"] + stats[replica]["num_waiting"]
        if replica in stats
        else 0
        for replica in replicas
    }
    most = max(carried.values())
    replica = rng.choice(sorted(r for r, n in carried.items() if n == most))
    kill_replica_actor(replicas[replica])
    return replica, most


def pool_stats(model: str, timeout_s: float) -> dict[str, dict[str, dict | None]]:
    """Each of the model's pools' live replicas' stats: deployment -> replica id -> stats."""
    deadline = time.monotonic() + timeout_s
    deployments = [pool_deployment(role, model) for role in ROLES]
    return {deployment: live_replica_stats(deployment, deadline) for deployment in deployments}


def settled(pools: dict[str, dict[str, dict | None]], sizes: dict[str, int]) -> bool:
    """Whether each pool is back at its size (``sizes``: replicas per deployment) and every
    replica answered with all its KV blocks free."""
    replicas = [stats for by_id in pools.values() for stats in by_id.values()]
    restored = all(len(pools.get(deployment, {})) >= n for deployment, n in sizes.items())
    free = all(s is not None and s["num_free_blocks"] == s["num_blocks"] for s in replicas)
    return restored and free


def settled_pool_stats(
    model: str, sizes: dict[str, int], timeout_s: float
) -> dict[str, dict[str, dict | None]]:
    """``pool_stats`` once Serve has replaced every killed replica (each pool back at its size
    in ``sizes``) and every replica has all its KV blocks free (the abort of an abandoned or
    migrated request frees them a moment after its stream ends), or as last heard when
    ``timeout_s`` runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        pools = pool_stats(model, max(0.0, deadline - time.monotonic()))
        if settled(pools, sizes) or time.monotonic() >= deadline:
            return pools
        time.sleep(POLL_S)


def migrations(model: str) -> int:
    """The router's count of requests moved off a dead decode replica
    (``router/dispatch/migration.py``)."""
    decisions = serve.get_app_handle(APP_NAME).route_decisions.remote().result()[model]
    return decisions.get("migrated", 0)
