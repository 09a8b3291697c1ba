"""A linear layer for CPU decoding: a native kernel for a few rows, oneDNN over a packed weight
for more; or int8 weights (``--quantization int8``) in the native kernel, and for a prompt's many
rows, where this CPU runs them faster so, MKL's product over the weight dequantized."""

import functools
import logging
import os

import torch
from torch import nn
from torch.nn import functional as F

from pdserve.engine.quantization import dequantize_q8_0, quantizable, quantize_q8_0
from pdserve.kernels import native

logger = logging.getLogger(__name__)

# oneDNN makes a primitive for each shape of product it runs, one per row count a step brings
# for each shape of weight, and keeps them in two caches (oneDNN's and torch's ideep's) of 1,024
# entries each by default, ~0.3 MiB an entry: a server whose steps bring ever new row counts
# grew by hundreds of MiB before they filled. Bounded, they keep recent steps' row counts;
# a miss costs ~1 ms a shape (docs/benchmarks.md, "Measurements behind the code's choices").
ONEDNN_CACHE_ENTRIES = 64
ONEDNN_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches() -> None:
    """Bounds both caches to ``ONEDNN_CACHE_ENTRIES``, unless the environment sets them: each
    reads its setting once, at its first use, so this runs before the first product."""
    for name in ONEDNN_CACHE_ENV:
        os.environ.setdefault(name, str(ONEDNN_CACHE_ENTRIES))


def onednn_packing_helps(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``Linear.pack`` should be used: fp32 on a CPU with oneDNN, where packed weights
    make products of more rows than ``SMALL_LINEAR_MAX_ROWS`` faster than MKL's over the plain
    [out, in] weight (docs/benchmarks.md, "Measurements behind the code's choices")."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def native_bf16_products(device: torch.device) -> bool:
    """Whether bf16 products run on the hardware's own bf16 instructions: on a CPU, oneDNN's with
    AVX512-BF16 or AMX. Without them torch runs them in reference kernels, many times slower than
    fp32 (docs/benchmarks.md, "The real model")."""
    return device.type != "cpu" or torch.ops.mkldnn._is_mkldnn_bf16_supported()


# The row counts of a prompt step at which int8 products are timed both ways at load, smallest
# first (choose_q8_dequantize_rows), and the rows of each W timed (its first ones: the speed of a
# product per row of W is what is compared, and a large model's whole layer would take seconds).
Q8_TIMED_ROWS = (256, 1024)
Q8_TIMED_W_ROWS = 512


class Linear(nn.Module):
    """``y = x W^T + b`` like ``nn.Linear``, with W in its [out, in] layout, and on the CPU:

    - a few rows (a decode step of up to ``SMALL_LINEAR_MAX_ROWS`` sequences) go to the native
      kernel (``kernels/cpu/linear.cpp``), which streams W's rows in chunks the threads take as
      they free up: as fast as MKL's matrix-vector product at one row, and a preempted thread
      (the server's other processes share the cores) delays one chunk instead of half of every
      product (a step of decodes only runs it to 16 rows, in one native call: engine/model.py);
    - more rows (prompts, steps that mix decodes with prompts) go to oneDNN over the weight
      ``pack`` copied into its blocked layout after loading (what inductor does), faster than
      MKL. The plain weight stays for the native products (and an embedding tied to it): the
      memory of a second copy buys the decode step its speed.

    Or, after ``quantize``, W as llama.cpp's Q8_0 blocks (``engine/quantization.py``), its fp32
    copy dropped: in the native kernel, and from ``dequantize_from_rows`` rows on (a prompt's
    hundreds, where the kernel is bound by arithmetic and MKL's blocking beats it on some CPUs:
    ``choose_q8_dequantize_rows``) in MKL's product over W dequantized for the call.

    The figures behind each choice: docs/benchmarks.md, "Measurements behind the code's choices".
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        bound_onednn_caches()  # before its first product
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed_weight: torch.Tensor | None = None  # oneDNN's opaque layout, once packed
        self.scales: torch.Tensor | None = None  # once quantized: the weight is int8 beside them
        self.dequantize_from_rows: int | None = None  # int8 products of this many rows or more

    def pack(self) -> None:
        """Copies the weight into oneDNN's packed layout, for products of many rows."""
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    def quantize(self) -> bool:
        """Replaces the weight by its Q8_0 values (int8, [out, in]) and keeps their scales;
        whether it could (rows of whole blocks). An embedding tied to the weight keeps it."""
        if not quantizable(self.weight):
            return False
        q, self.scales = quantize_q8_0(self.weight)
        self.weight = nn.Parameter(q, requires_grad=False)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        if self.quantized:
            many = self.dequantize_from_rows is not None and x.shape[0] >= self.dequantize_from_rows
            if native.serves(x) and not many:
                return native.linear(x, self.weight, self.scales, self.bias)
            return F.linear(x, dequantize_q8_0(self.weight, self.scales).to(x.dtype), self.bias)
        if x.shape[0] <= native.SMALL_LINEAR_MAX_ROWS and native.serves(x):
            return native.linear(x, self.weight, None, self.bias)
        if self.packed_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(
                x, self.packed_weight, self.bias, "none", [], ""
            )
        return F.linear(x, self.weight, self.bias)


def quantized_linears(module: nn.Module) -> list[Linear]:
    """The linears in ``module`` whose weights are int8 (``Linear.quantize``)."""
    return [m for m in module.modules() if isinstance(m, Linear) and m.quantized]


def choose_q8_dequantize_rows(linears: list[Linear], rounds: int = 3) -> int | None:
    """Times int8 products over ``linears`` (a layer's quantized ones: their first
    ``Q8_TIMED_W_ROWS`` rows of W) at each of ``Q8_TIMED_ROWS`` rows, in the native kernel and as
    MKL's product over W dequantized, in ``rounds`` alternating rounds. Returns the fewest rows at
    which the dequantized product was faster, or None where the kernel was faster at every count:
    from there on, ``Linear.dequantize_from_rows``."""
    weights = [(ln.weight[:Q8_TIMED_W_ROWS], ln.scales[:Q8_TIMED_W_ROWS]) for ln in linears]

    def one_pass(xs: dict[int, torch.Tensor], way: str) -> None:
        for q, scales in weights:
            if way == "dequantized":
                F.linear(xs[q.shape[1]], dequantize_q8_0(q, scales))
            else:
                native.linear(xs[q.shape[1]], q, scales, None)

    chosen, seen = None, []
    for rows in Q8_TIMED_ROWS:
        xs = {q.shape[1]: torch.zeros(rows, q.shape[1]) for q, _ in weights}
        ways = {way: functools.partial(one_pass, xs, way) for way in ("native", "dequantized")}
        best = native.best_times(ways, rounds)
        seen.append(f"{rows} rows {best['native'] * 1e3:.1f} / {best['dequantized'] * 1e3:.1f} ms")
        if best["dequantized"] < best["native"]:
            chosen = rows
            break
    logger.info(
        "int8 products of %s rows run over W dequantized (native kernel / dequantized: %s)",
        "no" if chosen is None else f"{chosen} or more",
        ", ".join(seen),
    )
    return chosen
