"""What the multihost tests read from inside a cluster that `ray up` made: run on its
head by `ray exec` (`python head_driver.py VIEW ARG...`), it prints one JSON line.

- ``app NAME TIMEOUT_S``: once Serve's application NAME runs (or has failed), its status and
  each live node's address and resources.
- ``kv MODEL``: the router's route decisions for MODEL, each decode replica's stats, and each
  decode replica as the router's placement sees it.
- ``planner``: the planner's decisions, a log line each, oldest first.
- ``scraped HOSTS TIMEOUT_S``: once the Prometheus on the head's loopback (``pdserve
  prometheus``) scrapes targets of Ray's (metrics agents, the head's dashboard and autoscaler) on
  HOSTS hosts (or after TIMEOUT_S), each target's ``up``.
"""

import json
import sys
import time
from typing import Any

import ray

POLL_S = 1.0


def app(name: str, timeout_s: float) -> dict[str, Any]:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(name)
        settled = status is not None and status.status in ("RUNNING", "DEPLOY_FAILED")
        if settled or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    nodes = [
        {"address": node["NodeManagerAddress"], "resources": node["Resources"]}
        for node in ray.nodes()
        if node["Alive"]
    ]
    if status is None:
        return {"status": "MISSING", "nodes": nodes}
    return {"status": status.status, "message": status.message, "nodes": nodes}


def kv(model: str) -> dict[str, Any]:
    from ray import serve

    from pdserve.cluster.replicas import answering_replica_stats
    from pdserve.cluster.serve import APP_NAME

    router = serve.get_app_handle(APP_NAME)
    routes = router.route_decisions.remote().result()["models"].get(model, {})
    placements = router.placements.remote().result().get(model, {}).get("decode", {})
    decode = list(answering_replica_stats(f"decode-{model}").values())
    return {"routes": routes, "decode": decode, "placements": placements}


def planner() -> list[str]:
    from ray import serve

    from pdserve.cluster.serve import APP_NAME

    return serve.get_app_handle(APP_NAME).planner_history.remote().result()


def scraped(hosts: int, timeout_s: float) -> dict[str, float]:
    from pdserve.cluster.prometheus import PrometheusAPI, local_url
    from pdserve.serving.config import DEFAULT_PROMETHEUS_PORT

    api, up = PrometheusAPI(local_url(DEFAULT_PROMETHEUS_PORT)), {}
    deadline = time.monotonic() + timeout_s
    while len(up_hosts(up)) < hosts and time.monotonic() < deadline:
        time.sleep(POLL_S)
        try:
            up = api.by_label('up{job="ray"}', "instance")
        except OSError:  # not up yet
            continue
    return up


def up_hosts(up: dict[str, float]) -> set[str]:
    """The hosts of the targets (``host:port``) whose ``up`` is 1."""
    return {target.rsplit(":", 1)[0] for target, value in up.items() if value == 1}


VIEWS = {
    "app": lambda name, timeout_s: app(name, float(timeout_s)),
    "kv": kv,
    "planner": planner,
    "scraped": lambda hosts, timeout_s: scraped(int(hosts), float(timeout_s)),
}

if __name__ == "__main__":
    view, *args = sys.argv[1:]
    ray.init(address="auto", logging_level="ERROR")
    print(json.dumps(VIEWS[view](*args)), flush=True)
