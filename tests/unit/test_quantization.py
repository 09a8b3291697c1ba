"""Q8_0 quantization: the same blocks as gguf's (llama.cpp's reference quantizer, bit for bit),
given back by quantizing their dequantized values; the engine's knob refuses what it cannot
serve."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from pdserve.engine.config import EngineConfig
from pdserve.engine.quantization import Q8_BLOCK, dequantize_q8_0, quantizable, quantize_q8_0


def _weight(out: int, inner: int) -> torch.Tensor:
    torch.manual_seed(out)
    weight = torch.randn(out, inner) * 0.05
    weight[0, :Q8_BLOCK] = 0  # a block of zeros: scale 0
    # Exact halves of the step (round away from zero) and values a hair under them.
    weight[1, :Q8_BLOCK] = torch.arange(Q8_BLOCK) - 15.5
    weight[1, 0] = -127.0
    weight[2, :Q8_BLOCK] = torch.full((Q8_BLOCK,), 0.49999997)
    weight[2, 0] = 127.0
    return weight


def _gguf_blocks(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """gguf's Q8_0 of the weight, split into (q [out, in], scales [out, in / 32])."""
    out = weight.shape[0]
    raw = quantize(weight.numpy(), GGMLQuantizationType.Q8_0).reshape(out, -1, 2 + Q8_BLOCK)
    scales = raw[..., :2].copy().view(np.float16).astype(np.float32)[..., 0]
    q = raw[..., 2:].copy().view(np.int8).reshape(out, -1)
    return q, scales


@pytest.mark.parametrize(("out", "inner"), [(3, 32), (96, 576), (17, 1536)])
def test_blocks_equal_ggufs_reference_quantizer(out: int, inner: int) -> None:
    weight = _weight(out, inner)
    q, scales = quantize_q8_0(weight)
    expected_q, expected_scales = _gguf_blocks(weight)
    assert q.dtype == torch.int8 and q.shape == (out, inner)
    assert scales.shape == (out, inner // Q8_BLOCK)
    assert np.array_equal(q.numpy(), expected_q)
    assert np.array_equal(scales.numpy(), expected_scales)
    assert scales[0, 0] == 0 and q[0, :Q8_BLOCK].abs().sum() == 0


def test_quantizing_the_dequantized_weight_gives_the_blocks_back() -> None:
    q, scales = quantize_q8_0(_weight(64, 576))
    weight = dequantize_q8_0(q, scales)
    again_q, again_scales = quantize_q8_0(weight)
    assert torch.equal(again_q, q) and torch.equal(again_scales, scales)
    # d * q is exact in fp32: the dequantized weight is what the blocks stand for, not near it.
    assert torch.equal(weight.double(), q.double() * scales.double().repeat_interleave(32, 1))


def test_only_rows_of_whole_blocks_quantize() -> None:
    assert quantizable(torch.empty(8, 64))
    assert not quantizable(torch.empty(8, 70))
    assert not quantizable(torch.empty(64))


def test_engine_config_refuses_what_int8_cannot_serve() -> None:
    assert EngineConfig(model="m", quantization="int8").quantization == "int8"
    with pytest.raises(ValueError, match="quantization must be one of int8"):
        EngineConfig(model="m", quantization="int4")
    with pytest.raises(ValueError, match="on the CPU in float32"):
        EngineConfig(model="m", quantization="int8", dtype="bfloat16")
    with pytest.raises(ValueError, match="on the CPU in float32"):
        EngineConfig(model="m", quantization="int8", device="cuda")
