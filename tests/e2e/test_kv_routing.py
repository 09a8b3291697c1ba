"""KV-aware routing against Serve's default (power of two choices, load only): a workload of
prompt families sharing long prefixes, sent one request at a time, through 2 prefill replicas.

The KV-aware router sends a family's later requests to the replica that cached its prefix, so each
of them finds its whole prefix cached; the default router places them at random and misses about
half of the time. Measured in the prefill replicas' own prefix-cache counters. The two policies
serve two models of one app, each with pools of its own.
"""

import openai
import pytest

from pdserve.tests.e2e.serve_replicas import random_prompts, wait_all_free, wait_replica_stats

pytestmark = pytest.mark.slow

# One app, two models, each with its own pools and policy: one deployment for both runs.
MODELS = {"kv_aware": "kv-tiny", "power_of_two": "p2-tiny"}
# The default router misses on a family's second request half of the time (then both replicas
# hold the prefix): with 8 families it misses none with probability 1/256.
NUM_FAMILIES = 8
REQUESTS_PER_FAMILY = 3
PREFIX_TOKENS = 256  # 16 full blocks
SUFFIX_TOKENS = 48


@pytest.fixture(scope="module")
def cluster(ray_cluster, tiny_model_dir):
    models = [
        {
            "name": name,
            "path": str(tiny_model_dir),
            "engine": {"num_kv_blocks": 1024},
            "prefill": {"replicas": 2},
            "decode": {"replicas": 1},
            "routing": {"policy": policy, "local_prefill_max_tokens": 16},
        }
        for policy, name in MODELS.items()
    ]
    with ray_cluster.serving(ray_cluster.config(models)) as config:
        yield config


def _prefill_hits(model: str) -> int:
    return sum(s["prefix_cache_hits"] for s in wait_replica_stats(f"prefill-{model}", 2).values())


def _run_families(http_port: int, model: str, seed: int) -> int:
    """Sends the workload; returns the prompt tokens the prefill replicas found cached."""
    prefixes = random_prompts(seed, [PREFIX_TOKENS] * NUM_FAMILIES)
    suffixes = iter(random_prompts(seed + 1, [SUFFIX_TOKENS] * NUM_FAMILIES * REQUESTS_PER_FAMILY))
    before = _prefill_hits(model)
    base_url = f"http://127.0.0.1:{http_port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        for prefix in prefixes:
            for _ in range(REQUESTS_PER_FAMILY):
                prompt = prefix + next(suffixes)
                client.completions.create(model=model, prompt=prompt, max_tokens=2)
    wait_all_free({f"prefill-{model}": 2, f"decode-{model}": 1})
    return _prefill_hits(model) - before


def test_kv_aware_routing_beats_power_of_two_on_cached_tokens(cluster):
    kv_aware = _run_families(cluster.http_port, MODELS["kv_aware"], seed=1)
    power_of_two = _run_families(cluster.http_port, MODELS["power_of_two"], seed=3)
    every_later_request = NUM_FAMILIES * (REQUESTS_PER_FAMILY - 1) * PREFIX_TOKENS
    assert kv_aware == every_later_request, (kv_aware, power_of_two)
    assert power_of_two < kv_aware, (kv_aware, power_of_two)
