"""A linear layer for CPU decoding: MKL over a transposed weight, or oneDNN over a packed one."""

import torch
from torch import nn


def onednn_packing_helps(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``Linear.pack`` should be used: fp32 on a CPU with oneDNN, on more than one thread
    (where packed weights make decode steps of 2-64 sequences faster; on one thread they are not;
    docs/benchmarks.md, "Measurements behind the code's choices")."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and torch.get_num_threads() > 1
    )


def native_bf16_products(device: torch.device) -> bool:
    """Whether bf16 products run on the hardware's own bf16 instructions: on a CPU, oneDNN's with
    AVX512-BF16 or AMX. Without them torch runs them in reference kernels, many times slower than
    fp32 (docs/benchmarks.md, "The real model")."""
    return device.type != "cpu" or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class Linear(nn.Module):
    """``y = x W^T + b`` like ``nn.Linear``, with W kept in an [in, out] contiguous buffer.

    ``torch.mm(x, W^T)`` over a contiguous [in, out] matrix is MKL's plain (non-transposed) sgemm,
    faster than nn.Linear's product over [out, in] at the batches a decode step has. ``weight`` is
    still the [out, in] tensor checkpoints hold (a transposed view of that buffer), so loading,
    tying and ``.to()`` see nn.Linear's shape.

    A single input row (a decode step at batch 1) is a matrix-vector product, which MKL runs on
    one thread whatever torch's thread count; viewing the columns as one block per thread and
    multiplying the blocks in one ``bmm`` spreads it over all threads.

    After loading, ``pack`` can hand the weight to oneDNN in its blocked layout (what inductor
    does for CPU linears), faster than MKL's sgemm at the 2-64 rows of a decode step. The figures
    behind each choice: docs/benchmarks.md, "Measurements behind the code's choices".
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        # .to(dtype) keeps these strides.
        self.weight = nn.Parameter(torch.empty(in_features, out_features).t())
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed_weight: torch.Tensor | None = None  # oneDNN's opaque layout, once packed

    def pack(self, keep_weight: bool) -> None:
        """Moves the weight into oneDNN's packed layout; the [in, out] buffer is freed unless
        ``keep_weight`` (a head tied to the embedding table packs a copy of it)."""
        weight = self.weight.detach().contiguous()  # [out, in]
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight)
        if not keep_weight:
            self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        if self.packed_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(
                x, self.packed_weight, self.bias, "none", [], ""
            )
        weight = self.weight.t()  # [in, out]; contiguous unless tied to an embedding
        parts = torch.get_num_threads()
        if x.shape[0] != 1 or x.device.type != "cpu" or parts == 1 or self.out_features % parts:
            return torch.mm(x, weight) if self.bias is None else torch.addmm(self.bias, x, weight)
        blocks = weight.view(self.in_features, parts, -1).transpose(0, 1)  # [parts, in, out/parts]
        y = torch.bmm(x.expand(parts, 1, self.in_features), blocks)  # [parts, 1, out / parts]
        y = y.view(1, self.out_features)  # the blocks are consecutive columns, in order
        return y if self.bias is None else y + self.bias
