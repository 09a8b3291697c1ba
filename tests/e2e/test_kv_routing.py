"""KV-aware routing against Serve's default (power of two choices, load only): a workload of
prompt families sharing long prefixes, sent one request at a time, through 2 prefill replicas.

The KV-aware router sends a family's later requests to the replica that cached its prefix, so each
of them finds its whole prefix cached; the default router places them at random and misses about
half of the time. Measured in the prefill replicas' own prefix-cache counters.
"""

import openai
import pytest
import torch

from pdserve.cluster.serve import deploy
from pdserve.serving.config import ClusterConfig
from pdserve.tests.e2e.serve_replicas import replica_stats, wait_all_free
from pdserve.tests.ray_cluster import SessionCluster

pytestmark = pytest.mark.slow

MODEL = "tiny"
# The default router misses on a family's second request half of the time (then both replicas
# hold the prefix): with 8 families it misses none with probability 1/256.
NUM_FAMILIES = 8
REQUESTS_PER_FAMILY = 3
PREFIX_TOKENS = 256  # 16 full blocks
SUFFIX_TOKENS = 48
POOLS = {f"prefill-{MODEL}": 2, f"decode-{MODEL}": 1}


def _config(cluster: SessionCluster, model_dir, policy: str) -> ClusterConfig:
    model = {
        "name": MODEL,
        "path": str(model_dir),
        "engine": {"num_kv_blocks": 1024},
        "prefill": {"replicas": 2},
        "decode": {"replicas": 1},
        "routing": {"policy": policy, "local_prefill_max_tokens": 16},
    }
    return cluster.config([model])


def _prefill_hits() -> int:
    return sum(s["prefix_cache_hits"] for s in replica_stats(f"prefill-{MODEL}", 2).values())


def _run_families(http_port: int, seed: int) -> int:
    """Sends the workload; returns the prompt tokens the prefill replicas found cached."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, 4096, (n,), generator=generator).tolist()

    before = _prefill_hits()
    base_url = f"http://127.0.0.1:{http_port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        for _ in range(NUM_FAMILIES):
            prefix = tokens(PREFIX_TOKENS)
            for _ in range(REQUESTS_PER_FAMILY):
                client.completions.create(
                    model=MODEL, prompt=prefix + tokens(SUFFIX_TOKENS), max_tokens=2
                )
    wait_all_free(POOLS)
    return _prefill_hits() - before


def test_kv_aware_routing_beats_power_of_two_on_cached_tokens(ray_cluster, tiny_model_dir):
    http_port = ray_cluster.http_port
    with ray_cluster.serving(_config(ray_cluster, tiny_model_dir, "kv_aware")):
        kv_aware = _run_families(http_port, seed=1)
        deploy(_config(ray_cluster, tiny_model_dir, "power_of_two"))
        power_of_two = _run_families(http_port, seed=2)  # new prefixes: no help from phase 1
    every_later_request = NUM_FAMILIES * (REQUESTS_PER_FAMILY - 1) * PREFIX_TOKENS
    assert kv_aware == every_later_request, (kv_aware, power_of_two)
    assert power_of_two < kv_aware, (kv_aware, power_of_two)
