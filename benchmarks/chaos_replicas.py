"""The chaos benchmark's view of the cluster, from a driver joined to it: each pool's live replica
actors, killing one, every live replica's stats, and the router's migration count.

Serve names a replica's actor ``SERVE_REPLICA::<app>#<deployment>#<replica id>``; the id is the
one a replica reports in its stats (``serving/replica.py:replica_stats``).
"""

import random
import time

import ray
from ray import serve
from ray.exceptions import RayActorError

from pdserve.cluster.serve import APP_NAME
from pdserve.serving.config import pool_deployment

ROLES = ("prefill", "decode")
SERVE_NAMESPACE = "serve"  # where Serve's controller and replica actors live
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"
STATS_CALL_S = 10.0  # one stats call: a replica busy with a long step answers within it
# A handle call lands on a random replica: this many calls per replica hear from all of a few
# (each of 3 missed by 60 calls: p < 1e-10).
CALLS_PER_REPLICA = 20
POLL_S = 0.5


def live_replicas(deployment: str) -> dict[str, str]:
    """The deployment's live replica actors: replica id -> actor name. One still starting counts
    (its actor is up before its engine). From the GCS's named actors, so no dashboard is needed
    (Ray's state API needs one)."""
    prefix = f"{REPLICA_ACTOR_PREFIX}{APP_NAME}#{deployment}#"
    actors = ray.util.list_named_actors(all_namespaces=True)
    return {
        actor["name"].removeprefix(prefix): actor["name"]
        for actor in actors
        if actor["namespace"] == SERVE_NAMESPACE and actor["name"].startswith(prefix)
    }


def kill_replica(deployment: str, rng: random.Random) -> str | None:
    """Kills one of the deployment's live replicas, chosen at random; its id, or None if it has
    none. Serve starts a replacement by itself."""
    replicas = live_replicas(deployment)
    if not replicas:
        return None
    replica = rng.choice(sorted(replicas))
    ray.kill(ray.get_actor(replicas[replica], namespace=SERVE_NAMESPACE))
    return replica


def replica_stats(deployment: str, deadline: float) -> dict[str, dict | None]:
    """Every live replica's stats, by replica id; a replica that has not answered by
    ``deadline`` (``time.monotonic()``), e.g. a replacement still loading, has None."""
    heard: dict[str, dict] = {}
    live = live_replicas(deployment)
    if not live:  # no such pool (an aggregated model has no prefill deployment)
        return {}
    handle = serve.get_deployment_handle(deployment, app_name=APP_NAME)
    while True:
        for _ in range(CALLS_PER_REPLICA * len(live)):
            if live.keys() <= heard.keys():
                break
            try:
                stats = handle.stats.remote().result(timeout_s=STATS_CALL_S)
            except (RayActorError, TimeoutError):  # a replica killed or not running yet
                continue
            heard[stats["replica"]] = stats
        if live.keys() <= heard.keys() or time.monotonic() >= deadline:
            return {replica: heard.get(replica) for replica in live}
        time.sleep(POLL_S)
        live = live_replicas(deployment)  # a dead one gone from the list, a replacement in it


def pool_stats(model: str, timeout_s: float) -> dict[str, dict[str, dict | None]]:
    """Each of the model's pools' live replicas' stats: deployment -> replica id -> stats."""
    deadline = time.monotonic() + timeout_s
    deployments = [pool_deployment(role, model) for role in ROLES]
    return {deployment: replica_stats(deployment, deadline) for deployment in deployments}


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
    """The router's count of requests moved off a dead decode replica (``router/migration.py``)."""
    decisions = serve.get_app_handle(APP_NAME).route_decisions.remote().result()[model]
    return decisions.get("migrated", 0)
