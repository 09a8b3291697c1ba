"""Paged-attention ops: the PyTorch path against a dense reference, the native CPU kernels and the
Triton kernels (run on CPU by Triton's interpreter) against the PyTorch path, and the dispatch
point."""

import os

# Triton picks interpreter or compiler as each @triton.jit runs, triton.language's own helpers
# included, so this comes before anything imports triton (pdserve.kernels does so only for CUDA).
os.environ["TRITON_INTERPRET"] = "1"

import importlib
import subprocess
import sys
from types import ModuleType
from typing import NamedTuple

import pytest
import torch
from torch import Tensor

import pdserve.kernels as kernels
from pdserve.kernels import torch_attention

# The cache under test is one layer's view of a multi-layer block-major cache: not contiguous.
NUM_LAYERS, LAYER = 3, 1
# Unwritten cache rows hold large finite garbage, so any read past a sequence's end shows up.
GARBAGE = 100.0
FP32_ATOL = 1e-5


class Batch(NamedTuple):
    query: Tensor  # [T, Hq, D], the new tokens of every sequence concatenated
    kv_cache: Tensor  # [num_blocks, 2, block_size, Hkv, D], non-contiguous layer view
    block_tables: Tensor  # [B, max_blocks] int32, shuffled blocks, -1 past the end
    query_start_loc: Tensor  # [B + 1] int32
    seq_lens: Tensor  # [B] int32
    keys: list[Tensor]  # per sequence, dense [S, Hkv, D]
    values: list[Tensor]
    scale: float


def make_batch(
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    seqs: list[tuple[int, int]],
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Batch:
    """seqs: (cached prefix, new tokens) per sequence; K/V of all positions are in the cache."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [prefix + new for prefix, new in seqs]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks no sequence owns
    shape = (num_blocks, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim)
    full = (torch.randn(shape, generator=gen) * GARBAGE).to(dtype)
    kv_cache = full[:, LAYER]
    block_tables = torch.full((len(seqs), max(blocks_per_seq) + 1), -1, dtype=torch.int32)
    owners = torch.randperm(num_blocks, generator=gen).split([*blocks_per_seq, 3])
    keys, values = [], []
    for b, seq_len in enumerate(seq_lens):
        block_tables[b, : blocks_per_seq[b]] = owners[b].int()
        k, v = (torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype) for _ in "kv")
        for j, block in enumerate(owners[b].tolist()):
            rows = slice(j * block_size, min((j + 1) * block_size, seq_len))
            n = rows.stop - rows.start
            kv_cache[block, 0, :n], kv_cache[block, 1, :n] = k[rows], v[rows]
        keys.append(k)
        values.append(v)
    num_q_heads = num_kv_heads * group
    query = torch.randn(sum(new for _, new in seqs), num_q_heads, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0] + [new for _, new in seqs]).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return Batch(query, kv_cache, block_tables, starts, lens, keys, values, head_dim**-0.5)


def dense_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Naive causal attention in fp64: q [L, Hq, D] are the last L of the S positions of k/v
    [S, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)  # HF repeat_kv: head h reads kv head h // group
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    seq_len, q_len = k.shape[0], q.shape[0]
    q_pos = torch.arange(seq_len - q_len, seq_len)
    scores.masked_fill_(torch.arange(seq_len)[None, :] > q_pos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def dense_prefill(batch: Batch) -> Tensor:
    starts = batch.query_start_loc.tolist()
    parts = [
        dense_attention(batch.query[starts[b] : starts[b + 1]], k, v, batch.scale)
        for b, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True))
    ]
    return torch.cat(parts)


def decode_query(batch: Batch, seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    b, (_, hq, d) = len(batch.keys), batch.query.shape
    return torch.randn(b, hq, d, generator=gen).to(batch.query.dtype)


def prefill(ops: ModuleType, batch: Batch) -> Tensor:
    return ops.prefill_attention(
        batch.query,
        batch.kv_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        batch.scale,
    )


def decode(ops: ModuleType, batch: Batch, query: Tensor) -> Tensor:
    return ops.decode_attention(
        query, batch.kv_cache, batch.block_tables, batch.seq_lens, batch.scale
    )


# (block_size, num_kv_heads, group, head_dim, [(cached prefix, new tokens), ...])
TORCH_CASES = [
    (16, 2, 1, 64, [(0, 37), (200, 20), (15, 1)]),
    (32, 1, 2, 128, [(0, 64), (230, 5)]),
    (16, 2, 4, 64, [(31, 1), (0, 16), (250, 33)]),
    (16, 4, 3, 64, [(100, 28), (0, 300)]),  # the benchmark model's 12 query / 4 kv heads
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_prefill_matches_dense(case, dtype):
    batch = make_batch(*case, dtype=dtype)
    out = prefill(torch_attention, batch)
    assert out.dtype == dtype and out.shape == batch.query.shape
    atol = FP32_ATOL if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), dense_prefill(batch), atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_decode_matches_dense(case, dtype):
    batch = make_batch(*case, dtype=dtype)
    query = decode_query(batch)
    out = decode(torch_attention, batch, query)
    expected = torch.cat(
        [
            dense_attention(query[b : b + 1], k, v, batch.scale)
            for b, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True))
        ]
    )
    atol = FP32_ATOL if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=0)


def test_torch_decode_chunks_match_one_pass(monkeypatch):
    batch = make_batch(16, 2, 2, 64, [(300, 1), (40, 1), (129, 1), (5, 1)])
    query = decode_query(batch)
    whole = decode(torch_attention, batch, query)
    monkeypatch.setattr(torch_attention, "DECODE_GATHER_BYTES", 1)  # one sequence per chunk
    torch.testing.assert_close(decode(torch_attention, batch, query), whole, atol=FP32_ATOL, rtol=0)


def test_torch_decode_runs_split_on_padding_and_gather_bytes():
    runs = torch_attention._decode_runs
    # Longest first (as the runner orders decodes): similar lengths share a run; 100 after 480
    # would pad 430 positions, past DECODE_PADDING_TOKENS, so it starts a new one.
    assert runs([500, 490, 480, 100, 90], token_bytes=1) == [(0, 3), (3, 5)]
    # Equal lengths never pad, but three of them would gather more than the byte cap.
    per_token = torch_attention.DECODE_GATHER_BYTES // 1000
    assert runs([400, 400, 400], token_bytes=per_token) == [(0, 2), (2, 3)]
    # Any order works: an unsorted batch only makes more runs.
    assert runs([90, 500], token_bytes=1) == [(0, 1), (1, 2)]


def _written_cache(ops: ModuleType, seed: int) -> tuple[Tensor, Tensor]:
    """Writes 40 tokens (some padding) into a fresh layer view; returns (full cache, expected)."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(6, NUM_LAYERS, 2, 16, 2, 64, generator=gen)
    expected = full.clone()
    slots = torch.randperm(6 * 16, generator=gen)[:40]
    slots[::7] = -1
    key, value = torch.randn(2, 40, 2, 64, generator=gen).unbind(0)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // 16, LAYER, 0, slot % 16] = key[t]
            expected[slot // 16, LAYER, 1, slot % 16] = value[t]
    ops.write_kv(key, value, full[:, LAYER], slots)
    return full, expected


def test_torch_write_kv_scatters_slots_and_skips_padding():
    full, expected = _written_cache(torch_attention, seed=0)
    assert torch.equal(full, expected)  # other layers untouched too


@pytest.mark.slow  # a fresh interpreter: seconds of imports
def test_cpu_dispatch_never_imports_triton():
    script = (
        "import sys, torch\n"
        "import pdserve.kernels as k\n"
        "cache = torch.zeros(2, 2, 16, 1, 64)\n"
        "k.write_kv(torch.ones(3, 1, 64), torch.ones(3, 1, 64), cache, torch.tensor([0, 1, 2]))\n"
        "t = torch.tensor([[0, 1]], dtype=torch.int32)\n"
        "n = torch.tensor([3], dtype=torch.int32)\n"
        "k.decode_attention(torch.ones(1, 2, 64), cache, t, n, 0.125)\n"
        "k.prefill_attention(torch.ones(3, 2, 64), cache, t, torch.tensor([0, 3]), n, 0.125)\n"
        "assert 'triton' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_dispatch_sends_cpu_tensors_to_torch():
    batch = make_batch(16, 2, 2, 64, [(20, 12)])
    assert torch.equal(prefill(kernels, batch), prefill(torch_attention, batch))


# The native CPU kernels, against the PyTorch path.


NATIVE_CASES = [
    *TORCH_CASES,
    (16, 2, 1, 64, [(0, 1), (15, 1), (16, 1), (500, 1)]),  # one token, a block's end, the next
    (32, 1, 8, 96, [(77, 1), (3, 1)]),
    (16, 3, 3, 64, [(1000, 1)]),  # SmolLM2's heads: one sequence cut into ranges, merged
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", NATIVE_CASES)
def test_native_decode_matches_torch(native_ops, case, dtype):
    block_size, num_kv_heads, group, head_dim, seqs = case
    seqs = [(prefix + new - 1, 1) for prefix, new in seqs]  # decode: one new token each
    batch = make_batch(block_size, num_kv_heads, group, head_dim, seqs, dtype=dtype)
    query = decode_query(batch)
    out = decode(native_ops, batch, query)
    assert out.dtype == dtype and out.shape == query.shape
    atol = FP32_ATOL if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, decode(torch_attention, batch, query), atol=atol, rtol=0)


def test_native_decode_reads_a_strided_query(native_ops):
    # The model hands over the query heads as a view of the fused qkv projection.
    batch = make_batch(16, 2, 2, 64, [(40, 1), (130, 1)])
    qkv = torch.randn(2, 3 * 4 * 64, generator=torch.Generator().manual_seed(5))
    query = qkv[:, : 4 * 64].view(2, 4, 64)
    assert not query.is_contiguous()
    expected = decode(torch_attention, batch, query.contiguous())
    torch.testing.assert_close(decode(native_ops, batch, query), expected, atol=FP32_ATOL, rtol=0)


def test_native_write_kv_scatters_slots_and_skips_padding(native_ops):
    full, expected = _written_cache(native_ops, seed=2)
    assert torch.equal(full, expected)


def test_dispatch_sends_cpu_decodes_to_the_native_kernels_unless_disabled(native_ops, monkeypatch):
    batch = make_batch(16, 2, 2, 64, [(20, 1), (7, 1)])
    query = decode_query(batch)
    calls = []
    monkeypatch.setattr(native_ops, "decode_attention", lambda *a: calls.append(a) or a[0])
    decode(kernels, batch, query)
    assert len(calls) == 1
    with native_ops.disabled():
        decode(kernels, batch, query)
    assert len(calls) == 1
    decode(kernels, batch, query)
    assert len(calls) == 2


# Triton kernels under the interpreter, against the PyTorch path.


@pytest.fixture(scope="module")
def triton_ops() -> ModuleType:
    """The Triton module, its kernels built for the interpreter, so they run on CPU tensors."""
    triton = pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(triton.language.standard.zeros, InterpretedFunction):
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 was set (e.g. by tests/gpu in this "
            "process); run this file in its own pytest process"
        )
    return importlib.import_module("pdserve.kernels.triton_attention")


# Every axis at least once: block size 16/32, GQA 1/2/4, head dim 64/128 (and a non-power of two),
# sequence lengths on and off block boundaries, empty and 200+ token prefixes, one-token chunks.
TRITON_CASES = [
    (16, 2, 1, 64, [(0, 37), (200, 20)]),
    (32, 1, 2, 128, [(0, 64), (224, 5)]),
    (16, 2, 4, 128, [(31, 1), (250, 33)]),
    (32, 2, 4, 64, [(0, 70), (96, 32), (7, 3)]),
    (16, 1, 2, 96, [(40, 9)]),
]


# The interpreter cannot run tl.dot on bfloat16 (it multiplies the raw bits: triton-lang/triton
# #11584), so the 16-bit paths are checked in fp16 here and in bf16 by tests/gpu.
TRITON_DTYPES = pytest.mark.parametrize(
    ("dtype", "atol"), [(torch.float32, FP32_ATOL), (torch.float16, 5e-3)], ids=["fp32", "fp16"]
)


@TRITON_DTYPES
@pytest.mark.parametrize("case", TRITON_CASES)
def test_triton_prefill_matches_torch(triton_ops, case, dtype, atol):
    batch = make_batch(*case, dtype=dtype)
    out = prefill(triton_ops, batch)
    assert out.shape == batch.query.shape and out.dtype == dtype
    torch.testing.assert_close(out, prefill(torch_attention, batch), atol=atol, rtol=0)


@TRITON_DTYPES
@pytest.mark.parametrize("case", TRITON_CASES)
def test_triton_decode_matches_torch(triton_ops, case, dtype, atol):
    block_size, num_kv_heads, group, head_dim, seqs = case
    seqs = [*seqs, (0, 1), (block_size - 1, 1)]  # a one-token sequence, and one of exactly a block
    batch = make_batch(block_size, num_kv_heads, group, head_dim, seqs, dtype=dtype)
    query = decode_query(batch)
    expected = decode(torch_attention, batch, query)
    torch.testing.assert_close(decode(triton_ops, batch, query), expected, atol=atol, rtol=0)


def test_triton_write_kv_matches_torch(triton_ops):
    full, expected = _written_cache(triton_ops, seed=3)
    assert torch.equal(full, expected)
