"""CPU time of one ``Scheduler.schedule`` call with many running decodes, no model at all."""

import statistics
import time

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, EngineConfig
from pdserve.engine.request import Request
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.scheduler import ScheduledRequest, Scheduler

SCHEDULER_RUNNING = 256
SCHEDULER_STEPS = 200
SCHEDULER_PROMPT_LEN = 32
WARMUP_STEPS = 5


def _simulate_step(scheduler: Scheduler, batch: list[ScheduledRequest], token_id: int = 0) -> None:
    # What LLMEngine.step does to the requests after the model ran: which entries sample is read
    # before their computed counts move on; then the filled blocks enter the prefix cache.
    sampled = [entry.request for entry in batch if entry.samples]
    for entry in batch:
        entry.request.num_computed_tokens += entry.num_new_tokens
        scheduler.cache_computed_blocks(entry.request, entry.num_new_tokens)
    for request in sampled:
        request.output_token_ids.append(token_id)


def scheduler_step_seconds(
    num_running: int = SCHEDULER_RUNNING, steps: int = SCHEDULER_STEPS
) -> float:
    """Median CPU time of ``Scheduler.schedule`` alone with ``num_running`` decoding requests."""
    max_tokens = WARMUP_STEPS + steps + 2  # no request finishes while timed
    max_model_len = SCHEDULER_PROMPT_LEN + max_tokens
    num_blocks = num_running * -(-max_model_len // DEFAULT_BLOCK_SIZE)
    config = EngineConfig(
        model="unused",
        num_kv_blocks=num_blocks,
        max_num_seqs=num_running,
        # Every prompt in the first step, so every request decodes from the second on.
        max_num_batched_tokens=max(
            DEFAULT_MAX_NUM_BATCHED_TOKENS, num_running * SCHEDULER_PROMPT_LEN
        ),
    )
    scheduler = Scheduler(config, BlockPool(num_blocks), max_model_len=max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(num_running):
        # Distinct prompts, so a prefix cache finds nothing to share.
        prompt = list(range(i * SCHEDULER_PROMPT_LEN, (i + 1) * SCHEDULER_PROMPT_LEN))
        scheduler.add(Request(f"sched-{i}", prompt, params))
    while len(scheduler.running) < num_running or scheduler.waiting:  # admit, prefill in chunks
        _simulate_step(scheduler, scheduler.schedule())
    times = []
    for i in range(WARMUP_STEPS + steps):
        start = time.thread_time()  # CPU time of this thread: a busy neighbour does not count
        batch = scheduler.schedule()
        elapsed = time.thread_time() - start
        if len(batch) != num_running or any(e.num_new_tokens != 1 for e in batch):
            raise RuntimeError(f"step {i}: expected {num_running} decodes, got {len(batch)}")
        if i >= WARMUP_STEPS:
            times.append(elapsed)
        _simulate_step(scheduler, batch)
    return statistics.median(times)
