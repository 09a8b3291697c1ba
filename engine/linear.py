"""A linear layer whose weight is stored transposed, [in, out] contiguous, for MKL's sake."""

import torch
from torch import nn


class Linear(nn.Module):
    """``y = x W^T + b`` like ``nn.Linear``, with W kept in an [in, out] contiguous buffer.

    ``torch.mm(x, W^T)`` over a contiguous [in, out] matrix is MKL's plain (non-transposed) sgemm,
    which on the 2-core dev VM beat nn.Linear's product over [out, in] at the batches a decode
    step has: the tiny preset's 17 products at 1/2/16/48 rows (1 thread) took 1.7/2.3/5.6/8.4 ms
    against 2.6/5.1/6.8/11.1 ms. ``weight`` is still the [out, in] tensor checkpoints hold (a
    transposed view of that buffer), so loading, tying and ``.to()`` see nn.Linear's shape.

    A single input row (a decode step at batch 1) is a matrix-vector product, which MKL runs on
    one thread whatever torch's thread count. Viewing the columns as one block per thread and
    multiplying the blocks in one ``bmm`` spreads it over all threads: the small preset's products
    take 29 ms that way on 2 threads against 34 ms in one ``mm``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        # empty_like (module.to_empty) and .to(dtype) keep these strides.
        self.weight = nn.Parameter(torch.empty(in_features, out_features).t())
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        weight = self.weight.t()  # [in, out]; contiguous unless tied to an embedding
        parts = torch.get_num_threads()
        if x.shape[0] != 1 or x.device.type != "cpu" or parts == 1 or self.out_features % parts:
            return torch.mm(x, weight) if self.bias is None else torch.addmm(self.bias, x, weight)
        blocks = weight.view(self.in_features, parts, -1).transpose(0, 1)  # [parts, in, out/parts]
        y = torch.bmm(x.expand(parts, 1, self.in_features), blocks)  # [parts, 1, out / parts]
        y = y.view(1, self.out_features)  # the blocks are consecutive columns, in order
        return y if self.bias is None else y + self.bias
