"""Paged attention in Triton: the CUDA path (and, under TRITON_INTERPRET=1, testable on CPU).

Same contract and shapes as torch_attention. Every K/V tile is gathered row by row through the
block table (position p -> block block_tables[b, p // block_size], row p % block_size), so tile
sizes are independent of the cache's block size. Softmax runs online in fp32 (flash-attention
style), in the log2 domain. No wrapper reads a tensor back to the host, so the ops can be captured
in CUDA graphs.
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

# Tile sizes, not tuned: query rows and key rows per program step.
PREFILL_BLOCK_M = 64
PREFILL_BLOCK_N = 64
DECODE_BLOCK_N = 64
# tl.dot needs every tile dimension to be at least 16.
MIN_DOT_DIM = 16
LOG2_E = math.log2(math.e)


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ckv, stride_cs, stride_ch,
    num_heads, head_dim,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program per token: copy its [Hkv, D] key and value into slot slot_mapping[t].
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < head_dim)
    k_src = key_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    v_src = value_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    k, v = tl.load(k_src, mask=mask), tl.load(v_src, mask=mask)
    dst = (
        cache_ptr
        + (slot // BLOCK_SIZE) * stride_cb
        + (slot % BLOCK_SIZE) * stride_cs
        + offs_h[:, None] * stride_ch
        + offs_d[None, :]
    )
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_ckv, v.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, q_pos, start_n, seq_len, table_ptr, k_ptr, v_ptr,
    stride_cb, stride_cs, offs_d, d_mask, qk_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # One online-softmax step over key positions [start_n, start_n + BLOCK_N).
    # acc: [M, BLOCK_D] fp32; m_i, l_i: [M] fp32 running max (log2 domain) and sum; q: [M, BLOCK_D];
    # q_pos: [M] each query row's position (it sees keys at positions <= q_pos and < seq_len);
    # table_ptr: this sequence's block-table row; k_ptr/v_ptr: the cache at this kv head's K/V.
    pos = start_n + tl.arange(0, BLOCK_N)
    in_seq = pos < seq_len
    block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=in_seq, other=0).to(tl.int64)
    rows = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs  # [BLOCK_N] element offsets
    kv_mask = in_seq[:, None] & d_mask[None, :]
    k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, D]
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M, BLOCK_N]
    s = tl.where((pos[None, :] <= q_pos[:, None]) & in_seq[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(
    q_ptr, cache_ptr, table_ptr, qsl_ptr, seq_lens_ptr, out_ptr, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_tb,
    stride_cb, stride_ckv, stride_cs, stride_ch,
    head_dim,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Grid (query tiles, B, Hq): BLOCK_M new tokens of sequence b, query head h.
    tile, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    start_m = tile * BLOCK_M
    if start_m >= q_len:  # the grid is sized for the longest possible sequence
        return
    seq_len = tl.load(seq_lens_ptr + b)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask, d_mask = offs_m < q_len, offs_d < head_dim
    tok = (q_start + offs_m).to(tl.int64)
    q_mask = m_mask[:, None] & d_mask[None, :]
    # other=0: padded head_dim lanes must be zero, not garbage, or they leak into q @ k^T.
    q_rows = q_ptr + tok[:, None] * stride_qt + h * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=q_mask, other=0.0)  # [BLOCK_M, BLOCK_D]
    q_pos = seq_len - q_len + offs_m  # the new tokens are the last q_len positions
    k_ptr = cache_ptr + (h // GROUP) * stride_ch
    # -1e30, not -inf, so a row with no visible key yet gives alpha = exp2(0), never exp2(nan).
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Causal: the tile's last query sees keys up to position seq_len - q_len + start_m + BLOCK_M - 1
    end_n = tl.minimum(seq_len, seq_len - q_len + start_m + BLOCK_M)
    for start_n in range(0, end_n, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, start_n, seq_len, table_ptr + b * stride_tb, k_ptr,
            k_ptr + stride_ckv, stride_cb, stride_cs, offs_d, d_mask, qk_scale,
            BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out = out_ptr + tok[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _decode_kernel(
    q_ptr, cache_ptr, table_ptr, seq_lens_ptr, out_ptr, qk_scale,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_tb,
    stride_cb, stride_ckv, stride_cs, stride_ch,
    head_dim,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Grid (B, Hkv): the GROUP query heads sharing kv head `kvh` are the rows of one tile, so each
    # K/V tile is loaded once per group rather than once per query head.
    b, kvh = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    heads = kvh * GROUP + offs_g
    q_mask = (offs_g[:, None] < GROUP) & d_mask[None, :]
    q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=q_mask, other=0.0)  # [BLOCK_G, BLOCK_D]
    q_pos = tl.full([BLOCK_G], 0, tl.int32) + seq_len - 1  # the new token is the last position
    k_ptr = cache_ptr + kvh * stride_ch
    m_i = tl.full([BLOCK_G], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, start_n, seq_len, table_ptr + b * stride_tb, k_ptr,
            k_ptr + stride_ckv, stride_cb, stride_cs, offs_d, d_mask, qk_scale,
            BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=q_mask)


def _check(query: Tensor, kv_cache: Tensor) -> Tensor:
    if query.dtype != kv_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} differs from the cache's {kv_cache.dtype}")
    if kv_cache.stride(-1) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    return query if query.stride(-1) == 1 else query.contiguous()


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32: full-precision products (tf32 would lose parity with the CPU path); 16-bit ignores it.
    return "ieee" if dtype == torch.float32 else "tf32"


def write_kv(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter new keys/values into their cache slots, in place. A negative slot marks padding."""
    # key, value: [T, Hkv, D]; slot_mapping: [T] int64
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    _write_kv_kernel[(num_tokens,)](
        key, value, kv_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *kv_cache.stride()[:4],
        num_heads, head_dim,
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip


def prefill_attention(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """Causal attention of a ragged batch of new tokens over their cached prefix and themselves."""
    # query: [T, Hq, D]; query_start_loc: [B + 1] int32; seq_lens: [B] int32; returns [T, Hq, D]
    query = _check(query, kv_cache)
    num_tokens, num_q_heads, head_dim = query.shape
    out = torch.empty_like(query)
    batch = seq_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    # No sequence has more than T new tokens: sizing the grid by T avoids reading q_len to the host.
    grid = (triton.cdiv(num_tokens, PREFILL_BLOCK_M), batch, num_q_heads)
    _prefill_kernel[grid](
        query, kv_cache, block_tables, query_start_loc, seq_lens, out, scale * LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *kv_cache.stride()[:4],
        head_dim,
        GROUP=num_q_heads // kv_cache.shape[3],
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_M=PREFILL_BLOCK_M,
        BLOCK_N=PREFILL_BLOCK_N,
        BLOCK_D=max(MIN_DOT_DIM, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=_dot_precision(query.dtype),
    )  # fmt: skip
    return out


def decode_attention(
    query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float
) -> Tensor:
    """One new token per sequence attending to its seq_lens[b] cached tokens (itself included)."""
    # query: [B, Hq, D]; seq_lens: [B] int32; returns [B, Hq, D]; a sequence of length 0 gives zeros
    query = _check(query, kv_cache)
    batch, num_q_heads, head_dim = query.shape
    out = torch.empty_like(query)
    if batch == 0:
        return out
    num_kv_heads = kv_cache.shape[3]
    group = num_q_heads // num_kv_heads
    _decode_kernel[(batch, num_kv_heads)](
        query, kv_cache, block_tables, seq_lens, out, scale * LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *kv_cache.stride()[:4],
        head_dim,
        GROUP=group,
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_G=max(MIN_DOT_DIM, triton.next_power_of_2(group)),
        BLOCK_N=DECODE_BLOCK_N,
        BLOCK_D=max(MIN_DOT_DIM, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=_dot_precision(query.dtype),
    )  # fmt: skip
    return out
