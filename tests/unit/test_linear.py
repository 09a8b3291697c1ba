"""Linear: oneDNN's packed product equals MKL's plain one; the loader packs where it helps."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.engine.linear import Linear, onednn_packing_helps
from pdserve.engine.loader import load_model

# Products of 256 terms in another summation order: a few ulps of outputs of magnitude ~16.
PACKED_ATOL = 1e-4


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_packed_product_equals_plain(bias: bool, rows: int) -> None:
    torch.manual_seed(rows)
    linear = Linear(256, 384, bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(384, 256))
        if bias:
            linear.bias.copy_(torch.randn(384))
    x = torch.randn(rows, 256)
    with torch.inference_mode():
        plain = linear(x)
        linear.pack(keep_weight=False)
        packed = linear(x)
    assert linear.weight is None and linear.packed_weight is not None
    assert packed.shape == (rows, 384)
    torch.testing.assert_close(packed, plain, rtol=0, atol=PACKED_ATOL)


def test_pack_keeps_a_tied_weight() -> None:
    linear = Linear(64, 32, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(32, 64))
    weight = linear.weight
    linear.pack(keep_weight=True)
    assert linear.weight is weight


def test_loader_packs_on_more_than_one_thread_only(
    tiny_model_dir: Path, torch_threads: Callable[[int], None]
) -> None:
    config = ModelConfig.from_pretrained(tiny_model_dir)
    cpu = torch.device("cpu")
    torch_threads(1)
    assert not onednn_packing_helps(torch.float32, cpu)
    plain = load_model(tiny_model_dir, config, torch.float32, cpu)
    assert all(m.packed_weight is None for m in plain.modules() if isinstance(m, Linear))
    torch_threads(2)
    assert onednn_packing_helps(torch.float32, cpu)
    assert not onednn_packing_helps(torch.bfloat16, cpu)
    packed = load_model(tiny_model_dir, config, torch.float32, cpu)
    linears = [m for m in packed.modules() if isinstance(m, Linear)]
    assert all(m.packed_weight is not None for m in linears)
    # The tiny preset ties its head: the embedding keeps the table, every other weight is freed.
    assert packed.lm_head.weight is packed.model.embed_tokens.weight
    assert all(m.weight is None for m in linears if m is not packed.lm_head)
