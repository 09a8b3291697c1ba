"""Executes one scheduled step: flattens the batch into tensors, runs the model once."""

import torch

from pdserve.engine.attention import AttentionMetadata
from pdserve.engine.model import LlamaForCausalLM
from pdserve.engine.scheduler import ScheduledRequest


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: torch.Tensor, block_size: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = kv_cache.device

    def execute(self, batch: list[ScheduledRequest]) -> tuple[list[ScheduledRequest], torch.Tensor]:
        """Runs ``batch``; returns the entries that sample this step and their logits [n, vocab]."""
        # Decodes (one query token) first: the attention layer takes them as one batched call.
        # Longest context first, so that its runs of neighbours pad their K/V to similar lengths.
        batch = sorted(batch, key=lambda s: (s.num_new_tokens != 1, -s.request.num_computed_tokens))
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_start_loc = [0]
        logits_indices: list[int] = []
        sampling: list[ScheduledRequest] = []
        bs = self.block_size
        for entry in batch:
            req = entry.request
            start, end = req.num_computed_tokens, req.num_computed_tokens + entry.num_new_tokens
            input_ids += req.token_ids_between(start, end)
            positions += range(start, end)
            slots += (req.block_ids[p // bs] * bs + p % bs for p in range(start, end))
            seq_lens.append(end)
            query_start_loc.append(query_start_loc[-1] + entry.num_new_tokens)
            if entry.samples:
                logits_indices.append(query_start_loc[-1] - 1)
                sampling.append(entry)
        max_blocks = max(len(e.request.block_ids) for e in batch)
        block_tables = [
            e.request.block_ids + [0] * (max_blocks - len(e.request.block_ids)) for e in batch
        ]
        num_decodes = sum(1 for e in batch if e.num_new_tokens == 1)

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            block_tables=tensor(block_tables, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            query_start_loc=tensor(query_start_loc, torch.int32),
            num_decodes=num_decodes,
        )
        every_token_samples = len(logits_indices) == len(input_ids)  # e.g. a step of decodes
        logits = self.model(
            tensor(input_ids, torch.int64),
            tensor(positions, torch.int64),
            self.kv_cache,
            meta,
            None if every_token_samples else tensor(logits_indices, torch.int64),
        )
        return sampling, logits
