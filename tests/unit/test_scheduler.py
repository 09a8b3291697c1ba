"""The scheduler alone (no model): token budget, decodes first, on-demand blocks, preemption."""

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.scheduler import ScheduledRequest, Scheduler

BLOCK_SIZE = 16
SAMPLED_TOKEN = 7


def _scheduler(budget: int, num_blocks: int = 64, **config) -> Scheduler:
    engine = EngineConfig(
        model="unused",
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=budget,
        num_kv_blocks=num_blocks,
        **config,
    )
    return Scheduler(engine, BlockPool(num_blocks), max_model_len=1024)


def _request(request_id: str, prompt_len: int, first_token: int = 0) -> Request:
    prompt = list(range(first_token, first_token + prompt_len))
    return Request(request_id, prompt, SamplingParams(max_tokens=64))


def _run(scheduler: Scheduler, batch: list[ScheduledRequest]) -> list[tuple[str, int]]:
    """Does what the engine does after the model ran: tokens computed, one sampled where due."""
    for entry in batch:
        samples = entry.samples
        entry.request.num_computed_tokens += entry.num_new_tokens
        scheduler.cache_computed_blocks(entry.request, entry.num_new_tokens)
        if samples:
            entry.request.output_token_ids.append(SAMPLED_TOKEN)
    return [(e.request.request_id, e.num_new_tokens) for e in batch]


def test_long_prompt_is_chunked_and_decodes_go_first() -> None:
    scheduler = _scheduler(budget=8, long_prefill_token_threshold=6)
    scheduler.add(_request("long", 100))
    scheduler.add(_request("short", 2))
    assert _run(scheduler, scheduler.schedule()) == [("long", 6), ("short", 2)]
    # short now decodes (one token to compute) and goes before long's next chunk.
    assert _run(scheduler, scheduler.schedule()) == [("short", 1), ("long", 6)]


def test_blocks_come_on_demand_and_the_newest_request_is_preempted() -> None:
    scheduler = _scheduler(budget=512, num_blocks=8)
    first, second = _request("a", 64), _request("b", 64, first_token=1000)
    scheduler.add(first)
    scheduler.add(second)
    assert _run(scheduler, scheduler.schedule()) == [("a", 64), ("b", 64)]
    assert len(first.block_ids) == len(second.block_ids) == 4  # 64 tokens, 16 a block
    assert scheduler.block_pool.num_free_blocks == 0
    # Both decode token 65, which needs a fifth block each; b, the newest, gives way to a.
    assert _run(scheduler, scheduler.schedule()) == [("a", 1)]
    assert scheduler.num_preemptions == 1
    assert second.status == RequestStatus.WAITING and second.num_computed_tokens == 0
    assert second.block_ids == [] and second.output_token_ids == [SAMPLED_TOKEN]
    scheduler.finish(first, RequestStatus.FINISHED_STOPPED)
    assert scheduler.block_pool.num_free_blocks == 8
    # b returns and finds its first 3 blocks in the prefix cache: its last block, freed first,
    # was the one handed to a. It recomputes the last 16 prompt tokens and its sampled one.
    assert _run(scheduler, scheduler.schedule()) == [("b", 17)]
    assert second.num_computed_tokens == 65 and len(second.block_ids) == 5
    scheduler.finish(second, RequestStatus.FINISHED_ABORTED)
    assert scheduler.block_pool.num_free_blocks == 8
