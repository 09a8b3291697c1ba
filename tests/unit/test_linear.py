"""Linear: oneDNN's packed product equals MKL's plain one; the loader packs where it helps; bf16
without the CPU's bf16 instructions is a warning at load."""

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.linear import Linear, native_bf16_products, onednn_packing_helps
from pdserve.engine.llm_engine import LLMEngine
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


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_bf16_instructions_is_a_warning(
    native: bool,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The answer this CPU would give is the one under test: both are made here.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    assert native_bf16_products(torch.device("cpu")) is native
    assert native_bf16_products(torch.device("cuda"))
    with caplog.at_level(logging.WARNING, logger="pdserve.engine.llm_engine"):
        LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="bfloat16", num_kv_blocks=16))
        LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32", num_kv_blocks=16))
    warned = [r for r in caplog.records if "without bf16 instructions" in r.getMessage()]
    assert len(warned) == (0 if native else 1)
