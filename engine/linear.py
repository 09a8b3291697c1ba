"""``nn.Linear`` whose one-row product (a decode step at batch 1) uses every CPU thread."""

import torch
from torch import nn


class Linear(nn.Linear):
    """For a single input row, MKL runs the matrix-vector product over nn.Linear's [out, in] weight
    on one thread (~10 GB/s of weights on the 2-core dev machine). Viewing the weight as one row
    block per thread and multiplying them in one ``bmm`` spreads it over all threads (~16 GB/s).
    Larger batches are matrix-matrix products and go through ``nn.Linear`` unchanged.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in]
        parts = torch.get_num_threads()
        if x.shape[0] != 1 or x.device.type != "cpu" or parts == 1 or self.out_features % parts:
            return super().forward(x)
        blocks = self.weight.view(parts, self.out_features // parts, self.in_features)
        y = torch.bmm(x.expand(parts, 1, self.in_features), blocks.transpose(1, 2))
        y = y.view(1, self.out_features)  # [parts, 1, out / parts] -> [1, out]: blocks are in order
        return y if self.bias is None else y + self.bias
