"""Ray's autoscaler adds a test host when a pool asks for more replicas than fit, and removes one
once it idles: `ray up` of deploy/cluster-local.yaml onto the head and two workers (a prefill
host, a decode host), a third listed for the autoscaler to start when a second decode replica
asks for `decode_node` (``autoscaling_config``); Serve's target for the decode pool set as the
planner sets it (``set_target_replicas``, the external scaler's call), up to 2 and back to 1.

Minutes on two cores, so `make test-node-autoscaling` runs it and `make test` does not (marker
``node_autoscaling``); docs/benchmarks.md has a run's figures.
"""

import time
from collections.abc import Callable, Iterator

import pytest
import yaml

from pdserve.cluster.make_model import make_model
from pdserve.cluster.serve import APP_NAME
from pdserve.serving.config import pool_deployment
from pdserve.tests.multihost.hosts import Host
from pdserve.tests.multihost.ray_up import (
    IDLE_MINUTES,
    RAY,
    autoscaling_config,
    cluster_config,
    ray_cli,
    ray_up_state,
    serve_config,
)
from pdserve.tests.multihost.test_ray_up import Launched, deployment_hosts

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.node_autoscaling,
    pytest.mark.slow,
    pytest.mark.own_ray_cluster,
    pytest.mark.timeout(600),
]

MODEL = "tiny"
DECODE = pool_deployment("decode", MODEL)
HOST_RESOURCES = {2: {"prefill_node": 1}, 3: {"decode_node": 1}, 4: {"decode_node": 1}}
# What the autoscaler counts a host it may start as offering: a decode replica's room.
WORKER_TYPE = {"decode_node": 1}
STARTED_BY_RAY_UP = 2  # host2 and host3; host4 waits for the autoscaler
APP_TIMEOUT_S = 180.0
SCALE_TIMEOUT_S = 180.0
POLL_S = 2.0


@pytest.fixture(scope="module")
def cluster(hosts: list[Host]) -> Iterator[Launched]:
    state, token = ray_up_state(hosts, "ray-up-autoscaling", HOST_RESOURCES)
    config = state / "cluster.yaml"
    rendered = autoscaling_config(cluster_config(hosts, token), WORKER_TYPE, STARTED_BY_RAY_UP)
    config.write_text(yaml.safe_dump(rendered))
    launched = Launched(hosts, config, state / "ray.log", {})
    try:
        ray_cli(launched.log, "up", "-y", "--no-config-cache", str(config))
        yield launched
    finally:
        try:
            ray_cli(launched.log, "down", "-y", str(config))
        finally:
            for host in hosts:
                host.ssh(f"{RAY} stop --force", check=False)


def _node_addresses(cluster: Launched) -> list[str]:
    return sorted(node["address"] for node in cluster.view("app", APP_NAME, 0)["nodes"])


def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


def test_a_host_is_added_for_a_replica_that_does_not_fit_and_removed_once_idle(
    cluster: Launched, hosts: list[Host]
) -> None:
    head, prefill_host, decode_host, spare = (host.address for host in hosts)
    model_dir = make_model(MODEL, hosts[0].dir.parent / "models" / "tiny-autoscaling")
    model = {"name": MODEL, "path": str(model_dir), "engine": {"num_kv_blocks": 256}}
    pools = {
        "prefill": {"replicas": 1, "min_replicas": 1, "max_replicas": 1},
        "decode": {"replicas": 1, "min_replicas": 1, "max_replicas": 2},
    }
    serve_file = cluster.config.with_name("serve.yaml")
    serve_file.write_text(yaml.safe_dump(serve_config(model, pools, {})))
    app = cluster.view("app", APP_NAME, APP_TIMEOUT_S, first=f"serve deploy {serve_file}")
    assert app["status"] == "RUNNING", app.get("message")
    assert sorted(node["address"] for node in app["nodes"]) == [head, prefill_host, decode_host]

    start = time.monotonic()
    assert cluster.view("scale", DECODE, 2) == {"deployment": DECODE, "replicas": 2}
    # The second replica's room is on no node: the autoscaler starts the listed host left.
    _until(lambda: len(deployment_hosts(hosts, DECODE)) == 2, SCALE_TIMEOUT_S, "host4")
    added_s = time.monotonic() - start
    assert sorted(deployment_hosts(hosts, DECODE)) == ["host3", "host4"]
    assert _node_addresses(cluster) == sorted([head, prefill_host, decode_host, spare])
    print(f"\na decode replica on a host the autoscaler added {added_s:.0f} s after the ask")

    start = time.monotonic()
    assert cluster.view("scale", DECODE, 1) == {"deployment": DECODE, "replicas": 1}
    # Serve stops one of the two replicas; its host idles IDLE_MINUTES and goes.
    _until(lambda: len(_node_addresses(cluster)) == 3, SCALE_TIMEOUT_S, "an idle host's removal")
    removed_s = time.monotonic() - start
    left = _node_addresses(cluster)
    assert head in left and prefill_host in left and len(deployment_hosts(hosts, DECODE)) == 1
    print(
        f"a decode host removed {removed_s:.0f} s after the pool shrank (idle {IDLE_MINUTES} min)"
    )
