"""Content checks of operator inputs, and the scopes that defer them or turn them off.

The checks that read tensor contents (the NaN scan, the CBSR column scan) synchronise with the
GPU. They are on by default. ``with dgl_maxk.deferred_checks():`` keeps the NaN scans but
makes them sync-free inside the block: each records device-side flags, and the block's end
reads them all at once (one synchronisation) and raises the first problem, with its position,
as the immediate check would have. ``with dgl_maxk.input_checks(False):`` turns content checks
off. Both are context variables (the current thread or task only), not global switches.
Shape, type and device checks always run.

Under ``torch.compile`` the NaN checks are traced as scans and a ``dgl_maxk::check_nan`` op
that reads these scopes when the compiled code runs: scopes around the compiled call apply
as they do in eager mode, scopes entered inside the compiled code are not seen (dynamo cannot
trace context variables), so the checks there follow the scope around the call.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import numbers

import torch

from .._custom_ops import compiling, operator, tracing


class NaNError(ValueError):
    """A NaN in an input (or a NaN or infinite value where only finite ones are valid: edge
    weights), found by a content check: the message names the tensor, the count and the
    first position."""


_ENABLED = contextvars.ContextVar("dgl_maxk_input_checks", default=True)
_PENDING = contextvars.ContextVar("dgl_maxk_pending_checks", default=None)


def checks_enabled() -> bool:
    """Whether content checks run here (see :func:`input_checks`); True while
    ``torch.compile`` traces (the traced checks read the scope when they run)."""
    return compiling() or _ENABLED.get()


@contextlib.contextmanager
def input_checks(enabled: bool):
    """Run the operators' content checks (NaN scan, CBSR columns) or skip them in a block.

    >>> with dgl_maxk.input_checks(False):   # inputs validated once already
    ...     loss = model(g, x).sum()
    """
    if compiling():  # not seen by the compiled code (see the module's notes)
        yield
        return
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


@contextlib.contextmanager
def deferred_checks():
    """Make the NaN scans inside the block sync-free; check them all when the block ends.

    >>> with dgl_maxk.deferred_checks():      # one synchronisation, at the end
    ...     loss = loss_fn(model(g, x), y)
    ...     loss.backward()
    """
    with recorded_checks() as pending:
        yield
    raise_recorded_checks(pending)


@contextlib.contextmanager
def recorded_checks():
    """Record the NaN scans inside the block (sync-free) into the list it yields, without
    reading them: :func:`raise_recorded_checks` reads them. The scans' tensors are made
    inside the block, so a CUDA graph captured in it refreshes them on every replay."""
    pending: list = []
    if compiling():  # not seen by the compiled code (see the module's notes)
        yield pending
        return
    token = _PENDING.set(pending)
    try:
        yield pending
    finally:
        _PENDING.reset(token)


def _nan_message(name, count, where, finite=False) -> str:
    what = "non-finite (NaN or infinite)" if finite else "NaN"
    return f"{name} contains {count} {what} value(s), the first at index {tuple(where)}"


def _invalid(x: torch.Tensor, finite: bool) -> torch.Tensor:
    """The mask of ``x``'s NaN (``finite``: of its NaN and infinite values)."""
    return ~torch.isfinite(x) if finite else torch.isnan(x)


def nan_scan(x: torch.Tensor, finite: bool = False):
    """(NaN count, flat position of the first NaN, or 0 without one) of ``x`` as int64
    tensors on its device: no host sync. ``finite``: of its NaN and infinite values."""
    bad = _invalid(x, finite).reshape(-1)
    # eagerly a view (no copy of the mask); traced a conversion, which inductor fuses (its
    # GPU code generation cannot reinterpret bool)
    bad = bad.to(torch.uint8) if tracing() else bad.view(torch.uint8)
    first = bad.argmax() if bad.numel() else bad.new_zeros((), dtype=torch.long)
    return bad.sum(dtype=torch.int64), first


def _record_nan_scan(pending: list, name: str, x: torch.Tensor, finite: bool):
    """Device-side NaN count and first flat position of ``x``, read later (no sync now)."""
    pending.append((name, tuple(x.shape), *nan_scan(x, finite), False, finite))


def raise_recorded_checks(pending: list):
    """Read the scans :func:`recorded_checks` recorded (one synchronisation) and raise the
    first NaN, with its position."""
    raise_recorded_flags(pending, recorded_flags(pending))


def recorded_flags(pending: list):
    """The (NaN count, first position) of each scan in ``pending``, stacked on the first
    scan's device (n x 2 int64; no synchronisation), or None without scans."""
    if not pending:
        return None
    device = pending[0][2].device  # edge weights may sit on the CPU beside GPU features
    return torch.stack([t.to(device) for _, _, count, first, *_ in pending
                        for t in (count, first)]).view(-1, 2)


def raise_recorded_flags(pending: list, flags):
    """Read ``flags``, :func:`recorded_flags` of ``pending`` (one synchronisation), and raise
    the first NaN, with its position."""
    if flags is None:
        return
    for (name, shape, _, _, from_end, finite), (count, first) in zip(pending, flags.tolist()):
        _raise_if_nan(name, shape, count, first, from_end, finite)


def _raise_if_nan(name, shape, count, first, from_end, finite=False):
    if count:
        first = math.prod(shape) - first if from_end else first
        where = torch.unravel_index(torch.tensor(first), shape)
        raise NaNError(_nan_message(name, count, [int(i) for i in where], finite))


def check_nan_counters(name: str, shape, counters):
    """The NaN check of :func:`check_features` from an operator's ``counters`` (NaN count,
    numel - first flat position: see ``backends.reference.maxk_cbsr``), which the operator
    counted as it read its input (the check costs no pass of its own): recorded inside
    :func:`deferred_checks`, else read now."""
    if tracing():
        _check_nan(counters, name, list(shape), True, False)
        return
    pending = _PENDING.get()
    if pending is not None:
        pending.append((name, tuple(shape), counters[0], counters[1], True, False))
        return
    _raise_if_nan(name, tuple(shape), *counters.tolist(), True)


def _check_nan_fake(stats, name, shape, from_end, finite):
    return None


@operator("check_nan", _check_nan_fake, side_effect=True)
def _check_nan(stats: torch.Tensor, name: str, shape: list[int], from_end: bool,
               finite: bool) -> None:
    """The traced NaN check: ``stats`` = (NaN count, first flat position, or numel minus it
    with ``from_end``) of a tensor of ``shape`` (``finite``: of its NaN and infinite
    values), read or recorded by the scopes in effect when the compiled code runs."""
    if not _ENABLED.get():
        return
    pending = _PENDING.get()
    if pending is not None:  # a copy: compiled code may reuse the buffer
        stats = stats.clone()
        pending.append((name, tuple(shape), stats[0], stats[1], from_end, finite))
        return
    _raise_if_nan(name, tuple(shape), *stats.tolist(), from_end, finite)


def check_k(k, width: int | None = None, width_name: str = "d") -> int:
    """``k`` as an int in ``[1, width]`` (``width`` None: any positive k), else a ValueError
    naming the width. The one place k is validated: MaxK, the layers, the models, install."""
    valid = f"in [1, {width_name} = {width}]" if width is not None else ">= 1"
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be an integer {valid}, got {k!r}")
    if width is not None and k > width:
        raise ValueError(f"k = {k} exceeds the input width {width_name} = {width} (k must be "
                         f"{valid})")
    return int(k)


def check_features(name: str, x, rows: int | None = None, nan: bool = True,
                   finite: bool = False):
    """Raise a ValueError naming the problem if ``x`` cannot be aggregated. ``nan=False``
    skips the NaN scan (for tensors the caller has scanned already); ``finite=True`` makes
    it refuse infinite values too (in the same scan)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name} has {x.shape[0]} rows but the graph has {rows} nodes there")
    if not (nan and checks_enabled()):
        return
    if tracing():
        _check_nan(torch.stack(nan_scan(x, finite)), name, list(x.shape), False, finite)
        return
    pending = _PENDING.get()
    if pending is not None:
        _record_nan_scan(pending, name, x, finite)
        return
    bad = _invalid(x, finite)
    if bad.any():
        raise NaNError(_nan_message(name, int(bad.sum()), bad.nonzero()[0].tolist(), finite))
