"""10,000 random arrivals, aborts and finishes through the scheduler alone, checking its invariants
after every step: the budget holds, no block is owned twice (except a shared cached prefix block,
counted once per holder), reference counts never go negative, and every request ends."""

import random
from collections import Counter

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.scheduler import ScheduledRequest, Scheduler

NUM_OPERATIONS = 10_000
BLOCK_SIZE = 16
NUM_BLOCKS = 96
MAX_MODEL_LEN = 512
# A few shared prompt stems make prefix-cache hits and shared blocks common.
STEMS = [[random.Random(s).randrange(1000) for _ in range(160)] for s in range(4)]


def _check(scheduler: Scheduler, batch: list[ScheduledRequest]) -> None:
    config = scheduler.config
    assert sum(e.num_new_tokens for e in batch) <= config.max_num_batched_tokens
    assert len(scheduler.running) <= config.max_num_seqs
    assert all(e.num_new_tokens > 0 for e in batch)
    holders = Counter(b for r in scheduler.running for b in r.block_ids)
    pool = scheduler.block_pool
    for block in pool.blocks:
        assert block.ref_count >= 0
        assert block.ref_count == holders[block.block_id], f"block {block.block_id}"
        if holders[block.block_id] > 1:
            assert block.hash is not None, "only cached prefix blocks may be shared"
    assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_count == 0)
    for request in scheduler.running:
        assert len(set(request.block_ids)) == len(request.block_ids)
    for _, request in scheduler.waiting:
        assert request.block_ids == [] and request.status == RequestStatus.WAITING
    for entry in batch:
        needed = -(-(entry.request.num_computed_tokens + entry.num_new_tokens) // BLOCK_SIZE)
        assert len(entry.request.block_ids) >= needed


def test_random_workload_keeps_the_invariants() -> None:
    rng = random.Random(0)
    config = EngineConfig(
        model="unused",
        block_size=BLOCK_SIZE,
        num_kv_blocks=NUM_BLOCKS,
        max_num_batched_tokens=128,
        max_num_seqs=24,
        long_prefill_token_threshold=48,
    )
    scheduler = Scheduler(config, BlockPool(NUM_BLOCKS), MAX_MODEL_LEN)
    live: dict[str, Request] = {}
    ended: dict[str, RequestStatus] = {}
    operations = 0
    next_id = 0
    while operations < NUM_OPERATIONS or live:
        if operations < NUM_OPERATIONS and rng.random() < 0.5:
            stem = rng.choice(STEMS)[: rng.randrange(0, 160)]
            prompt = stem + [rng.randrange(1000) for _ in range(rng.randrange(1, 100))]
            params = SamplingParams(max_tokens=rng.randrange(1, 120))
            request = Request(str(next_id), prompt, params)
            next_id += 1
            live[request.request_id] = request
            scheduler.add(request)
            operations += 1
        if operations < NUM_OPERATIONS and live and rng.random() < 0.1:
            request = live.pop(rng.choice(list(live)))
            scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            ended[request.request_id] = request.status
            operations += 1
        batch = scheduler.schedule()
        _check(scheduler, batch)
        for entry in batch:
            request = entry.request
            samples = entry.samples
            request.num_computed_tokens += entry.num_new_tokens
            scheduler.cache_computed_blocks(request, entry.num_new_tokens)
            if not samples:
                continue
            request.output_token_ids.append(rng.randrange(1000))
            stop = rng.random() < 0.02  # a sampled EOS
            if stop or len(request.output_token_ids) >= request.sampling_params.max_tokens:
                scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
                ended[live.pop(request.request_id).request_id] = request.status
                operations += 1
    assert len(ended) == next_id and all(status.finished for status in ended.values())
    assert scheduler.num_unfinished == 0
    assert scheduler.block_pool.num_free_blocks == NUM_BLOCKS
    assert scheduler.num_preemptions > 0, "the workload is meant to exercise preemption"
    assert scheduler.block_pool.prefix_cache_hits > 0, "and prefix-cache hits"
    print(f"{next_id} requests, {scheduler.num_preemptions} preemptions")
