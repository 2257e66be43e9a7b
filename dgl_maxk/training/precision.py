"""The precision policy of a training run: ``fp32``, ``tf32`` (the paper's, the default) or
``bf16``.

- fp32: float32 matmuls in full precision (``torch.set_float32_matmul_precision("highest")``);
- tf32: float32 matmuls may use TF32 tensor cores (``"high"``), as the paper's trainer does;
- bf16: ``"high"`` plus ``torch.autocast(dtype=torch.bfloat16)`` around the forward pass.

The library never changes this global setting itself; :func:`precision_scope` sets it for a
run (or a benchmark) and restores the caller's setting afterwards.
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16")
MATMUL_PRECISION = {"fp32": "highest", "tf32": "high", "bf16": "high"}


def _check(precision: str):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")


@contextlib.contextmanager
def precision_scope(precision: str):
    """Within the block, float32 matmuls run at ``precision``'s setting; the previous
    setting comes back afterwards."""
    _check(precision)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(MATMUL_PRECISION[precision])
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def autocast(precision: str, device_type: str, cache: bool = True):
    """The context a forward pass runs in: bfloat16 autocast for 'bf16', nothing otherwise.
    ``cache=False`` turns off autocast's cache of cast weights (a CUDA graph capture needs
    that)."""
    _check(precision)
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16",
                          cache_enabled=cache)
