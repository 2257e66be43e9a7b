"""Content checks of operator inputs, and the scope that turns them off.

The checks that read tensor contents (the NaN scan, the CBSR column scan) synchronise with the
GPU. They are on by default; ``with dgl_maxk.input_checks(False):`` turns them off inside a
block (for the current thread or task only: a context variable, not a global switch). Shape,
type and device checks always run.
"""
from __future__ import annotations

import contextlib
import contextvars
import numbers

import torch

_ENABLED = contextvars.ContextVar("dgl_maxk_input_checks", default=True)


def checks_enabled() -> bool:
    """Whether content checks run here (see :func:`input_checks`)."""
    return _ENABLED.get()


@contextlib.contextmanager
def input_checks(enabled: bool):
    """Run the operators' content checks (NaN scan, CBSR columns) or skip them in a block.

    >>> with dgl_maxk.input_checks(False):   # inputs validated once already
    ...     loss = model(g, x).sum()
    """
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def check_k(k, width: int | None = None, width_name: str = "d") -> int:
    """``k`` as an int in ``[1, width]`` (``width`` None: any positive k), else a ValueError
    naming the width. The one place k is validated: MaxK, the layers, the models, install."""
    valid = f"in [1, {width_name} = {width}]" if width is not None else "positive"
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be an integer {valid}, got {k!r}")
    if width is not None and k > width:
        raise ValueError(f"k = {k} exceeds the input width {width_name} = {width} (k must be "
                         f"{valid})")
    return int(k)


def check_features(name: str, x, rows: int | None = None, nan: bool = True):
    """Raise a ValueError naming the problem if ``x`` cannot be aggregated. ``nan=False``
    skips the NaN scan (for tensors the caller has scanned already)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name} has {x.shape[0]} rows but the graph has {rows} nodes there")
    if nan and checks_enabled():
        bad = torch.isnan(x)
        if bad.any():
            where = bad.nonzero()[0].tolist()
            raise ValueError(f"{name} contains {int(bad.sum())} NaN value(s), the first at "
                             f"index {tuple(where)}")
