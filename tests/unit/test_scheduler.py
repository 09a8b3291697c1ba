"""The scheduler alone (no model): token budget, decodes first, block reservation."""

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.scheduler import Scheduler

BLOCK_SIZE = 16


def _scheduler(budget: int, num_blocks: int = 64) -> Scheduler:
    config = EngineConfig(
        model="unused",
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=budget,
        num_kv_blocks=num_blocks,
    )
    return Scheduler(config, BlockPool(num_blocks), max_model_len=1024)


def _request(request_id: str, prompt_len: int, max_tokens: int = 8) -> Request:
    return Request(request_id, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens))


def test_long_prompt_is_chunked_and_decodes_go_first() -> None:
    scheduler = _scheduler(budget=8)
    long, short = _request("long", 100), _request("short", 4)
    scheduler.add(long)
    scheduler.add(short)
    first = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in first] == [("long", 8)]
    long.num_computed_tokens += 8
    second = scheduler.schedule()  # long takes the whole budget again; short waits
    assert [(s.request.request_id, s.num_new_tokens) for s in second] == [("long", 8)]
    long.num_computed_tokens += 8
    # short has been prefilled and sampled once: one token to compute, so it runs before long.
    scheduler.waiting.remove(short)
    short.status = RequestStatus.RUNNING
    short.num_computed_tokens, short.output_token_ids = 4, [7]
    short.block_ids = scheduler.block_pool.allocate(scheduler.blocks_reserved(short))
    scheduler.running.append(short)
    third = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in third] == [("short", 1), ("long", 7)]
    assert not third[1].samples and third[0].samples


def test_admission_reserves_the_whole_length_and_finish_frees_it() -> None:
    scheduler = _scheduler(budget=512, num_blocks=10)
    first, second = _request("a", 60, max_tokens=40), _request("b", 60, max_tokens=40)
    scheduler.add(first)
    scheduler.add(second)
    batch = scheduler.schedule()
    # 100 tokens need 7 blocks: the second request does not fit beside the first and waits.
    assert [s.request.request_id for s in batch] == ["a"]
    assert len(first.block_ids) == 7 and scheduler.block_pool.num_free_blocks == 3
    scheduler.finish(first, RequestStatus.FINISHED_STOPPED)
    assert scheduler.block_pool.num_free_blocks == 10 and first.block_ids == []
    assert [s.request.request_id for s in scheduler.schedule()] == ["b"]
