"""The engine: requests in, one scheduled model step at a time, token deltas out."""

import logging
import time

import torch

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.errors import ContextLengthError, RequestError
from pdserve.engine.kv_cache import allocate_kv_cache, num_kv_blocks
from pdserve.engine.loader import load_model
from pdserve.engine.output_processor import OutputProcessor
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.runner import ModelRunner
from pdserve.engine.sampler import Sampler, SamplingRow, make_generator
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.scheduler import Scheduler
from pdserve.engine.stats import EngineStats
from pdserve.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config = ModelConfig.from_pretrained(config.model)
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_model_len,
            self.model_config.max_model_len,
        )
        self.tokenizer = Tokenizer.from_pretrained(config.model)
        self.device = torch.device(config.device)
        model = load_model(config.model, self.model_config, config.torch_dtype, self.device)
        num_blocks = num_kv_blocks(self.model_config, config)
        kv_cache = allocate_kv_cache(self.model_config, config, num_blocks)
        self.block_pool = BlockPool(num_blocks, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_pool, self.max_model_len)
        self.runner = ModelRunner(model, kv_cache, config.block_size)
        eos_ids = set(self.model_config.eos_token_ids) | set(self.tokenizer.eos_token_ids)
        self.sampler = Sampler(sorted(eos_ids), seed=config.seed)
        self.output_processor = OutputProcessor(self.tokenizer, eos_ids, self.max_model_len)
        self._requests: dict[str, Request] = {}
        logger.info(
            "engine ready: %s, %s, %d KV blocks of %d tokens, max_model_len %d",
            config.model,
            config.dtype,
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
    ) -> Request:
        """Validates and queues a request; bad input raises ``RequestError`` and queues nothing."""
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use", "request_id")
        text = prompt if isinstance(prompt, str) else None
        # "" is refused like [], though encoding it could yield a lone BOS token.
        token_ids = list(prompt) if text is None else (self.tokenizer.encode(text) if text else [])
        self._validate_prompt(token_ids)
        generator = make_generator(params, self.device)
        request = Request(
            request_id,
            token_ids,
            params,
            prompt=text,
            priority=priority,
            cache_salt=cache_salt,
            generator=generator,
        )
        need = self.scheduler.max_blocks(request)
        if need > self.block_pool.num_blocks:
            raise RequestError(
                f"prompt ({len(token_ids)} tokens) plus max_tokens ({params.max_tokens}) needs "
                f"{need} KV blocks; the cache has {self.block_pool.num_blocks}",
                "max_tokens",
            )
        self._requests[request_id] = request
        self.output_processor.add(request)
        self.scheduler.add(request)
        return request

    def abort_request(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None and not request.status.finished:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            request.finished_time = time.monotonic()
            self.output_processor.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def stats(self) -> EngineStats:
        pool = self.block_pool
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=1.0 - pool.num_free_blocks / pool.num_blocks,
            num_free_blocks=pool.num_free_blocks,
            prefix_cache_queries=pool.prefix_cache_queries,
            prefix_cache_hits=pool.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )

    def step(self) -> list[RequestOutput]:
        """Runs one model step; returns a delta for every request that produced a token."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        sampling, logits = self.runner.execute(batch)
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
        outputs = []
        for request, token_id, logprobs in zip(
            requests, sampled.token_ids, sampled.logprobs, strict=True
        ):
            request.token_times.append(now)
            delta, status = self.output_processor.append_token(request, token_id, logprobs)
            if status is not None:
                self.scheduler.finish(request, status)
                request.finished_time = now
                delta.metrics = request.metrics()
                del self._requests[request.request_id]
            outputs.append(delta)
        return outputs

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
