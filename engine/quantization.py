"""Weight-only int8 quantization (``--quantization int8``): llama.cpp's Q8_0, made the way its
reference quantizer makes it, so pdserve and llama.cpp serve the same weights.

Each row of a weight splits into blocks of ``Q8_BLOCK`` values; a block keeps one scale
``d = max|w| / 127`` (stored as a float16) and ``q = round(w / d)`` in int8 (rounding halves away
from zero, as C's ``roundf``). The weight served is ``d * q``, exactly representable in fp32, so
quantizing the dequantized weights of a Q8_0 GGUF gives back its blocks: serving a Q8_0 file with
``--quantization int8`` keeps llama.cpp's own values.
"""

import torch

Q8_BLOCK = 32  # kQ8Block in kernels/cpu/ops.h
Q8_MAX = 127


def quantizable(weight: torch.Tensor) -> bool:
    """Whether a linear's [out, in] weight splits into whole blocks."""
    return weight.dim() == 2 and weight.shape[1] % Q8_BLOCK == 0


def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [out, in] weight as (q: int8 [out, in], scales: fp32 [out, in / Q8_BLOCK]), the scales
    holding float16 values."""
    out, inner = weight.shape
    blocks = weight.detach().float().reshape(out, inner // Q8_BLOCK, Q8_BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / Q8_MAX
    inverse = torch.where(d == 0, 0.0, 1.0 / d)
    q = _roundf(blocks * inverse)
    scales = d.half().float()
    return q.to(torch.int8).reshape(out, inner), scales.reshape(out, -1).contiguous()


def dequantize_q8_0(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 weight [out, in] that (q, scales) stand for."""
    out, inner = q.shape
    blocks = q.float().reshape(out, inner // Q8_BLOCK, Q8_BLOCK) * scales.unsqueeze(-1)
    return blocks.reshape(out, inner)


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: to the nearest integer, halves away from zero. ``floor(|x| + 0.5)`` would
    round 0.49999997 up (the sum rounds to 1); the fraction doubled does not."""
    a = x.abs()
    whole = a.floor()
    return x.sign() * (whole + (2 * (a - whole)).floor())
