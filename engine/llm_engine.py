"""The engine: requests in, one scheduled model step at a time, token deltas out."""

import logging
import time
from dataclasses import dataclass

import torch

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.errors import ContextLengthError, RequestError
from pdserve.engine.kv_cache import allocate_kv_cache, num_kv_blocks
from pdserve.engine.kv_events import KVEventLog
from pdserve.engine.linear import native_bf16_products
from pdserve.engine.loader import load_model
from pdserve.engine.output_processor import OutputProcessor
from pdserve.engine.outputs import PositionLogprobs, RequestOutput
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.runner import ModelRunner
from pdserve.engine.sampler import Sampler, SamplingRow, TokenLogprobs, make_generator
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.scheduler import Scheduler
from pdserve.engine.stats import EngineStats, IterationStats
from pdserve.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteKVSlots:
    """Where a peer's prompt KV goes: the request's blocks, of which the first few hit locally."""

    block_ids: list[int]
    num_cached_blocks: int


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        collect_stats: bool = False,
        kv_events: KVEventLog | None = None,
    ) -> None:
        """``collect_stats``: keep ``IterationStats`` for metrics; whoever sets it must call
        ``take_iteration_stats`` now and then (a server does; the offline ``LLM`` does not).
        ``kv_events``: where the prefix cache logs its changes; whoever sets it must take its
        reports now and then."""
        self.config = config
        self.model_config = ModelConfig.from_pretrained(config.model)
        self.max_model_len = config.effective_max_model_len(self.model_config)
        self.tokenizer = Tokenizer.from_pretrained(config.model)
        self.device = torch.device(config.device)
        model = load_model(
            config.model, self.model_config, config.torch_dtype, self.device, config.quantization
        )
        num_blocks = num_kv_blocks(self.model_config, config)
        self.kv_cache = allocate_kv_cache(self.model_config, config, num_blocks)
        self.block_pool = BlockPool(num_blocks, config.enable_prefix_caching, kv_events)
        self.scheduler = Scheduler(config, self.block_pool, self.max_model_len)
        self.runner = ModelRunner(model, self.kv_cache, config.block_size)
        eos_ids = set(self.model_config.eos_token_ids) | set(self.tokenizer.eos_token_ids)
        self.sampler = Sampler(sorted(eos_ids), seed=config.seed)
        self.output_processor = OutputProcessor(self.tokenizer, eos_ids, self.max_model_len)
        self._requests: dict[str, Request] = {}
        self._held_kv: dict[str, list[int]] = {}  # finished hold_kv requests' blocks
        self._iteration_stats = IterationStats() if collect_stats else None
        if config.torch_dtype == torch.bfloat16 and not native_bf16_products(self.device):
            logger.warning(
                "bfloat16 on a CPU without bf16 instructions (AVX512-BF16 or AMX): its products "
                "run in torch's reference kernels, many times slower than float32 "
                "(--dtype float32 serves faster here)"
            )
        logger.info(
            "engine ready: %s, %s%s, %d KV blocks of %d tokens, max_model_len %d",
            config.model,
            config.dtype,
            f", {config.quantization} weights" if config.quantization else "",
            num_blocks,
            config.block_size,
            self.max_model_len,
        )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str = "",
        hold_kv: bool = False,
    ) -> Request:
        """Validates and queues a request; bad input raises ``RequestError`` and queues nothing.

        ``hold_kv`` (prefill role): when the request finishes by length, its blocks are held for a
        peer to read instead of freed; ``take_held_kv`` hands them over, ``free_kv`` returns them.
        """
        request = self._new_request(request_id, prompt, params, priority, cache_salt)
        request.hold_kv = hold_kv
        self._requests[request_id] = request
        self.output_processor.add(request)
        self.scheduler.add(request)
        return request

    def add_remote_prefilled(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str = "",
    ) -> RemoteKVSlots | None:
        """Decode role: reserves blocks for a prompt whose KV a peer computed.

        Returns where the peer's blocks go, or None (nothing reserved) when the blocks do not fit
        now. The caller fills ``slots.block_ids[slots.num_cached_blocks:]`` and then calls
        ``complete_remote_prefill``, or ``recompute_remote_prefill`` if the transfer failed. It
        must not abort the request while a transfer still writes into its blocks.
        """
        request = self._new_request(request_id, prompt_token_ids, params, priority, cache_salt)
        if not self.scheduler.reserve_remote(request):
            return None
        self._requests[request_id] = request
        self.output_processor.add(request)
        return RemoteKVSlots(
            list(request.block_ids), request.num_cached_tokens // self.config.block_size
        )

    def complete_remote_prefill(
        self, request_id: str, first_token: int, first_logprobs: PositionLogprobs | None = None
    ) -> RequestOutput:
        """The prompt's KV has landed: the peer's first token (with the logprobs the peer
        computed for it, if asked for) is emitted and decoding goes on."""
        request = self._requests[request_id]
        self.scheduler.activate_remote(request)
        # The peer sampled this token and counted it, with the prompt.
        delta = self._append_token(request, first_token, None, time.monotonic(), counted=False)
        if first_logprobs is not None:
            delta.outputs[0].logprobs = [first_logprobs]
        return delta

    def recompute_remote_prefill(self, request_id: str) -> None:
        """The transfer failed: the request is queued to prefill here instead."""
        self.scheduler.requeue_remote(self._requests[request_id])

    def get_request(self, request_id: str) -> Request:
        return self._requests[request_id]

    def take_held_kv(self, request_id: str) -> list[int]:
        """Prefill role: the blocks a finished ``hold_kv`` request left; the caller frees them."""
        return self._held_kv.pop(request_id)

    def free_kv(self, block_ids: list[int]) -> None:
        self.block_pool.free(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache; False (nothing done) while requests hold blocks."""
        return self.block_pool.reset_prefix_cache()

    def abort_request(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None and not request.status.finished:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            request.finished_time = time.monotonic()
            self.output_processor.remove(request_id)
            if self._iteration_stats is not None:
                self._iteration_stats.finished.append(request.finished_stats())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def has_runnable_requests(self) -> bool:
        """Whether a step would do anything: requests waiting or running, not awaiting KV."""
        return self.scheduler.num_unfinished > len(self.scheduler.awaiting_kv)

    def stats(self) -> EngineStats:
        pool = self.block_pool
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=1.0 - pool.num_free_blocks / pool.num_blocks,
            num_free_blocks=pool.num_free_blocks,
            num_blocks=pool.num_blocks,
            num_queued_prefill_tokens=self.scheduler.num_queued_prefill_tokens,
            prefix_cache_queries=pool.prefix_cache_queries,
            prefix_cache_hits=pool.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )

    def take_iteration_stats(self) -> IterationStats:
        """What the engine did since the last call; starts a new count (``collect_stats`` only)."""
        if self._iteration_stats is None:
            raise RuntimeError("this engine was built without collect_stats")
        taken, self._iteration_stats = self._iteration_stats, IterationStats()
        return taken

    def step(self) -> list[RequestOutput]:
        """Runs one model step; returns a delta for every request that produced a token."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        sampling, logits = self.runner.execute(batch)
        if self._iteration_stats is not None:
            self._iteration_stats.iteration_tokens.append(sum(e.num_new_tokens for e in batch))
        for entry in batch:
            entry.request.num_computed_tokens += entry.num_new_tokens
            self.scheduler.cache_computed_blocks(entry.request, entry.num_new_tokens)
        if not sampling:
            return []
        requests = [entry.request for entry in sampling]
        rows = [
            SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids, r.generator)
            for r in requests
        ]
        sampled = self.sampler(logits, rows)
        now = time.monotonic()
        return [
            self._append_token(request, token_id, logprobs, now)
            for request, token_id, logprobs in zip(
                requests, sampled.token_ids, sampled.logprobs, strict=True
            )
        ]

    def _append_token(
        self,
        request: Request,
        token_id: int,
        logprobs: TokenLogprobs | None,
        now: float,
        counted: bool = True,
    ) -> RequestOutput:
        stats = self._iteration_stats
        if counted and stats is not None:
            stats.num_generation_tokens += 1
            if not request.output_token_ids:  # the prompt is computed once its first token is
                stats.num_prompt_tokens += request.num_prompt_tokens
        request.token_times.append(now)
        delta, status = self.output_processor.append_token(request, token_id, logprobs)
        if status is not None:
            # Held only when capped by length: a request that stopped has nothing to continue.
            if request.hold_kv and status == RequestStatus.FINISHED_LENGTH:
                self._held_kv[request.request_id] = request.block_ids
                request.block_ids = []
            self.scheduler.finish(request, status)
            request.finished_time = now
            delta.metrics = request.metrics()
            if stats is not None:
                stats.finished.append(request.finished_stats())
            del self._requests[request.request_id]
        return delta

    def _new_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int,
        cache_salt: str,
    ) -> Request:
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use", "request_id")
        text = prompt if isinstance(prompt, str) else None
        # "" is refused like [], though encoding it could yield a lone BOS token.
        token_ids = list(prompt) if text is None else (self.tokenizer.encode(text) if text else [])
        self._validate_prompt(token_ids)
        request = Request(
            request_id,
            token_ids,
            params,
            prompt=text,
            priority=priority,
            cache_salt=cache_salt,
            generator=make_generator(params, self.device),
        )
        need = self.scheduler.max_blocks(request)
        if need > self.block_pool.num_blocks:
            raise RequestError(
                f"prompt ({len(token_ids)} tokens) plus max_tokens ({params.max_tokens}) needs "
                f"{need} KV blocks; the cache has {self.block_pool.num_blocks}",
                "max_tokens",
            )
        return request

    def _validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise RequestError("prompt is empty: it must contain at least one token", "prompt")
        if len(token_ids) >= self.max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt has {len(token_ids)} tokens, leaving no room for output.",
                "prompt",
            )
        vocab = self.model_config.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(
                f"prompt token id {bad} is outside the vocabulary [0, {vocab})", "prompt"
            )
