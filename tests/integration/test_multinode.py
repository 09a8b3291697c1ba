"""The disaggregated cluster across Ray nodes that the autoscaler adds for it: prefill and decode
replicas ask for ``prefill_node`` and ``decode_node``, which only the node types of the session's
fake autoscaling cluster offer (tests/ray_cluster.py), so Ray's autoscaler adds one node of each
and the pools run there, KV pulled over NIXL between them; once the app is gone, the idle nodes
are removed.

The head node carries no custom resource (Serve's controller and the router ask for none). Every
prompt is long enough to take the remote path, so each decode pulls the prompt's KV from the
other node. The nodes are separate raylets, but all on this host: NIXL (UCX) moves the blocks
between two processes on one machine, not over a network.
"""

import time

import openai
import pytest
from ray import serve
from ray.util.state import list_actors

from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster.serve import APP_NAME
from pdserve.engine.llm import LLM
from pdserve.kvtransfer.nixl_shim import nixl_available
from pdserve.tests.e2e.serve_replicas import (
    offline_greedy,
    random_prompts,
    wait_all_free,
    wait_replica_stats,
)
from pdserve.tests.ray_cluster import POOL_RESOURCES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not nixl_available(), reason="NIXL not importable"),
]

MODEL = "multinode-tiny"
NUM_KV_BLOCKS = 128
LOCAL_MAX = 64  # local_prefill_max_tokens: every prompt below goes remote
PROMPT_LENGTHS = [100, 257, 420]
MAX_TOKENS = 6
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 0}
GREEDY_EXTRA = {"ignore_eos": True, "return_tokens_as_token_ids": True}
REQUEST_TIMEOUT_S = 300.0  # generous: replicas start slowly on a busy two-core machine
IDLE_TIMEOUT_S = 120.0
POOLS = {f"prefill-{MODEL}": 1, f"decode-{MODEL}": 1}


@pytest.fixture(scope="module")
def served(ray_cluster, tiny_model_dir):
    model = {
        "name": MODEL,
        "path": str(tiny_model_dir),
        "engine": {"num_kv_blocks": NUM_KV_BLOCKS},
        "prefill": {"replicas": 1, "resources": {POOL_RESOURCES["prefill"]: 1}},
        "decode": {"replicas": 1, "resources": {POOL_RESOURCES["decode"]: 1}},
        "routing": {"local_prefill_max_tokens": LOCAL_MAX},
        "kv_transfer": {"backend": "nixl"},
    }
    with ray_cluster.serving(ray_cluster.config([model])) as config:
        yield config


@pytest.fixture(scope="module")
def client(served):
    base_url = f"http://127.0.0.1:{served.http_port}/v1"
    with openai.OpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(0, PROMPT_LENGTHS)


@pytest.fixture(scope="module")
def expected(tiny_model_dir, prompts) -> list[list[int]]:
    llm = LLM(str(tiny_model_dir), num_kv_blocks=NUM_KV_BLOCKS)
    return offline_greedy(llm, prompts, MAX_TOKENS)


def _replica_node(address: str, pool: str) -> str:
    (actor,) = list_actors(
        address=address,
        filters=[
            ("class_name", "=", f"ServeReplica:{APP_NAME}:{pool}-{MODEL}"),
            ("state", "=", "ALIVE"),
        ],
    )
    return actor.node_id


def test_the_autoscaler_adds_a_node_per_pool_and_the_pools_run_there(ray_cluster, served):
    placed = {pool: _replica_node(ray_cluster.address, pool) for pool in ("prefill", "decode")}
    added = {pool: ray_cluster.nodes_offering(r) for pool, r in POOL_RESOURCES.items()}
    assert added == {pool: [node] for pool, node in placed.items()}
    assert placed["prefill"] != placed["decode"]


def test_remote_greedy_equals_offline_and_kv_moves_over_nixl(client, prompts, expected):
    router = serve.get_app_handle(APP_NAME)
    before = router.route_decisions.remote().result()["models"].get(MODEL, {})
    for prompt, want in zip(prompts, expected, strict=True):
        response = client.completions.create(
            model=MODEL, prompt=prompt, extra_body=GREEDY_EXTRA, **GREEDY
        )
        assert token_ids(response.choices[0].logprobs.tokens) == want, f"prompt of {len(prompt)}"
    after = router.route_decisions.remote().result()["models"][MODEL]
    assert after["remote"] == before.get("remote", 0) + len(prompts)
    assert after.get("local", 0) == before.get("local", 0)
    (decode,) = wait_replica_stats(f"decode-{MODEL}", 1).values()
    assert decode["kv_num_transfers"] >= len(prompts)
    assert decode["kv_bytes_moved"] > 0
    assert decode["kv_transfer_failures"] == decode["kv_num_failures"] == 0
    assert decode["kv_num_leases_expired"] == 0


def test_every_block_ends_free_on_both_nodes(served):
    stats = wait_all_free(POOLS, timeout=IDLE_TIMEOUT_S)
    assert all(s["kv_pinned_blocks"] == 0 for s in stats.values())
    assert all(s["kv_num_leases_expired"] == 0 for s in stats.values())


def test_the_idle_nodes_go_once_the_app_is_deleted(ray_cluster, served):
    serve.delete(APP_NAME)  # before the fixture does: the nodes idle from now on
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while up := [n for r in POOL_RESOURCES.values() for n in ray_cluster.nodes_offering(r)]:
        assert time.monotonic() < deadline, f"nodes still up: {up}"
        time.sleep(1.0)
