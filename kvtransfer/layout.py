"""What two caches must share for one's blocks to be copied byte for byte into the other."""

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pdserve.engine.config import EngineConfig, ModelConfig

if TYPE_CHECKING:  # handles.py carries layouts to the router, which imports no torch
    import torch

# The engine's block-major layout: [blocks, layers, K/V, block_size, kv_heads, head_dim].
BLOCK_MAJOR = "block-major:layers,kv,tokens,heads,dim"


@dataclass(frozen=True)
class KVLayout:
    """The compatibility key of a KV cache; peers whose keys differ are refused."""

    model: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    layout: str = BLOCK_MAJOR

    @classmethod
    def of(cls, model_name: str, model: ModelConfig, engine: EngineConfig) -> "KVLayout":
        return cls(
            model=model_name,
            dtype=engine.dtype,
            num_layers=model.num_hidden_layers,
            num_kv_heads=model.num_key_value_heads,
            head_dim=model.head_dim,
            block_size=engine.block_size,
        )

    def differences(self, other: "KVLayout") -> list[str]:
        """Each field that differs, as ``name: ours != theirs``; empty when compatible."""
        ours, theirs = asdict(self), asdict(other)
        return [f"{k}: {ours[k]!r} != {theirs[k]!r}" for k in ours if ours[k] != theirs[k]]

    def check_cache(self, kv_cache: "torch.Tensor") -> None:
        """Raises ValueError unless the tensor is a contiguous cache of this layout."""
        expected = (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)
        if tuple(kv_cache.shape[1:]) != expected or str(kv_cache.dtype) != f"torch.{self.dtype}":
            raise ValueError(
                f"KV cache {tuple(kv_cache.shape)} {kv_cache.dtype} does not match the layout "
                f"[blocks, *{expected}] {self.dtype}"
            )
        if not kv_cache.is_contiguous():
            raise ValueError("the KV cache must be contiguous: one region per block")
