"""A driver's view of a running app's worker replicas: which are live, and each one's stats.

A replica's id is the one it reports in its stats (``serving/replica.py:EngineReplica.stats``).
Stats come from Serve's broadcast, one call to each replica: a call routed by load would never
reach a busy replica while an idle one answers.
"""

import time

from ray import serve
from ray.serve.exceptions import DeploymentUnavailableError

from pdserve.cluster.serve import APP_NAME
from pdserve.serving.ray_compat import broadcast, replica_actors

STATS_CALL_S = 10.0  # one stats call: a replica busy with a long step answers within it
POLL_S = 0.2


def live_replicas(deployment: str) -> dict[str, str]:
    """The deployment's live replica actors: replica id -> actor name. One still starting counts
    (its actor is up before its engine)."""
    return replica_actors(APP_NAME, deployment)


def each_answer(deployment: str, method: str, timeout_s: float = STATS_CALL_S) -> list[dict]:
    """``method``'s answer from each replica this process's handle knows of that answers within
    ``timeout_s``. One killed a moment ago, or still starting, is missing."""
    handle = serve.get_deployment_handle(deployment, app_name=APP_NAME)
    try:
        answers = broadcast(handle, method, timeout_s)
    except (DeploymentUnavailableError, TimeoutError):
        return []
    return [answer for answer in answers if isinstance(answer, dict)]


def answering_replica_stats(deployment: str, timeout_s: float = STATS_CALL_S) -> dict[str, dict]:
    """The stats of each replica that answers within ``timeout_s``, by replica id."""
    return {answer["replica"]: answer for answer in each_answer(deployment, "stats", timeout_s)}


def live_replica_stats(deployment: str, deadline: float) -> dict[str, dict | None]:
    """Every live replica's stats, by replica id; a replica that has not answered by
    ``deadline`` (``time.monotonic()``), e.g. a replacement still loading, has None. A
    deployment that does not exist (an aggregated model has no prefill pool) has no replicas."""
    heard: dict[str, dict] = {}
    while True:
        live = live_replicas(deployment)  # a dead one gone from the list, a replacement in it
        if not live:
            return {}
        timeout_s = min(STATS_CALL_S, max(0.0, deadline - time.monotonic()))
        heard |= answering_replica_stats(deployment, timeout_s)
        if live.keys() <= heard.keys() or time.monotonic() >= deadline:
            return {replica: heard.get(replica) for replica in live}
        time.sleep(POLL_S)
