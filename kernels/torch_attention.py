"""Paged attention in plain PyTorch: the CPU path, and the reference for the Triton kernels.

Shapes (one layer's view of the block-major cache of ``engine/kv_cache.py``):
  kv_cache: [num_blocks, 2, block_size, Hkv, D], not contiguous (blocks interleave with the other
            layers); index 0 of dim 1 is the key, 1 the value; slot s is block s // block_size, row
            s % block_size.
  block_tables: [B, max_blocks] int32; entries past a sequence's last block are never attended, but
            decode may still gather them, so they must be valid block ids (or -1, read as the last).

Attention runs in fp32 whatever the cache dtype: the gathered K/V are upcast once. On CPUs
without AVX512-BF16, torch's bf16 SDPA at query length 1 is slower than upcasting and running fp32
SDPA, and fp32 accumulation is what we want anyway (the figures behind this and each choice below:
docs/benchmarks.md, "Measurements behind the code's choices"). Unwritten cache rows must hold finite
values (allocate the cache with zeros): padding rows are masked out of the softmax but are still
multiplied by their zero weights.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

# Decode gathers K/V for a run of sequences at a time, at most this many fp32 bytes of K+V: a
# larger gather glibc serves with a fresh mmap, and faulting its pages in costs more than the copy.
DECODE_GATHER_BYTES = 8 << 20
# A run of decode sequences pads K/V to its longest; past this many padding positions, a new
# run (a dozen more ops) is cheaper than gathering and attending to them.
DECODE_PADDING_TOKENS = 256


def write_kv(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter new keys/values into their cache slots, in place. A negative slot marks padding."""
    # key, value: [T, Hkv, D]; slot_mapping: [T] int64
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    block_size = kv_cache.shape[2]
    # Advanced indices on dims 0 and 2 around the K/V slice address a [T, 2, Hkv, D] set of rows.
    new = torch.stack((key, value), dim=1).to(kv_cache.dtype)
    kv_cache[slot_mapping // block_size, :, slot_mapping % block_size] = new


def _gather(kv_cache: Tensor, block_table: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    # block_table: [..., n] -> keys and values of the first seq_len positions of those blocks, as
    # fp32 [..., Hkv, seq_len, D]. index_select on the K and V halves is much faster here than
    # advanced indexing of the cache; it refuses the -1 padding of block tables, whose rows are
    # masked anyway, so clamp it to 0.
    ids = block_table.flatten().clamp(min=0)
    k, v = (
        half.index_select(0, ids)
        .view(*block_table.shape, *half.shape[1:])
        .flatten(-4, -3)[..., :seq_len, :, :]
        .transpose(-3, -2)
        .float()
        for half in (kv_cache[:, 0], kv_cache[:, 1])  # [num_blocks, block_size, Hkv, D]
    )
    return k, v


def prefill_attention(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """Causal attention of a ragged batch of new tokens over their cached prefix and themselves.

    query: [T, Hq, D], the B sequences' new tokens concatenated; query_start_loc: [B + 1] int32;
    seq_lens: [B] int32, cached prefix + new tokens; returns [T, Hq, D] in query's dtype.
    """
    block_size = kv_cache.shape[2]
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[b], starts[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        # 4-D inputs: with 3-D ones CPU SDPA falls back to its slower math kernel.
        table = block_tables[b : b + 1, :num_blocks]  # [1, n]
        k, v = _gather(kv_cache, table, seq_len)  # [1, Hkv, S, D]
        q = query[start:end].transpose(0, 1)[None].float()  # [1, Hq, q_len, D]
        prefix = seq_len - q_len
        # SDPA's is_causal aligns the mask top-left, so with a cached prefix the new tokens (the
        # last q_len positions) need an explicit mask: query i sits at position prefix + i.
        mask = None
        if prefix > 0:
            q_pos = torch.arange(prefix, seq_len, device=query.device)
            mask = torch.arange(seq_len, device=query.device) <= q_pos[:, None]  # [q_len, S]
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=prefix == 0, scale=scale, enable_gqa=True
        )
        out[start:end] = o[0].transpose(0, 1)
    return out


def decode_attention(
    query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float
) -> Tensor:
    """One new token per sequence attending to its seq_lens[b] cached tokens (itself included).

    query: [B, Hq, D]; seq_lens: [B] int32, each >= 1; returns [B, Hq, D] in query's dtype.
    """
    # One masked SDPA per run of neighbouring sequences, K/V padded to the run's longest: it
    # matched or beat batched matmuls and a loop over sequences. Callers that order sequences by
    # length (the runner does) get runs of similar lengths, so little padding.
    lens = seq_lens.tolist()
    if not lens:
        return torch.empty_like(query)
    token_bytes = 2 * kv_cache.shape[3] * kv_cache.shape[4] * 4  # fp32 K + V of one position
    runs = _decode_runs(lens, token_bytes)
    if len(runs) == 1:
        return _decode(query, kv_cache, block_tables, seq_lens, lens, scale).to(query.dtype)
    out = torch.empty_like(query)
    for start, end in runs:
        rows = slice(start, end)
        out[rows] = _decode(
            query[rows], kv_cache, block_tables[rows], seq_lens[rows], lens[rows], scale
        )
    return out


def _decode_runs(lens: list[int], token_bytes: int) -> list[tuple[int, int]]:
    """Splits sequences, in order, into [start, end) runs for one SDPA each.

    A run ends before the sequence that would take its padded K/V past DECODE_GATHER_BYTES or its
    padding past DECODE_PADDING_TOKENS (padding costs gather and SDPA time; a run has a fixed cost
    of a dozen ops).
    """
    runs = []
    start, longest, total = 0, 0, 0
    for i, n in enumerate(lens):
        padded = (i - start + 1) * max(longest, n)
        too_big = padded * token_bytes > DECODE_GATHER_BYTES
        if i > start and (too_big or padded - total - n > DECODE_PADDING_TOKENS):
            runs.append((start, i))
            start, longest, total = i, 0, 0
        longest, total = max(longest, n), total + n
    runs.append((start, len(lens)))
    return runs


def _decode(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    lens: list[int],
    scale: float,
) -> Tensor:
    # query: [b, Hq, D] -> fp32 [b, Hq, D]; lens: seq_lens as a list
    max_len = max(lens)
    table = block_tables[:, : -(-max_len // kv_cache.shape[2])]  # [b, n]
    k, v = _gather(kv_cache, table, max_len)  # [b, Hkv, max_len, D]
    mask = None
    if min(lens) < max_len:
        valid = torch.arange(max_len, device=query.device) < seq_lens[:, None]  # [b, max_len]
        mask = valid[:, None, None, :]
    # The query heads sharing a kv head attend as that head's `group` query rows, so SDPA takes
    # each kv head's K/V once per group, not once per query head as with enable_gqa.
    b, num_kv_heads, head_dim = query.shape[0], k.shape[1], query.shape[2]
    q = query.view(b, num_kv_heads, -1, head_dim).float()  # [b, Hkv, group, D]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return o.reshape(query.shape)
