"""For tests that run a pdserve app: random prompts and the offline engine's greedy answers to
them, the tokens a response carries, and each worker replica's stats."""

import time

import torch
from ray import serve

from pdserve.cluster.serve import APP_NAME
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams

VOCAB = 4096  # ids below every test model's vocabulary size


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


def token_ids(tokens: list[str]) -> list[int]:
    """The ids in logprob tokens of a request made with ``return_tokens_as_token_ids``."""
    return [int(token.removeprefix("token_id:")) for token in tokens]


def replica_stats(deployment: str, num_replicas: int) -> dict[str, dict]:
    """Each replica's stats by replica id; handle calls land on random replicas, so this calls
    until it has heard from all of them."""
    handle, seen = serve.get_deployment_handle(deployment, app_name=APP_NAME), {}
    for _ in range(50 * num_replicas):
        stats = handle.stats.remote().result()
        seen[stats["replica"]] = stats
        if len(seen) == num_replicas:
            return seen
    raise AssertionError(f"heard from {len(seen)} of {num_replicas} {deployment} replicas")


def wait_all_free(pools: dict[str, int], timeout: float = 60.0) -> dict[str, dict]:
    """Waits until every replica of the pools ({deployment: replicas}) has all KV blocks free."""
    deadline = time.monotonic() + timeout
    while True:
        stats = {}
        for deployment, num_replicas in pools.items():
            stats |= replica_stats(deployment, num_replicas)
        if all(s["num_free_blocks"] == s["num_blocks"] for s in stats.values()):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"KV blocks still held: {stats}")
        time.sleep(0.1)
