"""Feature rows of sampled nodes on the training device, from features in its memory or, for
features larger than it, in host memory: read by the GPU directly from pinned memory (UVA,
:func:`gather_rows`), or gathered by the CPU and carried over by a copy engine
(:func:`staged_rows`, what the loader does)."""
from __future__ import annotations

import torch

from .. import library
from .._custom_ops import tracing
from ..sparse import checks_enabled


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` on the index's device, through the operator
    ``torch.ops.dgl_maxk.gather_rows``. On a GPU, dgl_maxk's row gather kernel reads the rows
    of a table in its memory or, directly, in pinned host memory (:func:`pinned`), on torch's
    current stream, without host work; otherwise torch's ``index_select`` (a host table that
    is not pinned is gathered on the host, then copied).

    Parameters
    ----------
    table : Tensor (N, ...)
        On the index's device, or in host memory
    index : Tensor (M,), integers
        Row ids in ``[0, N)``: checked (a read back to the host) outside
        ``dgl_maxk.input_checks(False)`` and ``torch.compile``; a sampler's ids need no check

    Example
    -------
    >>> features = torch.randn(1000, 16)
    >>> gather_rows(features, torch.tensor([3, 1])).shape
    torch.Size([2, 16])
    """
    check_rows(table, index)
    if not tracing():
        check_ids(index, table.shape[0])
    return library.gather_rows(table, index.to(torch.int64))


def staged_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` on the index's device for a ``table`` in host memory (pinned or not),
    carried over the bus by a copy engine: the ids come to the host (the current stream
    synchronises), the CPU gathers the rows into pinned memory (torch's intra-op threads),
    and one asynchronous copy on the current stream moves them.

    Why: the GPU's own reads of host memory (:func:`gather_rows`) keep its SMs waiting on the
    bus, so the training step's kernels wait for them; a copy engine leaves the SMs to the
    step (measured on an H200, docs/performance.md). The rows are those of ``gather_rows``,
    bit for bit.

    Parameters
    ----------
    table : Tensor (N, ...), in host memory
    index : Tensor (M,), integers
        Row ids in ``[0, N)``, on any device: checked outside ``dgl_maxk.input_checks(False)``
        (on the host, where they go anyway)

    Example
    -------
    >>> features = torch.randn(1000, 16)
    >>> staged_rows(features, torch.tensor([3, 1])).shape
    torch.Size([2, 16])
    """
    check_rows(table, index)
    if table.device.type != "cpu":
        raise ValueError(f"staged_rows takes a table in host memory, got one on {table.device}")
    ids = index.to("cpu", torch.int64)
    check_ids(ids, table.shape[0])
    table = table.detach()  # rows of input features: no gradient (out= refuses one)
    if index.device.type == "cpu":
        return torch.index_select(table, 0, ids)
    rows = torch.empty((ids.numel(),) + table.shape[1:], dtype=table.dtype, pin_memory=True)
    torch.index_select(table, 0, ids, out=rows)
    # torch's host allocator keeps the pinned rows until the copy has read them
    return rows.to(index.device, non_blocking=True)


def check_ids(index: torch.Tensor, num_rows: int) -> None:
    """A ValueError unless the row ids ``index`` are in ``[0, num_rows)`` (a read back to the
    host for a GPU index); nothing inside ``dgl_maxk.input_checks(False)``."""
    if checks_enabled() and index.numel():
        low, high = torch.stack([index.min(), index.max()]).tolist()
        if low < 0 or high >= num_rows:
            raise ValueError(f"row ids must be in [0, {num_rows}), got ids from {low} to "
                             f"{high}")


def check_rows(table, index) -> None:
    """A TypeError or ValueError unless ``table`` is a tensor of rows and ``index`` a 1-d
    integer tensor on its device, or on a GPU for a host table."""
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"index must be a tensor, got {type(index).__name__}")
    if index.dim() != 1 or index.is_floating_point() or index.is_complex() or (
            index.dtype == torch.bool):
        raise ValueError(f"index must be a 1-d tensor of integer row ids, got shape "
                         f"{tuple(index.shape)} and {index.dtype}")
    check_table("table", table, None, index.device)


def check_table(name: str, table, num_rows: int | None, device) -> None:
    """A TypeError or ValueError naming ``name`` unless ``table`` is a tensor of rows
    (``num_rows`` of them, if given) on ``device`` or in host memory."""
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(table).__name__}")
    if table.dim() == 0 or num_rows not in (None, table.shape[0]):
        raise ValueError(f"{name} must have a row per node" + (
            f" ({num_rows})" if num_rows is not None else "")
            + f", got shape {tuple(table.shape)}")
    if table.device != torch.device(device) and table.device.type != "cpu":
        raise ValueError(f"{name} is on {table.device}, but its rows go to {device}: keep "
                         "it there or in host memory")


def pinned(table: torch.Tensor) -> torch.Tensor:
    """``table`` in pinned host memory (itself where it is there already; a copy otherwise),
    for :func:`gather_rows` from a GPU. Needs CUDA."""
    if table.device.type == "cpu" and table.is_pinned():
        return table
    return torch.empty(table.shape, dtype=table.dtype, pin_memory=True).copy_(table)
