"""Rotary position embeddings, including HF's ``linear`` and ``llama3`` frequency scaling."""

import math
from typing import NamedTuple

import torch

from pdserve.engine.config import ModelConfig, RopeScaling
from pdserve.kernels import native


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Per-pair rotation frequencies, [head_dim // 2] float32, as transformers computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, and the band between interpolated.
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Holds cos/sin for every position up to the model's limit.

    A plain object rather than a module with buffers: the tables are computed, not loaded, and
    nothing the loader does to the weights applies to them.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        with torch.device("cpu"):  # whatever device the loader builds the model under
            inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
            positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
            freqs = torch.outer(positions, inv_freq)  # [max_pos, head_dim // 2]
        # Computed in fp32 and cast once, as transformers does before applying them. Both halves
        # of a head use the same angles; the sine's first half is negated for rotate_half.
        cos, sin = freqs.cos(), freqs.sin()
        self.cos = torch.cat((cos, cos), dim=-1).to(device=device, dtype=dtype)
        self.sin = torch.cat((-sin, sin), dim=-1).to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> "RopeTables":
        """cos/sin for a step's positions [T]; looked up once per step, shared by every layer."""
        return RopeTables(self.cos[positions], self.sin[positions])


class RopeTables(NamedTuple):
    cos: torch.Tensor  # [T, D]: cos of each pair's angle, in both halves
    sin: torch.Tensor  # [T, D]: -sin in the first half, sin in the second

    def rotate(self, heads: torch.Tensor, count: int) -> torch.Tensor:
        """The first ``count`` heads of heads [T, H, D] (queries and keys together) rotated,
        non-interleaved halves as HF's rotate_half: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1
        sin], rounded as HF rounds it. In fp32 on the CPU the native op rotates them in place."""
        if native.serves(heads):
            native.rope_(heads, self.cos, self.sin, count)
            return heads[:, :count]
        x = heads[:, :count]
        # Rolling by half a head swaps the halves: [x2, x1].
        return x * self.cos.unsqueeze(1) + x.roll(x.shape[-1] // 2, dims=-1) * self.sin.unsqueeze(1)
