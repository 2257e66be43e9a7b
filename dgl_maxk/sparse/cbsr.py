"""CBSR: Compressed Balanced Sparse Row features.

A matrix whose every row holds exactly ``k`` non-zeros needs no row pointer: it is stored as
``values`` (N x k) and ``indices`` (N x k, the column of each value in ``[0, d)``). Indices are
``uint8`` while ``d <= 256`` (5k bytes per row in fp32) and ``int16`` above, which covers
``d <= 32768``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from .._custom_ops import operator, tracing
from .checks import _ENABLED, checks_enabled

MAX_WIDTH = 32768  # int16 indices


def index_dtype(d: int) -> torch.dtype:
    """The narrowest index type that can hold a column of a d-wide matrix."""
    if not 1 <= d <= MAX_WIDTH:
        raise ValueError(f"CBSR width d must be in [1, {MAX_WIDTH}], got {d}")
    return torch.uint8 if d <= 256 else torch.int16


@dataclass
class CBSR:
    """A row-balanced sparse matrix: exactly ``k`` stored entries in each of ``N`` rows.

    ``CBSR.from_dense(x, k)`` is :func:`dgl_maxk.maxk` and ``c.to_dense()`` the N x d dense
    matrix (differentiable with respect to ``values``), both attached by :mod:`dgl_maxk.ops`.

    Parameters
    ----------
    values : Tensor, shape (N, k), floating point
        The stored entries; autograd flows through this tensor.
    indices : Tensor, shape (N, k), uint8 (d <= 256) or int16
        Column of each stored entry. Within a row the columns are distinct, in any order
        (:func:`dgl_maxk.maxk` on the GPU orders them for its aggregation kernel; on the CPU
        they are ascending).
    d : int
        The width of the dense matrix.

    Example
    -------
    >>> x = torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.]])
    >>> c = CBSR.from_dense(x, k=2)
    >>> c.to_dense()
    tensor([[0., 3., 0., 1.],
            [2., 0., 0., 0.]])
    """

    values: torch.Tensor
    indices: torch.Tensor
    d: int
    #: Internal: the pattern is known valid (made by maxk, or shared with a checked CBSR), so
    #: the column scan below (a device synchronisation) is skipped.
    _pattern_checked: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self):
        if isinstance(self.d, bool) or not isinstance(self.d, numbers.Integral):
            raise ValueError(f"CBSR width d must be an integer, got {self.d!r}")
        self.d = int(self.d)
        v, i = self.values, self.indices
        if not isinstance(v, torch.Tensor) or not isinstance(i, torch.Tensor):
            raise ValueError("CBSR values and indices must be torch.Tensors, got "
                             f"{type(v).__name__} and {type(i).__name__}")
        if v.dim() != 2 or i.shape != v.shape:
            raise ValueError(
                f"CBSR values and indices must both be N x k; got {tuple(v.shape)} and "
                f"{tuple(i.shape)}")
        if not v.is_floating_point():
            raise ValueError(f"CBSR values must be floating point, got {v.dtype}")
        if i.dtype != index_dtype(self.d):
            raise ValueError(
                f"CBSR indices for d = {self.d} must be {index_dtype(self.d)}, got {i.dtype}")
        if not 1 <= v.shape[1] <= self.d:
            raise ValueError(f"CBSR k must be in [1, d = {self.d}], got {v.shape[1]}")
        if v.device != i.device:
            raise ValueError(f"CBSR values on {v.device} but indices on {i.device}")
        if not self._pattern_checked:
            self._check_pattern()

    def _check_pattern(self):
        """Columns in [0, d) and distinct within each row (out-of-range columns would make
        the kernels read and write out of bounds; repeated ones would be summed by some
        backends and overwritten by others). Skipped inside ``input_checks(False)``; traced
        as an op under ``torch.compile``, which reads the scope when it runs."""
        if tracing():
            _traced_check_pattern(self.indices, self.d)
        elif checks_enabled():
            check_pattern(self.indices, self.d)

    @property
    def k(self) -> int:
        return self.values.shape[1]

    @property
    def shape(self) -> tuple:
        return (self.values.shape[0], self.d)

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def long_indices(self) -> torch.Tensor:
        """Indices as int64, for torch indexing (uint8 would be read as a boolean mask)."""
        return self.indices.long()

    def with_values(self, values: torch.Tensor) -> "CBSR":
        """The same sparsity pattern with other values (dropout, casts)."""
        return CBSR(values, self.indices, self.d, self._pattern_checked)

    def to(self, *args, **kwargs) -> "CBSR":
        """Move or cast like ``Tensor.to``; a dtype applies to the values only."""
        values = self.values.to(*args, **kwargs)
        return CBSR(values, self.indices.to(values.device), self.d, self._pattern_checked)


def check_pattern(indices: torch.Tensor, d: int) -> None:
    """Raise a ValueError naming the first column of ``indices`` (N x k) outside [0, d), or
    the first row that repeats a column (a host synchronisation)."""
    if indices.numel() == 0 or indices.device.type == "meta":
        return
    cols = indices.long()
    bad = (cols < 0) | (cols >= d)
    if bad.any():
        r, j = bad.nonzero()[0].tolist()
        raise ValueError(f"CBSR column {int(cols[r, j])} at index ({r}, {j}) is outside "
                         f"[0, d = {d})")
    if indices.shape[1] > 1:
        ordered = cols.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
        if repeated.any():
            r = int(repeated.nonzero()[0])
            raise ValueError(f"CBSR row {r} repeats a column: the k columns of a row must be "
                             "distinct")


def _check_pattern_fake(indices, d):
    return None


@operator("check_cbsr_pattern", _check_pattern_fake, side_effect=True)
def _traced_check_pattern(indices: torch.Tensor, d: int) -> None:
    """:func:`check_pattern` inside compiled code, where the checks are on when it runs."""
    if _ENABLED.get():
        check_pattern(indices, d)
