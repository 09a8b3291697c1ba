"""The native layer ops (kernels/cpu/layer_ops.cpp) against the PyTorch code they replace in
engine/, and the one native call for every layer of a few decodes (decode_layers.cpp) against
the layers' Python."""

from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.nn import functional as F

from pdserve.engine.llm import LLM
from pdserve.engine.model import RMSNorm
from pdserve.engine.rope import RopeTables
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kernels import native

# One ulp or so of values of magnitude ~1-10: a reduction in another order, another exp.
ATOL = 1e-5


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_add_rms_norm_equals_add_then_norm(native_ops: ModuleType, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    residual, x = torch.randn(2, rows, 576, generator=g).unbind(0)
    norm = RMSNorm(576, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(576, generator=g) + 0.5)
    total = residual + x
    expected = F.rms_norm(total, (576,), norm.weight, 1e-5)
    with torch.inference_mode():
        out = native_ops.add_rms_norm_(residual, x, norm.weight, 1e-5)
    assert torch.equal(residual, total)  # the residual stream moved on, in place
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("rows", [3, 40])
def test_silu_and_mul_equals_torch(native_ops: ModuleType, rows: int) -> None:
    # Gates far out on both sides too, where exp over- or underflows.
    gate_up = torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(0)) * 4
    gate_up[0, :4] = torch.tensor([-200.0, -90.0, 90.0, 200.0])
    gate, up = gate_up.chunk(2, dim=-1)
    out = native_ops.silu_and_mul(gate_up)
    torch.testing.assert_close(out, F.silu(gate) * up, atol=ATOL, rtol=0)


@pytest.mark.parametrize("tokens", [4, 40])  # on the calling thread, and shared among threads
def test_rope_in_place_rounds_as_transformers(native_ops: ModuleType, tokens: int) -> None:
    # 9 query + 3 key heads rotated, 3 value heads left alone, as in SmolLM2's fused qkv output.
    g = torch.Generator().manual_seed(0)
    heads = torch.randn(tokens, 15, 64, generator=g)
    angles = torch.rand(tokens, 32, generator=g) * 100
    cos, sin = angles.cos(), angles.sin()
    tables = RopeTables(torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1))
    with native.disabled():
        expected = tables.rotate(heads, 12)  # the PyTorch path, HF's formula
    values = heads[:, 12:].clone()
    rotated = tables.rotate(heads, 12)
    assert rotated.data_ptr() == heads.data_ptr()  # in place, in the fused output
    assert torch.equal(rotated, expected)  # bitwise: no fused multiply-add
    assert torch.equal(heads[:, 12:], values)


# fp32 weights take the native call up to 16 decodes, int8 ones at any batch.
@pytest.mark.parametrize(
    ("quantization", "batch"), [(None, 1), (None, 3), (None, 16), ("int8", 1), ("int8", 24)]
)
def test_native_decode_layers_equal_the_python_layers(
    native_ops: ModuleType,
    tiny_model_dir: Path,
    quantization: str | None,
    batch: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One decode step run twice on the same cache (writing K/V again writes the same values):
    # through the one native call, then through the layers' Python with the same native ops (whose
    # products past 4 rows are oneDNN's otherwise); the same ops, the same bits.
    monkeypatch.setattr(native, "SMALL_LINEAR_MAX_ROWS", native.NATIVE_DECODE_MAX_ROWS)
    engine = LLM(model=tiny_model_dir, quantization=quantization).engine
    params = SamplingParams(temperature=0.0, max_tokens=4)
    for i in range(batch):
        engine.add_request(f"r{i}", list(range(10 + i, 40 + 2 * i)), params)
    engine.step()  # the prefills
    step = engine.scheduler.schedule()
    model = engine.runner.model.model
    calls = []
    native_decode = model._native_decode
    monkeypatch.setattr(
        model, "_native_decode", lambda *a: calls.append(native_decode(*a)) or calls[-1]
    )
    _, fused = engine.runner.execute(step)
    monkeypatch.setattr(model, "_native_decode", lambda *a: False)
    _, layered = engine.runner.execute(step)
    assert calls == [True]
    assert torch.equal(fused, layered)
    for i in range(batch):
        engine.abort_request(f"r{i}")
