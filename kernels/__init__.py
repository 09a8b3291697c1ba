"""Attention ops over the paged KV cache: the one dispatch point the model calls.

CUDA tensors go to the Triton kernels. On the CPU, writing K/V and decode attention go to the native
kernels where they are built (``native.py``), everything else to the PyTorch implementation, the
reference both are tested against. The Triton module is imported only when the first CUDA tensor
arrives, so CPU processes never import triton (and tests can set TRITON_INTERPRET=1 before it is).

Shapes: kv_cache is one layer's view of the block-major cache, [num_blocks, 2, block_size, Hkv, D]
(index 0 of dim 1 = key, 1 = value; slot s = block s // block_size, row s % block_size). Query heads
use kv head h // (Hq // Hkv), as HF's repeat_kv. K/V dtype must equal the query's.
"""

from types import ModuleType

from torch import Tensor

from pdserve.kernels import native, torch_attention

__all__ = ["decode_attention", "prefill_attention", "write_kv"]


def _backend(tensor: Tensor, has_native: bool = False) -> ModuleType:
    if tensor.is_cuda:
        from pdserve.kernels import triton_attention

        return triton_attention
    return native if has_native and native.available() else torch_attention


def write_kv(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write new keys/values [T, Hkv, D] into the cache at slot_mapping [T] (int64, < 0 = skip)."""
    _backend(kv_cache, has_native=True).write_kv(key, value, kv_cache, slot_mapping)


def prefill_attention(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    scale: float,
) -> Tensor:
    """Causal attention for a ragged batch of new tokens over cached prefix + themselves.

    query: [T, Hq, D], B sequences' new tokens concatenated; query_start_loc: [B + 1] int32
    cumulative; seq_lens: [B] int32 = cached prefix + new tokens (the new ones are the last q_len
    positions); block_tables: [B, max_blocks] int32. The caller has already written the new K/V
    with write_kv.
    Returns [T, Hq, D] in query's dtype.
    """
    return _backend(query).prefill_attention(
        query, kv_cache, block_tables, query_start_loc, seq_lens, scale
    )


def decode_attention(
    query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float
) -> Tensor:
    """One token per sequence: query [B, Hq, D] attends to its seq_lens[b] cached tokens.

    block_tables: [B, max_blocks] int32; seq_lens: [B] int32. Returns [B, Hq, D] in query's dtype.
    """
    return _backend(query, has_native=True).decode_attention(
        query, kv_cache, block_tables, seq_lens, scale
    )
