"""Triton paged-attention kernels on CUDA against the PyTorch path, and a timing printout.

Run in its own pytest process (`pytest tests/gpu -s`): tests/unit/test_kernels.py sets
TRITON_INTERPRET=1 for the whole process, which would build these kernels for the interpreter.
"""

import os
from types import ModuleType

import pytest
import torch
from torch import Tensor

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip(
        "TRITON_INTERPRET=1 is set in this process (tests/unit/test_kernels.py sets it); "
        "run tests/gpu in its own pytest process",
        allow_module_level=True,
    )

import triton.testing  # noqa: E402

from pdserve.kernels import torch_attention, triton_attention  # noqa: E402

NUM_LAYERS, LAYER = 3, 1  # the cache under test is a non-contiguous layer view
GARBAGE = 100.0  # unwritten rows: large finite values, so a read past a sequence's end shows up
ATOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", list(ATOL), ids=["fp32", "fp16", "bf16"])
# (block_size, num_kv_heads, group, head_dim, [(cached prefix, new tokens), ...])
CASES = [
    (16, 2, 1, 64, [(0, 37), (200, 20), (15, 1)]),
    (32, 2, 2, 128, [(0, 64), (224, 5), (0, 1000)]),
    (16, 4, 4, 128, [(31, 1), (250, 33), (1000, 300)]),
    (32, 4, 3, 64, [(0, 70), (96, 32), (7, 3)]),
    (16, 1, 2, 96, [(40, 9)]),
]


class Batch:
    """Random K/V for every position already in a shuffled paged cache, plus new-token queries."""

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int,
        group: int,
        head_dim: int,
        seqs: list[tuple[int, int]],
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        lens = [prefix + new for prefix, new in seqs]
        blocks = [-(-n // block_size) for n in lens]
        num_blocks = sum(blocks) + 3
        shape = (num_blocks, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim)
        self.full = (torch.randn(shape, device="cuda") * GARBAGE).to(dtype)
        self.kv_cache = self.full[:, LAYER]
        self.block_tables = torch.full((len(seqs), max(blocks) + 1), -1, dtype=torch.int32)
        owners = torch.randperm(num_blocks).split([*blocks, 3])
        slots = []
        for b, n in enumerate(lens):
            self.block_tables[b, : blocks[b]] = owners[b].int()
            pos = torch.arange(n)
            slots.append(owners[b][pos // block_size] * block_size + pos % block_size)
        self.block_tables = self.block_tables.cuda()
        slot_mapping = torch.cat(slots).cuda()
        key, value = torch.randn(2, len(slot_mapping), num_kv_heads, head_dim, device="cuda")
        torch_attention.write_kv(key.to(dtype), value.to(dtype), self.kv_cache, slot_mapping)
        hq = num_kv_heads * group
        self.query = torch.randn(sum(new for _, new in seqs), hq, head_dim, device="cuda").to(dtype)
        self.decode_query = torch.randn(len(seqs), hq, head_dim, device="cuda").to(dtype)
        starts = torch.tensor([0] + [new for _, new in seqs]).cumsum(0)
        self.query_start_loc = starts.to(torch.int32).cuda()
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.scale = head_dim**-0.5

    def prefill(self, ops: ModuleType) -> Tensor:
        return ops.prefill_attention(
            self.query,
            self.kv_cache,
            self.block_tables,
            self.query_start_loc,
            self.seq_lens,
            self.scale,
        )

    def decode(self, ops: ModuleType) -> Tensor:
        return ops.decode_attention(
            self.decode_query, self.kv_cache, self.block_tables, self.seq_lens, self.scale
        )


@DTYPES
def test_write_kv_matches_torch(dtype):
    full = torch.randn(8, NUM_LAYERS, 2, 16, 4, 128, device="cuda").to(dtype)
    expected = full.clone()
    slots = torch.randperm(8 * 16, device="cuda")[:50]
    slots[::7] = -1
    key, value = torch.randn(2, 50, 4, 128, device="cuda").to(dtype)
    torch_attention.write_kv(key, value, expected[:, LAYER], slots)
    triton_attention.write_kv(key, value, full[:, LAYER], slots)
    assert torch.equal(full, expected)


@DTYPES
@pytest.mark.parametrize("case", CASES)
def test_prefill_matches_torch(case, dtype):
    batch = Batch(*case, dtype=dtype)
    out = batch.prefill(triton_attention)
    assert out.dtype == dtype and out.shape == batch.query.shape
    expected = batch.prefill(torch_attention)
    torch.testing.assert_close(out, expected, atol=ATOL[dtype], rtol=0)


@DTYPES
@pytest.mark.parametrize("case", CASES)
def test_decode_matches_torch(case, dtype):
    batch = Batch(*case, dtype=dtype)
    expected = batch.decode(torch_attention)
    torch.testing.assert_close(batch.decode(triton_attention), expected, atol=ATOL[dtype], rtol=0)


def test_decode_replays_in_a_cuda_graph():
    batch = Batch(*CASES[2], dtype=torch.bfloat16)
    expected = batch.decode(triton_attention)  # also compiles the kernel before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = batch.decode(triton_attention)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_print_decode_timing(dtype, capsys):
    # The benchmark model's attention: 12 query heads, 4 kv heads, head_dim 64; batch 32 x 1024.
    batch = Batch(16, 4, 3, 64, [(1023, 1)] * 32, dtype=dtype)
    torch.testing.assert_close(
        batch.decode(triton_attention), batch.decode(torch_attention), atol=ATOL[dtype], rtol=0
    )
    triton_ms = triton.testing.do_bench(lambda: batch.decode(triton_attention))
    torch_ms = triton.testing.do_bench(lambda: batch.decode(torch_attention))
    with capsys.disabled():
        print(
            f"\ndecode B=32 ctx=1024 Hq=12 Hkv=4 D=64 {dtype}: triton {triton_ms * 1e3:.1f} us, "
            f"torch path {torch_ms * 1e3:.1f} us ({torch_ms / triton_ms:.1f}x)"
        )
