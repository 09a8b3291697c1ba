"""For tests that run a pdserve app: the session's shared disaggregated app, random prompts and
the offline engine's greedy answers to them, the tokens a response carries, and each worker
replica's stats."""

import time
from pathlib import Path
from typing import Any

import torch

from pdserve.cluster import replicas
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams

VOCAB = 4096  # ids below every test model's vocabulary size

# The ``shared_app`` fixture's one model (tests/conftest.py): router + 1 prefill + 2 decode replicas
# of the tiny model; prompts of ``SHARED_LOCAL_MAX`` tokens or more that the chosen decode replica
# has not cached prefill remotely; a stream whose decode replica dies moves once.
SHARED_MODEL = "tiny-pd"
SHARED_POOLS = {f"prefill-{SHARED_MODEL}": 1, f"decode-{SHARED_MODEL}": 2}
SHARED_NUM_KV_BLOCKS = 512
SHARED_LOCAL_MAX = 64
SHARED_MIGRATION_LIMIT = 1


def shared_model(model_dir: Path) -> dict[str, Any]:
    return {
        "name": SHARED_MODEL,
        "path": str(model_dir),
        "engine": {"num_kv_blocks": SHARED_NUM_KV_BLOCKS},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 2},
        "routing": {"local_prefill_max_tokens": SHARED_LOCAL_MAX},
        "migration_limit": SHARED_MIGRATION_LIMIT,
    }


def random_prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    """Prompts of ``lengths`` tokens. A fresh seed for each use that must reach a replica
    uncached: a prompt a decode replica has seen is cached there, so it prefills locally."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def offline_greedy(offline: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The offline engine's greedy tokens, exactly ``max_tokens`` each (the unit tests hold them
    equal to transformers')."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [out.token_ids for out in offline.generate(prompts, params)]


def wait_replica_stats(
    deployment: str, num_replicas: int, timeout: float = 60.0
) -> dict[str, dict]:
    """Each replica's stats by replica id, once all ``num_replicas`` of them answer."""
    deadline = time.monotonic() + timeout
    while len(stats := replicas.answering_replica_stats(deployment)) != num_replicas:
        assert time.monotonic() < deadline, f"{len(stats)} of {num_replicas} {deployment}"
        time.sleep(replicas.POLL_S)
    return stats


def wait_all_free(pools: dict[str, int], timeout: float = 60.0) -> dict[str, dict]:
    """Waits until every replica of the pools ({deployment: replicas}) has all KV blocks free."""
    deadline = time.monotonic() + timeout
    while True:
        stats = {}
        for deployment, num_replicas in pools.items():
            stats |= wait_replica_stats(deployment, num_replicas)
        if all(s["num_free_blocks"] == s["num_blocks"] for s in stats.values()):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"KV blocks still held: {stats}")
        time.sleep(0.1)
