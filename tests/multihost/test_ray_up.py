"""`ray up deploy/cluster-local.yaml` onto the four test hosts, over SSH: the head on host1, the
head's autoscaler starting workers on host2 (prefill only), host3 and host4 (decode only); the
Prometheus `ray up` started on the head (`pdserve prometheus`) scrapes every host; Serve
deploys deploy/serve-cluster.yaml from the head; greedy tokens through the openai SDK, from this
machine to the gateway `ray up` started on the head (`pdserve gateway`, :8000), equal the offline
engine's, every prompt prefilled on host2 and
its KV pulled by a decode host over NIXL, whose UCX reports the transport; the router dates the
decode replicas' reports right though every host's monotonic clock differs and host3's wall clock
runs an hour behind; host4 lost mid-stream (its link cut, every process killed) loses no stream,
and once it is back the autoscaler and Serve put its replica there again; `ray down` leaves no
process.

The tests run in order on one cluster: the last one takes it down.
"""

import itertools
import json
import shlex
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster.gateway import READY_PATH
from pdserve.cluster.make_model import make_model
from pdserve.cluster.serve import APP_NAME
from pdserve.engine.llm import LLM
from pdserve.router.dispatch.placement import STALE_S
from pdserve.serving.config import DEFAULT_HTTP_PORT
from pdserve.tests.e2e.serve_replicas import offline_greedy, random_prompts
from pdserve.tests.e2e.streams import WAIT_S, http_stream, wait
from pdserve.tests.multihost.head_driver import up_hosts
from pdserve.tests.multihost.hosts import CHECKOUT, SKEWED_HOST, Host
from pdserve.tests.multihost.ray_up import (
    RAY,
    cluster_config,
    ray_cli,
    ray_up_state,
    serve_config,
)

# As test_hosts.py: in `make test`'s first stream, beside the session's cluster.
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.own_ray_cluster,
    pytest.mark.skipif(shutil.which("rsync") is None, reason="no rsync: apt-get install rsync"),
]

HEAD_DRIVER = CHECKOUT / "tests" / "multihost" / "head_driver.py"
MODEL = "tiny"
NUM_KV_BLOCKS = 512
LOCAL_MAX = 64  # local_prefill_max_tokens: every prompt below prefills remotely
PROMPT_LENGTHS = [100, 257, 420]
MAX_TOKENS = 6
# The streams a decode host's loss cuts: long enough to be mid-stream when it goes.
LOSS_PROMPT_LENGTHS = [70, 90, 110, 130, 150, 170]
LOSS_MAX_TOKENS = 500
KILL_AFTER = 8  # tokens every stream has when the host goes
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 0}
GREEDY_EXTRA = {"ignore_eos": True, "return_tokens_as_token_ids": True}
POOL_RESOURCES = {"prefill": "prefill_node", "decode": "decode_node"}
POOL_HOSTS = {"prefill": (2,), "decode": (3, 4)}  # the hosts whose nodes alone offer its room
# UCX prints each protocol it selects as a table: a title naming the agent and whether the peer is
# on its node, the operation, then one row per message size ending in the transport/device. The
# READs NIXL posts for the decode replica's pulls are `ucp_get`s.
UCX_ENV = {"UCX_PROTO_INFO": "y"}
UCX_READ = "remote memory read by ucp_get"
UCX_TABLE_LINES = 20  # a READ table's rows follow its operation's line within these
RAY_LOGS = "/tmp/ray/session_latest/logs"  # the host's own /tmp
APP_TIMEOUT_S = 180.0
GATEWAY_PORT = DEFAULT_HTTP_PORT  # `pdserve gateway`'s, as deploy/cluster-local.yaml starts it
REQUEST_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 120.0
REPLACE_TIMEOUT_S = 150.0  # the autoscaler's heartbeat timeout (30 s), `ray start`, a replica
POLL_S = 1.0


@dataclass
class Launched:
    """A cluster `ray up` made from ``config`` (its commands' output in ``log``)."""

    hosts: list[Host]
    config: Path
    log: Path
    baseline: dict[int, set[int]]  # each host's processes before `ray up`: its init and sshd
    down: bool = False
    serve: dict[str, Any] = field(default_factory=dict)  # the Serve config deployed
    app: dict[str, Any] = field(default_factory=dict)  # head_driver.py's `app` view once it ran

    def exec(self, command: str) -> str:
        """``command``'s output on the head (`ray exec`, in a login shell as an operator's)."""
        return ray_cli(self.log, "exec", "--no-config-cache", str(self.config), command)

    def view(self, *args: object, first: str = "true") -> Any:
        """What head_driver.py prints for ``args``, run after the command ``first``."""
        argv = shlex.join(["python", str(HEAD_DRIVER), *map(str, args)])
        # /tmp: a driver's folder is on its workers' path (cluster/ray_driver.py)
        out = self.exec(f"{first} && cd /tmp && {argv}")
        return json.loads([line for line in out.splitlines() if line.startswith(("[", "{"))][-1])

    def leftovers(self, host: Host) -> dict[int, str]:
        """The host's processes other than its init and its sshd (and SSH sessions)."""
        before = self.baseline[host.index]
        return {p: n for p, n in host.processes().items() if p not in before and n != "sshd"}


@pytest.fixture(scope="module")
def launched(hosts: list[Host]) -> Iterator[Launched]:
    own = {i: {POOL_RESOURCES[pool]: 1} for pool, indices in POOL_HOSTS.items() for i in indices}
    state, token = ray_up_state(hosts, "ray-up", own)
    config = state / "cluster.yaml"
    config.write_text(yaml.safe_dump(cluster_config(hosts, token)))
    baseline = {host.index: set(host.processes()) for host in hosts}
    cluster = Launched(hosts, config, state / "ray.log", baseline)
    try:
        ray_cli(cluster.log, "up", "-y", "--no-config-cache", str(config))
        yield cluster
    finally:
        if not cluster.down:  # a test failed before `ray down`'s
            try:
                ray_cli(cluster.log, "down", "-y", str(config))
            finally:  # the next test on these hosts needs them bare
                for host in hosts:
                    host.ssh(f"{RAY} stop --force", check=False)


@pytest.fixture(scope="module")
def model_dir(hosts: list[Host]) -> Path:
    return make_model("tiny", hosts[0].dir.parent / "models" / MODEL)  # a folder all hosts see


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(0, PROMPT_LENGTHS)


@pytest.fixture(scope="module")
def expected(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    return offline_greedy(LLM(str(model_dir), num_kv_blocks=NUM_KV_BLOCKS), prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def deployed(launched: Launched, model_dir: Path) -> Launched:
    model = {
        "name": MODEL,
        "path": str(model_dir),
        "engine": {"num_kv_blocks": NUM_KV_BLOCKS},
        "routing": {"local_prefill_max_tokens": LOCAL_MAX},
        "kv_transfer": {"backend": "nixl"},
    }
    pools = {
        pool: dict.fromkeys(("replicas", "min_replicas", "max_replicas"), len(indices))
        for pool, indices in POOL_HOSTS.items()
    }
    launched.serve = serve_config(model, pools, UCX_ENV)
    serve_file = launched.config.with_name("serve.yaml")
    serve_file.write_text(yaml.safe_dump(launched.serve))
    # At once: the app runs once the workers have joined, since only they offer its pools' room.
    launched.app = launched.view("app", APP_NAME, APP_TIMEOUT_S, first=f"serve deploy {serve_file}")
    nodes = [node["address"] for node in launched.app["nodes"]]
    assert launched.app["status"] == "RUNNING", (launched.app.get("message"), nodes)
    ready = f"http://{launched.hosts[0].address}:{GATEWAY_PORT}{READY_PATH}"
    deadline = time.monotonic() + APP_TIMEOUT_S
    while not _answers(ready):  # the gateway finds the router within its poll
        assert time.monotonic() < deadline, launched.exec("cat /tmp/pdserve-gateway.log")
        time.sleep(POLL_S)
    return launched


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=POLL_S) as response:
            return response.status == 200
    except OSError:
        return False


def replica_hosts(hosts: list[Host], pool: str) -> list[str]:
    """The hosts where a replica of ``pool`` runs."""
    return deployment_hosts(hosts, f"{pool}-{MODEL}")


def deployment_hosts(hosts: list[Host], deployment: str) -> list[str]:
    """The hosts where a replica of ``deployment`` runs (Ray names its process after the actor)."""
    actor = f"ServeReplica:{APP_NAME}:{deployment}"
    return [host.name for host in hosts if actor in host.ssh("ps -eo args").stdout]


def ucx_read_tables(host: Host) -> list[tuple[str, list[str]]]:
    """Each READ protocol table UCX printed on ``host``: its title and each row's transport."""
    grep = f"grep -h -B1 -A{UCX_TABLE_LINES} '{UCX_READ}' {RAY_LOGS}/worker-*"
    lines = [line.partition("|")[2] for line in host.ssh(grep, check=False).stdout.splitlines()]
    tables = []
    for at, line in enumerate(lines):
        if UCX_READ in line:
            # then: a border, the column names, a border, the rows, a border
            rows = itertools.takewhile(lambda row: row.strip(), lines[at + 4 :])
            transports = [row.split("|")[-2].strip() for row in rows]
            tables.append((lines[at - 1].split("|")[0].strip(), transports))
    return tables


@pytest.mark.timeout(420)  # its setup brings the cluster up and deploys the app
def test_ray_up_starts_the_head_and_its_autoscaler_the_workers(deployed: Launched) -> None:
    offered = {
        node["address"]: {r for r in POOL_RESOURCES.values() if r in node["resources"]}
        for node in deployed.app["nodes"]
    }
    pools = {i: {POOL_RESOURCES[pool]} for pool, indices in POOL_HOSTS.items() for i in indices}
    assert offered == {host.address: pools.get(host.index, set()) for host in deployed.hosts}


@pytest.mark.timeout(APP_TIMEOUT_S + 60)  # the view's own wait, and `ray exec`'s
def test_the_heads_prometheus_scrapes_every_host(deployed: Launched) -> None:
    """`pdserve prometheus`, which the head's start commands start, finds every node's metrics
    agent through the service-discovery file the head's dashboard writes."""
    hosts = {host.address for host in deployed.hosts}
    up = deployed.view("scraped", len(hosts), APP_TIMEOUT_S)
    assert up_hosts(up) == hosts, up


@pytest.mark.timeout(120)
def test_each_pool_runs_on_its_hosts_and_the_router_on_the_head(deployed: Launched) -> None:
    hosts = deployed.hosts
    placed = {pool: replica_hosts(hosts, pool) for pool in POOL_RESOURCES}
    assert placed == {pool: [hosts[i - 1].name for i in ids] for pool, ids in POOL_HOSTS.items()}
    # Only the head offers router_node (cluster-local.yaml): a lost worker takes no router.
    assert deployment_hosts(hosts, "router") == [hosts[0].name]


@pytest.mark.timeout(180)
def test_greedy_tokens_through_the_openai_sdk_equal_the_offline_engines(
    deployed: Launched, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    base_url = f"http://{deployed.hosts[0].address}:{GATEWAY_PORT}/v1"  # across the bridge
    with openai.OpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as sdk:
        for prompt, want in zip(prompts, expected, strict=True):
            response = sdk.completions.create(
                model=MODEL, prompt=prompt, extra_body=GREEDY_EXTRA, **GREEDY
            )
            assert token_ids(response.choices[0].logprobs.tokens) == want, len(prompt)


@pytest.mark.timeout(120)
def test_kv_crossed_hosts_over_nixl_on_ucx_tcp(deployed: Launched) -> None:
    kv = deployed.view("kv", MODEL)
    assert kv["routes"].get("remote") == len(PROMPT_LENGTHS) and not kv["routes"].get("local")
    decode = kv["decode"]
    assert len(decode) == len(POOL_HOSTS["decode"]), decode
    assert sum(d["kv_num_transfers"] for d in decode) >= len(PROMPT_LENGTHS)
    assert sum(d["kv_bytes_moved"] for d in decode) > 0
    assert all(d["kv_transfer_failures"] == d["kv_num_failures"] == 0 for d in decode), decode
    moved, seconds = (
        sum(d[key] for d in decode) for key in ("kv_bytes_moved", "kv_transfer_seconds")
    )
    transfers = sum(d["kv_num_transfers"] for d in decode)
    # The pulls across hosts as the decode hosts timed them (docs/benchmarks.md, "Many hosts").
    print(
        f"\nKV across hosts: {transfers} pulls, {moved / transfers / 1024:.0f} KiB each, "
        f"{seconds / transfers * 1e3:.1f} ms each, {moved / seconds / 1e6:.1f} MB/s"
    )
    tables = [t for i in POOL_HOSTS["decode"] for t in ucx_read_tables(deployed.hosts[i - 1])]
    assert tables, "no READ protocol in UCX's report"
    for title, transports in tables:  # the peer on another node, reached over TCP on eth0
        assert " inter-node " in f" {title} " and transports == ["tcp/eth0"], tables


@pytest.mark.timeout(120)
def test_routing_trusts_the_reports_of_hosts_whose_clocks_disagree(deployed: Launched) -> None:
    # Each decode replica's latest report, dated by the router (host3's wall clock is an hour
    # behind, and no two hosts' monotonic clocks agree). A router that read a report's stamp (the
    # replica's monotonic clock) as a time on its own clock would date it days away, before or
    # after every call it sent there: its calls never (or at once) spoken for by a report, the
    # blocks it sent there kept past the replica's word (or dropped).
    # One decode replica on each decode host, the skewed one among them (the test before this).
    assert SKEWED_HOST in POOL_HOSTS["decode"]
    views = deployed.view("kv", MODEL)["placements"]
    assert len(views) == len(POOL_HOSTS["decode"]), views
    for view in views.values():
        assert 0 <= view["report_age_s"] < STALE_S and view["calls_in_flight"] == 0, views
        assert view["cached_blocks"] is not None, views  # its KV event log trusted, in step


@pytest.mark.timeout(300)
def test_a_decode_host_lost_mid_stream_loses_no_stream(deployed: Launched, model_dir: Path) -> None:
    prompts = random_prompts(1, LOSS_PROMPT_LENGTHS)
    offline = LLM(str(model_dir), num_kv_blocks=NUM_KV_BLOCKS)
    expected = offline_greedy(offline, prompts, LOSS_MAX_TOKENS)
    head = deployed.hosts[0].address
    streams = [http_stream(GATEWAY_PORT, MODEL, p, LOSS_MAX_TOKENS, head) for p in prompts]
    for stream in streams:
        stream.start()
    wait(lambda: all(len(s.tokens) >= KILL_AFTER for s in streams), "the first tokens")
    assert all(len(s.tokens) < LOSS_MAX_TOKENS for s in streams), "a stream ended before the kill"
    lost = deployed.hosts[POOL_HOSTS["decode"][-1] - 1]
    lost.kill()
    try:
        for stream in streams:
            stream.join(WAIT_S)
    finally:  # the machine back, bare, as after a reboot
        lost.start()
        deployed.baseline[lost.index] = set(lost.processes())
    assert [s.error for s in streams] == [None] * len(streams)
    assert [s.tokens for s in streams] == expected
    # Its streams went on at host3's replica: the router moved them.
    routes = deployed.view("kv", MODEL)["routes"]
    assert routes.get("migrated", 0) >= 1, routes
    # The autoscaler starts Ray on the rebooted host again, and Serve its replica there.
    hosts = deployed.hosts
    want = [host.name for host in hosts if host.index in POOL_HOSTS["decode"]]
    deadline = time.monotonic() + REPLACE_TIMEOUT_S
    while (placed := replica_hosts(hosts, "decode")) != want:
        assert time.monotonic() < deadline, placed
        time.sleep(POLL_S)


@pytest.mark.timeout(240)
def test_ray_down_leaves_no_process_on_any_host(launched: Launched) -> None:
    launched.down = True
    ray_cli(launched.log, "down", "-y", str(launched.config))
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while left := {h.name: rest for h in launched.hosts if (rest := launched.leftovers(h))}:
        assert time.monotonic() < deadline, left
        time.sleep(POLL_S)
