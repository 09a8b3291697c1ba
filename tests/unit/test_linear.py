"""Linear: oneDNN's packed product and the native one (fp32, and int8 Q8_0 weights) equal MKL's;
each serves its row counts (int8's many rows dequantized, from where the loader timed that way
faster); the loader packs fp32 weights or quantizes them all; bf16 without the CPU's bf16
instructions is a warning at load."""

import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pdserve.engine import linear as linear_module
from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.linear import (
    Linear,
    choose_q8_dequantize_rows,
    native_bf16_products,
    onednn_packing_helps,
)
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.loader import load_model
from pdserve.engine.quantization import dequantize_q8_0, quantize_q8_0
from pdserve.kernels import native

# Products of 256 terms in another summation order: a few ulps of outputs of magnitude ~16.
PACKED_ATOL = 1e-4


def _linear(in_features: int, out_features: int, bias: bool, seed: int) -> Linear:
    torch.manual_seed(seed)
    linear = Linear(in_features, out_features, bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features))
        if bias:
            linear.bias.copy_(torch.randn(out_features))
    return linear


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_packed_product_equals_plain(bias: bool, rows: int) -> None:
    linear = _linear(256, 384, bias, seed=rows)
    x = torch.randn(rows, 256)
    with native.disabled(), torch.inference_mode():
        plain = linear(x)
        linear.pack()
        packed = linear(x)
    assert linear.packed_weight is not None
    assert packed.shape == (rows, 384)
    torch.testing.assert_close(packed, plain, rtol=0, atol=PACKED_ATOL)


# Sizes off the kernel's tiles: row counts between its 4-row groups (one chunk of W for a few, its
# rows kept in cache for several), a last chunk of 1 row, an `in` that is not a multiple of 16.
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9, 64])
@pytest.mark.parametrize(("in_features", "out_features"), [(256, 384), (70, 513)])
def test_native_product_equals_mkl(
    native_ops: ModuleType, bias: bool, rows: int, in_features: int, out_features: int
) -> None:
    linear = _linear(in_features, out_features, bias, seed=rows)
    x = torch.randn(rows, in_features)
    with torch.inference_mode():
        out = native_ops.linear(x, linear.weight, None, linear.bias)
        expected = torch.nn.functional.linear(x, linear.weight, linear.bias)
    torch.testing.assert_close(out, expected, rtol=0, atol=PACKED_ATOL)


@pytest.fixture(params=[True, False], ids=["rows-alone", "rows-side-by-side"])
def f32_rows_alone(native_ops: ModuleType, request: pytest.FixtureRequest) -> Iterator[bool]:
    """Each way one group of x's rows reads fp32 W, for one test; the process's way after it."""
    before = native_ops.set_f32_rows_alone(request.param)
    yield request.param
    native_ops.set_f32_rows_alone(before)


# A decode step's rows as the engine batches them: alone, in one group of x's rows (fp32 W read a
# row at a time or rows side by side, as this CPU reads faster), in several (W's rows side by
# side). Greedy output must depend neither on the batch nor on the CPU's way.
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("rows", [2, 4, 5, 8, 9, 16])
def test_a_native_product_row_has_the_same_bits_in_any_batch(
    native_ops: ModuleType, f32_rows_alone: bool, quantized: bool, rows: int
) -> None:
    linear = _linear(576, 960, bias=False, seed=rows)
    assert not quantized or linear.quantize()
    scales = linear.scales if quantized else None
    x = torch.randn(rows, 576)
    with torch.inference_mode():
        batched = native_ops.linear(x, linear.weight, scales, None)
        native_ops.set_f32_rows_alone(not f32_rows_alone)  # the rows alone read the other way
        for row in range(rows):
            alone = native_ops.linear(x[row : row + 1], linear.weight, scales, None)
            assert torch.equal(alone[0], batched[row]), row


@pytest.mark.parametrize("faster_alone", [True, False])
def test_w_is_read_the_way_a_pass_over_the_weights_timed_faster(
    native_ops: ModuleType, f32_rows_alone: bool, faster_alone: bool, monkeypatch
) -> None:
    """The choice follows the timings (a clock on which the slower way's pass takes 3x as long),
    and the process reads W that way after it."""
    mode, now, real_set = {"alone": f32_rows_alone}, [0.0], native_ops.set_f32_rows_alone

    def set_mode(alone: bool) -> bool:
        mode["alone"] = alone
        return real_set(alone)

    def clock() -> float:
        now[0] += 1.0 if mode["alone"] == faster_alone else 3.0
        return now[0]

    monkeypatch.setattr(native_ops, "set_f32_rows_alone", set_mode)
    monkeypatch.setattr(native_ops.time, "perf_counter", clock)
    weights = [torch.randn(64, 32), torch.randn(16, 48)]
    assert native_ops.choose_f32_row_reads(weights) is faster_alone
    assert real_set(f32_rows_alone) is faster_alone


def test_the_loader_times_both_ways_over_the_model_s_fp32_linears(
    native_ops: ModuleType, f32_rows_alone: bool, tiny_model_dir: Path, caplog
) -> None:
    config = ModelConfig.from_pretrained(tiny_model_dir)
    with caplog.at_level(logging.INFO, logger=native_ops.__name__):
        model = load_model(tiny_model_dir, config, torch.float32, torch.device("cpu"))
    assert len(model.fp32_linear_weights()) == 4 * config.num_hidden_layers + 1  # + LM head
    (line,) = [r.getMessage() for r in caplog.records if "products of one row" in r.getMessage()]
    assert "a row at a time" in line and "side by side" in line, line


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 9, 64])
@pytest.mark.parametrize(("in_features", "out_features"), [(256, 384), (96, 513)])
def test_native_int8_product_equals_mkl_over_the_dequantized_weight(
    native_ops: ModuleType, bias: bool, rows: int, in_features: int, out_features: int
) -> None:
    linear = _linear(in_features, out_features, bias, seed=rows)
    assert linear.quantize()
    assert linear.weight.dtype == torch.int8 and linear.quantized
    x = torch.randn(rows, in_features)
    dequantized = dequantize_q8_0(linear.weight, linear.scales)
    with torch.inference_mode():
        out = linear(x)
        expected = torch.nn.functional.linear(x, dequantized, linear.bias)
        with native.disabled():  # the PyTorch path: the same weight, dequantized per call
            fallback = linear(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=PACKED_ATOL)
    assert torch.equal(fallback, expected)


@pytest.mark.parametrize("rows", [7, 8, 40])
def test_int8_products_of_many_rows_run_over_the_weight_dequantized(
    native_ops: ModuleType, rows: int
) -> None:
    linear = _linear(256, 384, bias=True, seed=rows)
    assert linear.quantize()
    linear.dequantize_from_rows = 8
    x = torch.randn(rows, 256)
    dequantized = dequantize_q8_0(linear.weight, linear.scales)
    with torch.inference_mode():
        out = linear(x)
        mkl = torch.nn.functional.linear(x, dequantized, linear.bias)
        kernel = native_ops.linear(x, linear.weight, linear.scales, linear.bias)
    assert torch.equal(out, mkl if rows >= 8 else kernel)


@pytest.mark.parametrize("faster_from", [256, 1024, None])
def test_int8_products_dequantize_from_the_fewest_rows_timed_faster(
    native_ops: ModuleType, faster_from: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The choice follows the timings: a clock on which a product takes 3x as long the slower
    way, the dequantized way faster from ``faster_from`` rows on."""
    last, now = {}, [0.0]
    real_native, real_mkl = native_ops.linear, torch.nn.functional.linear

    def run_native(x: torch.Tensor, *args: object) -> torch.Tensor:
        last.update(dequantized=False, rows=x.shape[0])
        return real_native(x, *args)

    def run_mkl(x: torch.Tensor, *args: object) -> torch.Tensor:
        last.update(dequantized=True, rows=x.shape[0])
        return real_mkl(x, *args)

    def clock() -> float:
        if last:
            faster = faster_from is not None and last["rows"] >= faster_from
            now[0] += 1.0 if last["dequantized"] == faster else 3.0
        return now[0]

    monkeypatch.setattr(native_ops, "linear", run_native)
    monkeypatch.setattr(linear_module.F, "linear", run_mkl)
    monkeypatch.setattr(native_ops.time, "perf_counter", clock)
    linears = [_linear(64, 32, bias=False, seed=0), _linear(96, 48, bias=False, seed=1)]
    assert all(linear.quantize() for linear in linears)
    assert choose_q8_dequantize_rows(linears) == faster_from


def test_the_loader_times_int8_products_and_sets_every_linear(
    native_ops: ModuleType, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ModelConfig.from_pretrained(tiny_model_dir)
    with caplog.at_level(logging.INFO, logger=linear_module.__name__):
        model = load_model(tiny_model_dir, config, torch.float32, torch.device("cpu"), "int8")
    (line,) = [r.getMessage() for r in caplog.records if "int8 products of" in r.getMessage()]
    chosen = {m.dequantize_from_rows for m in model.modules() if isinstance(m, Linear)}
    assert len(chosen) == 1 and ("no rows" in line) == (chosen == {None}), (line, chosen)


def test_a_weight_of_partial_blocks_stays_fp32() -> None:
    linear = _linear(70, 8, bias=False, seed=0)
    weight = linear.weight.detach().clone()
    assert not linear.quantize()
    assert not linear.quantized and torch.equal(linear.weight, weight)


@pytest.mark.parametrize("rows", [1, 4, 5])
def test_few_rows_read_the_plain_weight_more_the_packed_one(
    native_ops: ModuleType, rows: int
) -> None:
    # The plain weight is zeroed after packing, to see which serves: up to 4 rows the native
    # kernel over the plain weight, more rows oneDNN over the packed copy.
    linear = _linear(64, 96, bias=False, seed=0)
    linear.pack()
    with torch.no_grad():
        linear.weight.zero_()
    with torch.inference_mode():
        out = linear(torch.randn(rows, 64))
    few = rows <= native_ops.SMALL_LINEAR_MAX_ROWS
    assert out.abs().sum() == 0 if few else out.abs().sum() > 0


def test_loader_quantizes_every_linear_and_packs_none(tiny_model_dir: Path) -> None:
    config = ModelConfig.from_pretrained(tiny_model_dir)
    model = load_model(tiny_model_dir, config, torch.float32, torch.device("cpu"), "int8")
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.quantized and m.packed_weight is None for m in linears)
    assert all(m.weight.dtype == torch.int8 for m in linears)
    # The head is tied to the embedding: the table stays fp32 for the lookups.
    assert model.model.embed_tokens.weight.dtype == torch.float32
    expected = quantize_q8_0(model.model.embed_tokens.weight)
    assert torch.equal(model.lm_head.weight, expected[0])
    assert torch.equal(model.lm_head.scales, expected[1])


def test_loader_packs_fp32_weights_and_keeps_the_plain_ones(tiny_model_dir: Path) -> None:
    config = ModelConfig.from_pretrained(tiny_model_dir)
    cpu = torch.device("cpu")
    assert onednn_packing_helps(torch.float32, cpu)
    assert not onednn_packing_helps(torch.bfloat16, cpu)
    packed = load_model(tiny_model_dir, config, torch.float32, cpu)
    linears = [m for m in packed.modules() if isinstance(m, Linear)]
    assert all(m.packed_weight is not None and m.weight is not None for m in linears)
    # The tiny preset ties its head: its plain weight is the embedding table itself.
    assert packed.lm_head.weight is packed.model.embed_tokens.weight
    plain = load_model(tiny_model_dir, config, torch.bfloat16, cpu)
    assert all(m.packed_weight is None for m in plain.modules() if isinstance(m, Linear))


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
