"""One flattened step's attention metadata, and the paged attention layer that uses it."""

from dataclasses import dataclass

import torch

from pdserve import kernels


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each token of a flattened step sits in the paged cache.

    The batch is ordered decodes first: the first ``num_decodes`` sequences contribute exactly one
    query token each; the rest are prefills (a prompt, its uncached remainder, or its next chunk).
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot each new token's K/V is written to
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32: tokens in the cache after this step, prefix included
    query_start_loc: torch.Tensor  # [B + 1] int32: where each sequence's queries start in the step
    num_decodes: int

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def prefill_query_start_loc(self) -> torch.Tensor:
        # [num_prefills + 1]: relative to the first prefill token
        return self.query_start_loc[self.num_decodes :] - self.num_decodes


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D]; kv_cache: one layer's [num_blocks, 2, block, Hkv, D]."""
    kernels.write_kv(k, v, kv_cache, meta.slot_mapping)
    nd = meta.num_decodes
    if nd == meta.num_seqs:
        return kernels.decode_attention(q, kv_cache, meta.block_tables, meta.seq_lens, scale)
    prefill = kernels.prefill_attention(
        q[nd:],
        kv_cache,
        meta.block_tables[nd:],
        meta.prefill_query_start_loc,
        meta.seq_lens[nd:],
        scale,
    )
    if nd == 0:
        return prefill
    decode = kernels.decode_attention(
        q[:nd], kv_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale
    )
    return torch.cat((decode, prefill))
