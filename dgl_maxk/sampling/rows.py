"""Feature rows of sampled nodes on the training device, from features in its memory or, for
features larger than it, in pinned host memory that the GPU reads directly (UVA)."""
from __future__ import annotations

import torch

from .. import backends


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` on the index's device. A table in pinned host memory
    (:func:`pinned`) with an index on a GPU is read by that GPU directly, on torch's current
    stream, without host work; otherwise torch's ``index_select`` (a host table that is not
    pinned is gathered on the host, then copied). The GPU's read does not check the ids:
    they must be in ``[0, len(table))``, as a sampler's are.

    Example
    -------
    >>> features = torch.randn(1000, 16)
    >>> gather_rows(features, torch.tensor([3, 1])).shape
    torch.Size([2, 16])
    """
    return backends.for_tensor(index).gather_rows(table, index)


def pinned(table: torch.Tensor) -> torch.Tensor:
    """``table`` in pinned host memory (itself where it is there already; a copy otherwise),
    for :func:`gather_rows` from a GPU. Needs CUDA."""
    if table.device.type == "cpu" and table.is_pinned():
        return table
    return torch.empty(table.shape, dtype=table.dtype, pin_memory=True).copy_(table)
