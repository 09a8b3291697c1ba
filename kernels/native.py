"""The native CPU kernels (``kernels/cpu/*.cpp``): built once by the set-up step, loaded if built.

``pdserve build-kernels`` (``make setup`` runs it) compiles them through torch's extension tools
for the instruction set this CPU has, as torch names it (``torch.backends.cpu.
get_cpu_capability()``: AVX512, AVX2, ...), into a folder of that name. A process loads the build
for its own CPU, or none: without a compiler, a build, or on another CPU, the PyTorch ops
(``torch_attention.py``) serve, and ``PDSERVE_NATIVE_KERNELS=0`` chooses them. Nothing is
compiled at run time.
"""

import contextlib
import functools
import logging
import math
import os
import platform
import shutil
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCES = [
    Path(__file__).parent / "cpu" / name
    for name in ("paged_attention.cpp", "linear.cpp", "layer_ops.cpp", "decode_layers.cpp")
]
DISABLE_ENV = "PDSERVE_NATIVE_KERNELS"
NAME = "pdserve_cpu_kernels"
# -march levels by torch's CPU capability: the instructions the compiler may use.
ARCH_FLAGS = {"AVX512": ["-march=x86-64-v4"], "AVX2": ["-march=x86-64-v3"]}
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast"]


def cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def cpu_name() -> str:
    """The CPU's model name, as benchmarks print it beside their figures."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_cpu() -> str:
    """The CPU and the kernels that serve on it, for a benchmark's header."""
    kernels = "native" if available() else "PyTorch"
    return f"{cpu_name()}, {cpu_capability()}, {kernels} CPU kernels"


def build_dir(capability: str) -> Path:
    """Where the build for ``capability`` lives: beside the sources, one per torch version."""
    return Path(__file__).parent / "cpu" / "build" / f"{capability}-torch{torch.__version__}"


def library_path(capability: str) -> Path:
    return build_dir(capability) / f"{NAME}.so"


class NoCompiler(RuntimeError):
    """There is no C++ compiler: the PyTorch kernels serve (not an error of the build)."""


def build() -> Path:
    """Compiles the kernels for this CPU; the library's path. Raises ``NoCompiler`` if there is
    no compiler, and torch's error if the sources do not compile."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise NoCompiler(f"no C++ compiler ({compiler}): the PyTorch kernels will serve")
    capability = cpu_capability()
    folder = build_dir(capability)
    folder.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=NAME,
        sources=[str(source) for source in SOURCES],
        extra_cflags=CFLAGS + ARCH_FLAGS.get(capability, []),
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        is_python_module=False,
        verbose=False,
    )
    return library_path(capability)


@functools.cache
def load() -> bool:
    """Loads the build for this CPU into the process, once; whether it is loaded."""
    path = library_path(cpu_capability())
    if not path.exists():
        logger.info("no native CPU kernels at %s: `pdserve build-kernels` builds them", path)
        return False
    torch.ops.load_library(str(path))
    return True


_enabled = os.environ.get(DISABLE_ENV, "1") != "0"


def available() -> bool:
    """Whether the native kernels serve in this process (loading them on the first call)."""
    return _enabled and load()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The PyTorch kernels serve within: a benchmark's baseline in the same process."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def write_kv(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """``torch_attention.write_kv`` in one pass (slot_mapping: int64, < 0 = skip)."""
    dtype = kv_cache.dtype
    torch.ops.pdserve.write_kv(key.to(dtype), value.to(dtype), kv_cache, slot_mapping)


# Rows of x up to which a product of fp32 weights is native in the layers' Python
# (engine/linear.py): more go to oneDNN, as a prompt's do, so that a prompt's last rows recomputed
# past a cached prefix round as they did in the whole prompt.
SMALL_LINEAR_MAX_ROWS = 4
# Decodes up to which a step of fp32 weights runs every layer in one native call (engine/model.py):
# its products as fast as oneDNN's to 16 rows, without the Python between ops.
NATIVE_DECODE_MAX_ROWS = 16


def serves(x: torch.Tensor) -> bool:
    """Whether the native layer ops (``linear``, ``add_rms_norm_``, ``silu_and_mul``, ``rope_``)
    take ``x``: fp32 on the CPU, with the kernels built."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and available()


def linear(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, W, bias)``, W a contiguous [out, in]: ``weight`` in fp32, or int8 Q8_0
    values with their ``scales`` [out, in / 32] (``engine/quantization.py``)."""
    return torch.ops.pdserve.linear(x, weight, scales, bias)


def set_f32_rows_alone(alone: bool) -> bool:
    """Whether this process's few-row fp32 products read W a row at a time from now on (else
    several rows side by side: linear.cpp); returns the setting it replaces."""
    return torch.ops.pdserve.set_f32_rows_alone(alone)


def best_times(ways: dict[Hashable, Callable[[], object]], rounds: int) -> dict[Hashable, float]:
    """Each way's best time in seconds over ``rounds`` runs of every way, their order reversed
    every other round, so that no way always runs right after the same one (a CPU's caches and
    clock carry over from one to the next). How the loader chooses between kernels."""
    best = dict.fromkeys(ways, math.inf)
    for round_ in range(rounds):
        for way in ways if round_ % 2 == 0 else reversed(ways):
            start = time.perf_counter()
            ways[way]()
            best[way] = min(best[way], time.perf_counter() - start)
    return best


def choose_f32_row_reads(weights: list[torch.Tensor], rounds: int = 3) -> bool:
    """Times a one-row product over each of ``weights`` (a model's fp32 linears, [out, in]) with
    W's rows read one at a time and side by side, in ``rounds`` alternating rounds, and has the
    faster serve this process's few-row products (which CPU reads which way faster: linear.cpp).
    Both give the same bits. Returns whether W's rows are read one at a time."""
    rows = {w.shape[1]: torch.zeros(1, w.shape[1]) for w in weights}

    def one_pass(alone: bool) -> None:
        set_f32_rows_alone(alone)
        for w in weights:
            torch.ops.pdserve.linear(rows[w.shape[1]], w, None, None)

    ways = {alone: functools.partial(one_pass, alone) for alone in (True, False)}
    best = best_times(ways, rounds)
    alone = best[True] <= best[False]
    set_f32_rows_alone(alone)
    names = {True: "a row at a time", False: "rows side by side"}
    logger.info(
        "fp32 products of one row read W %s: %.1f ms a pass over the weights (%s: %.1f ms)",
        names[alone],
        best[alone] * 1e3,
        names[not alone],
        best[not alone] * 1e3,
    )
    return alone


def add_rms_norm_(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """``residual += x``, then returns the RMSNorm of ``residual`` times ``weight``."""
    return torch.ops.pdserve.add_rms_norm_(residual, x, weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` over [T, 2I] holding gate then up: [T, I]."""
    return torch.ops.pdserve.silu_and_mul(gate_up)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> None:
    """Rotates the first ``heads`` heads of x [T, H, D] in place (``rope.RopeTables``)."""
    torch.ops.pdserve.rope_(x, cos, sin, heads)


def decode_layers(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    scales: list[torch.Tensor],
    qkv_biases: list[torch.Tensor],
    kv_cache: torch.Tensor,
    attention: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    rope: tuple[torch.Tensor, torch.Tensor],
    heads: tuple[int, int],
    eps: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decoder layer of a step of decodes (x: their embeddings): (the last layer's output,
    the residual stream before it), as ``engine/model.py``'s layers return them. ``weights``:
    per layer input_layernorm, qkv_proj, o_proj, post_attention_layernorm, gate_up_proj,
    down_proj; ``scales``: none (fp32 products), or per layer those of the int8 qkv_proj, o_proj,
    gate_up_proj and down_proj; ``qkv_biases``: one per layer or none; kv_cache: every layer's
    [num_blocks, num_layers, 2, block, Hkv, D]; ``attention``: (slot_mapping, block_tables,
    seq_lens); ``rope``: (cos, sin) [T, D]; ``heads``: (query heads, KV heads)."""
    return torch.ops.pdserve.decode_layers(
        x, weights, scales, qkv_biases, kv_cache, *attention, *rope, *heads, eps, scale
    )


def decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``torch_attention.decode_attention`` reading the blocks in place."""
    return torch.ops.pdserve.decode_attention(query, kv_cache, block_tables, seq_lens, scale)
