"""The paged KV cache tensor: block-major, one contiguous region per block across all layers."""

import torch

from pdserve.engine.config import EngineConfig, ModelConfig


def kv_block_bytes(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block: K and V for every layer, so one block is one transfer descriptor."""
    elems = model.num_hidden_layers * 2 * block_size * model.num_key_value_heads * model.head_dim
    return elems * dtype.itemsize


def num_kv_blocks(model: ModelConfig, engine: EngineConfig) -> int:
    if engine.num_kv_blocks is not None:
        return engine.num_kv_blocks
    blocks = engine.kv_cache_memory_bytes // kv_block_bytes(
        model, engine.block_size, engine.torch_dtype
    )
    if blocks < 1:
        raise ValueError(
            f"kv_cache_memory_bytes={engine.kv_cache_memory_bytes} holds no block of "
            f"{kv_block_bytes(model, engine.block_size, engine.torch_dtype)} bytes"
        )
    return blocks


def allocate_kv_cache(model: ModelConfig, engine: EngineConfig, num_blocks: int) -> torch.Tensor:
    """[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim], zero-filled."""
    shape = (
        num_blocks,
        model.num_hidden_layers,
        2,
        engine.block_size,
        model.num_key_value_heads,
        model.head_dim,
    )
    return torch.zeros(shape, dtype=engine.torch_dtype, device=engine.device)
