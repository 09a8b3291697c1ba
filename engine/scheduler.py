"""Decides, each step, which requests run and how many of their tokens, under one token budget.

Running requests go first (a decode is one token; an unfinished prompt continues in chunks), then
waiting requests are admitted FCFS while the budget, ``max_num_seqs`` and free blocks allow.
Until preemption arrives with the continuous-batching work, a request reserves blocks for its whole
possible length (prompt + max_tokens, capped by the context) when admitted, so a running request can
never run out of blocks.
"""

from collections import deque
from dataclasses import dataclass

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig
from pdserve.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the known tokens, so a new token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


class Scheduler:
    def __init__(self, config: EngineConfig, block_pool: BlockPool, max_model_len: int) -> None:
        self.config = config
        self.block_pool = block_pool
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> list[ScheduledRequest]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        # Decodes (one token left to compute) before unfinished prompt chunks, so a long prompt's
        # chunk can never take the budget that running streams need for their next token.
        for request in sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1):
            if budget == 0:
                break
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            scheduled.append(ScheduledRequest(request, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            need = self.blocks_reserved(request)
            if not self.block_pool.can_allocate(need):
                break
            self.waiting.popleft()
            request.block_ids = self.block_pool.allocate(need)
            n = min(request.num_tokens, budget)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(ScheduledRequest(request, n))
            budget -= n
        return scheduled

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Removes a request from the queues and returns its blocks at once."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = status
        self.block_pool.free(request.block_ids)
        request.block_ids = []

    def blocks_reserved(self, request: Request) -> int:
        """Blocks for the request's longest possible sequence."""
        longest = min(
            request.num_prompt_tokens + request.sampling_params.max_tokens, self.max_model_len
        )
        return -(-longest // self.config.block_size)
