"""Sparse input features (``train.sparse_features``): bag-of-words inputs such as Cora's go
to the model's first linear layer as a sparse matrix (same result, much faster)."""
from __future__ import annotations

import torch
from torch.nn import functional as F


class SparseInputLinear(torch.nn.Module):
    """``nn.Linear`` that also takes a sparse COO input (``torch.sparse.mm``), holding the
    very parameters of the Linear it replaces (state dicts are unchanged)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x):
        if not x.is_sparse:
            return F.linear(x, self.weight, self.bias)
        with torch.autocast(x.device.type, enabled=False):  # sparse mm has no bf16 backward
            out = torch.sparse.mm(x, self.weight.t())
        return out if self.bias is None else out + self.bias
