"""Decides, each step, which requests run and how many of their tokens, under one token budget.

Running requests go first: decodes (one token left to compute), then unfinished prompt chunks. Then
waiting requests are admitted in queue order (FCFS, or by ``priority``) while the budget,
``max_num_seqs`` and free blocks allow; an admitted prompt starts after its longest cached prefix.
Blocks are taken as tokens need them. When a running request needs a block and none is free, the
most recently admitted request is preempted by recompute: its blocks go back (usually staying in the
prefix cache) and it returns to the front of the queue.

A request whose prompt KV comes from a peer (decode role) skips the queue: ``reserve_remote`` takes
its cached prefix and blocks for the rest of the prompt at once, and ``activate_remote`` makes it a
running decode when the transfer has landed.
"""

import heapq
import itertools
import time
from typing import NamedTuple

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.engine.request import Request, RequestStatus


class ScheduledRequest(NamedTuple):  # a tuple: the scheduler makes one per running request
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
        self.block_size = config.block_size
        self.waiting: list[tuple[tuple[int, int], Request]] = []  # heap on (priority, arrival)
        self.running: list[Request] = []  # in admission order: the last is preempted first
        self.awaiting_kv: dict[str, Request] = {}  # blocks reserved, prompt KV in transit
        self._order: dict[str, tuple[int, int]] = {}
        self._arrivals = itertools.count()
        self.num_preemptions = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.awaiting_kv)

    @property
    def num_queued_prefill_tokens(self) -> int:
        queued = itertools.chain((r for _, r in self.waiting), self.running)
        return sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in queued)

    def add(self, request: Request) -> None:
        self._set_order(request)
        heapq.heappush(self.waiting, (self._order[request.request_id], request))

    def reserve_remote(self, request: Request) -> bool:
        """Takes the prompt's cached prefix and blocks for the rest, for a peer to fill.

        Returns False, reserving nothing, when the blocks do not fit now.
        """
        num_prompt_blocks = -(-request.num_prompt_tokens // self.block_size)
        # Every full prompt block may hit: no prompt token is recomputed here.
        max_hit_blocks = request.num_prompt_tokens // self.block_size
        if self.block_pool.enable_caching:
            self._hash_blocks(request, max_hit_blocks)
        hits = self.block_pool.lookup(request.block_hashes, max_hit_blocks)
        need = num_prompt_blocks - len(hits)
        if not self.block_pool.can_allocate(need + self.block_pool.num_free_among(hits)):
            return False
        self.block_pool.take(hits)
        self.block_pool.record_lookup(request.num_prompt_tokens, len(hits) * self.block_size)
        request.block_ids = hits + self.block_pool.allocate(need)
        request.num_cached_tokens = len(hits) * self.block_size
        request.status = RequestStatus.WAITING_FOR_KV
        self._set_order(request)
        self.awaiting_kv[request.request_id] = request
        return True

    def activate_remote(self, request: Request) -> None:
        """The prompt's KV has landed: the request runs as a decode, its prompt blocks cached."""
        del self.awaiting_kv[request.request_id]
        request.num_computed_tokens = request.num_prompt_tokens
        self.cache_computed_blocks(request, request.num_prompt_tokens - request.num_cached_tokens)
        request.status = RequestStatus.RUNNING
        request.scheduled_time = time.monotonic()
        self.running.append(request)

    def requeue_remote(self, request: Request) -> None:
        """The transfer failed: the request gives its blocks back and queues to prefill here."""
        del self.awaiting_kv[request.request_id]
        self.block_pool.free(request.block_ids)
        request.block_ids = []
        request.status = RequestStatus.WAITING
        heapq.heappush(self.waiting, (self._order[request.request_id], request))

    def max_blocks(self, request: Request) -> int:
        """Blocks for the request's longest possible sequence; more than the pool can never run."""
        longest = min(
            request.num_prompt_tokens + request.sampling_params.max_tokens, self.max_model_len
        )
        return -(-longest // self.block_size)

    def schedule(self) -> list[ScheduledRequest]:
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, ScheduledRequest] = {}
        preempted = False
        # Decodes before unfinished prompt chunks, so a long prompt's chunk can never take the
        # budget that running streams need for their next token.
        decodes: list[Request] = []
        chunks: list[Request] = []
        for request in self.running:
            remaining = request.num_tokens - request.num_computed_tokens
            (decodes if remaining == 1 else chunks).append(request)
        block_size, num_decodes = self.block_size, len(decodes)
        for i, request in enumerate(decodes + chunks):
            if budget == 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if i < num_decodes:
                # A decode needs a block only when its last one is full.
                n = 1
                need = int(request.num_computed_tokens == len(request.block_ids) * block_size)
            else:
                n = self._chunk(request, budget)
                need = self._blocks_needed(request, n)
            if need:
                while not self.block_pool.can_allocate(need):
                    victim = self._preempt_one()
                    preempted = True
                    if victim in scheduled:
                        budget += scheduled.pop(victim).num_new_tokens
                    if victim == request.request_id:
                        break
                else:
                    request.block_ids += self.block_pool.allocate(need)
                if request.status != RequestStatus.RUNNING:
                    continue
            scheduled[request.request_id] = ScheduledRequest(request, n)
            budget -= n
        # Admitting more right after preempting would only preempt again.
        while not preempted and self.waiting and budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                break
            request = self.waiting[0][1]
            if not self._admit(request, budget):
                break
            heapq.heappop(self.waiting)
            n = self._chunk(request, budget)
            scheduled[request.request_id] = ScheduledRequest(request, n)
            budget -= n
        return list(scheduled.values())

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Removes a request from the queues and returns its blocks at once."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING:
            self.waiting.remove((self._order[request.request_id], request))
            heapq.heapify(self.waiting)
        elif request.status == RequestStatus.WAITING_FOR_KV:
            del self.awaiting_kv[request.request_id]
        self._order.pop(request.request_id, None)
        request.status = status
        self.block_pool.free(request.block_ids)
        request.block_ids = []

    def cache_computed_blocks(self, request: Request, num_new_tokens: int) -> None:
        """Registers the blocks this step filled in the prefix cache (after the step ran)."""
        first = (request.num_computed_tokens - num_new_tokens) // self.block_size
        full = request.num_computed_tokens // self.block_size
        if full == first or not self.block_pool.enable_caching:
            return
        self._hash_blocks(request, full)
        for i in range(first, full):
            self.block_pool.cache(request.block_ids[i], request.block_hashes[i])

    def _hash_blocks(self, request: Request, num_blocks: int) -> None:
        """Extends the request's hash chain to its first ``num_blocks`` full blocks."""
        if len(request.block_hashes) < num_blocks:
            tokens = request.token_ids_between(0, num_blocks * self.block_size)
            extend_block_hashes(request.block_hashes, tokens, self.block_size, request.cache_salt)

    def _chunk(self, request: Request, budget: int) -> int:
        n = min(request.num_tokens - request.num_computed_tokens, budget)
        threshold = self.config.long_prefill_token_threshold
        return min(n, threshold) if threshold > 0 else n

    def _blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        total = request.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_ids))

    def _admit(self, request: Request, budget: int) -> bool:
        """Takes the request's cached prefix and blocks for its first chunk, if they fit."""
        # The last prompt token is always recomputed: its logits are needed to sample.
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        if self.block_pool.enable_caching:
            self._hash_blocks(request, max_hit_blocks)
        hits = self.block_pool.lookup(request.block_hashes, max_hit_blocks)
        num_hit_tokens = len(hits) * self.block_size
        request.num_computed_tokens = num_hit_tokens
        need = -(-(num_hit_tokens + self._chunk(request, budget)) // self.block_size) - len(hits)
        if not self.block_pool.can_allocate(need + self.block_pool.num_free_among(hits)):
            request.num_computed_tokens = 0
            return False
        self.block_pool.take(hits)
        self.block_pool.record_lookup(request.num_tokens, num_hit_tokens)
        request.block_ids = hits + self.block_pool.allocate(need)
        if request.first_token_time is None:
            request.num_cached_tokens = num_hit_tokens
        if request.scheduled_time is None:
            request.scheduled_time = time.monotonic()
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return True

    def _set_order(self, request: Request) -> None:
        priority = request.priority if self.config.scheduling_policy == "priority" else 0
        self._order[request.request_id] = (priority, next(self._arrivals))

    def _preempt_one(self) -> str:
        """Preempts the most recently admitted running request (by recompute); returns its id."""
        if self.config.scheduling_policy == "priority":
            victim = max(self.running, key=lambda r: self._order[r.request_id])
            self.running.remove(victim)
        else:
            victim = self.running.pop()
        self.block_pool.free(victim.block_ids)
        victim.block_ids = []
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        heapq.heappush(self.waiting, (self._order[victim.request_id], victim))
        self.num_preemptions += 1
        return victim.request_id
