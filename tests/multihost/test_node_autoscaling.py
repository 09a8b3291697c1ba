"""Ray's autoscaler adds a test host when the planner, under load, asks for more replicas than
fit, and removes one once it idles: `ray up` of deploy/cluster-local.yaml onto the head and two
workers (a prefill host, a decode host), a third listed for the autoscaler to start when a second
decode replica asks for `decode_node` (``autoscaling_config``). The head runs the gateway and the
Prometheus its start commands start, and the planner beside them (deploy/serve-cluster.yaml). The
decode replicas run at most ``MAX_NUM_SEQS`` streams at once, so ``STREAMS`` streams through the
gateway keep the one replica at capacity: the planner asks for a second, which fits on no host
Ray runs, and once the streams end, for one again.

Minutes on two cores, so `make test-node-autoscaling` runs it and `make test` does not (marker
``node_autoscaling``); docs/benchmarks.md has a run's figures.
"""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
import yaml

from pdserve.cluster import cli
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
from pdserve.tests.multihost.test_ray_up import (
    GATEWAY_PORT,
    REQUEST_TIMEOUT_S,
    Launched,
    deployment_hosts,
)

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.node_autoscaling,
    pytest.mark.slow,
    pytest.mark.own_ray_cluster,
    pytest.mark.timeout(900),
]

MODEL = "tiny"
DECODE = pool_deployment("decode", MODEL)
HOST_RESOURCES = {2: {"prefill_node": 1}, 3: {"decode_node": 1}, 4: {"decode_node": 1}}
# What the autoscaler counts a host it may start as offering: a decode replica's room.
WORKER_TYPE = {"decode_node": 1}
STARTED_BY_RAY_UP = 2  # host2 and host3; host4 waits for the autoscaler
APP_TIMEOUT_S = 180.0
SCALE_TIMEOUT_S = 240.0
POLL_S = 2.0
MAX_NUM_SEQS = 2  # a decode replica's room
STREAMS = 6  # at once, through the gateway: the one decode replica at capacity
PROMPT = list(range(10, 42))
MAX_TOKENS = 128
PLANNER = {"interval_s": 5.0}


@pytest.fixture(scope="module")
def model_dir(hosts: list[Host]) -> Path:
    """The tiny model, where every host sees it (not under /tmp, which each host has its own of),
    and the planner's profile of it beside it."""
    folder = make_model(MODEL, hosts[0].dir.parent / "models" / "tiny-autoscaling")
    argv = ["profile", "--model", str(folder), "--out", str(folder / "profile.json")]
    argv += ["--threads", "1", "--prefill-tokens", "16", "64", "--decode-batches", "1", "2", "4"]
    assert cli.main([*argv, "--decode-contexts", "64", "192"]) == 0
    return folder


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


class Load:
    """``STREAMS`` threads, each sending one greedy stream after another to the head's gateway
    until stopped; any stream that fails is kept."""

    def __init__(self, head: str) -> None:
        self.base_url = f"http://{head}:{GATEWAY_PORT}/v1"  # across the bridge
        self.stopping = threading.Event()
        self.completed, self.errors = 0, []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send) for _ in range(STREAMS)]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        with openai.OpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
        ) as sdk:
            while not self.stopping.is_set():
                try:
                    response = sdk.completions.create(
                        model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                    assert response.usage.completion_tokens == MAX_TOKENS, response.usage
                    with self._lock:
                        self.completed += 1
                except Exception as error:  # every stream must complete: asserted by the test
                    with self._lock:
                        self.errors.append(repr(error))

    def stop(self) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S)


def test_a_host_is_added_under_load_and_removed_once_idle(
    cluster: Launched, hosts: list[Host], model_dir: Path
) -> None:
    head, prefill_host, decode_host, spare = (host.address for host in hosts)
    engine = {"num_kv_blocks": 256, "max_num_seqs": MAX_NUM_SEQS}
    model = {"name": MODEL, "path": str(model_dir), "engine": engine}
    pools = {
        "prefill": {"replicas": 1, "min_replicas": 1, "max_replicas": 1},
        "decode": {"replicas": 1, "min_replicas": 1, "max_replicas": 2},
    }
    planner = PLANNER | {"profile": str(model_dir / "profile.json")}
    serve_file = cluster.config.with_name("serve.yaml")
    serve_file.write_text(yaml.safe_dump(serve_config(model, pools, {}, planner)))
    app = cluster.view("app", APP_NAME, APP_TIMEOUT_S, first=f"serve deploy {serve_file}")
    assert app["status"] == "RUNNING", app.get("message")
    assert sorted(node["address"] for node in app["nodes"]) == [head, prefill_host, decode_host]

    start, load = time.monotonic(), Load(head)
    try:
        # The planner sees the decode replica at capacity and asks for a second, whose room is
        # on no node: the autoscaler starts the listed host left.
        _until(lambda: len(deployment_hosts(hosts, DECODE)) == 2, SCALE_TIMEOUT_S, "host4")
        added_s = time.monotonic() - start
    finally:
        load.stop()
    assert not load.errors, load.errors[:3]
    assert sorted(deployment_hosts(hosts, DECODE)) == ["host3", "host4"]
    assert _node_addresses(cluster) == sorted([head, prefill_host, decode_host, spare])
    grown = [line for line in cluster.view("planner") if "decode 1 -> 2" in line]
    assert grown and "at capacity" in grown[0], grown
    print(f"\n{load.completed} streams; the planner: {grown[0]}")
    print(f"a decode replica on a host the autoscaler added {added_s:.0f} s after the load began")

    start = time.monotonic()
    # No load: the planner shrinks the pool, Serve stops one of the two replicas, and its host
    # idles IDLE_MINUTES and goes.
    _until(lambda: len(_node_addresses(cluster)) == 3, SCALE_TIMEOUT_S, "an idle host's removal")
    removed_s = time.monotonic() - start
    left = _node_addresses(cluster)
    assert head in left and prefill_host in left and len(deployment_hosts(hosts, DECODE)) == 1
    shrunk = [line for line in cluster.view("planner") if "decode 2 -> 1" in line]
    assert shrunk, cluster.view("planner")[-4:]
    print(f"the planner: {shrunk[0]}")
    print(f"a decode host removed {removed_s:.0f} s after the load ended (idle {IDLE_MINUTES} min)")
