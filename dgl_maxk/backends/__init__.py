"""The backends of the operators, chosen once at import.

- :mod:`.reference`: pure torch, any device; the reference the kernels are tested against.
- :mod:`.cuda`: CUDA kernels through CuPy, for CUDA tensors when CuPy and a GPU are present.

``DGL_MAXK_BACKEND=torch`` (read once, when dgl_maxk is imported) forces the pure-torch path
everywhere; ``auto`` (the default) uses the kernels wherever they can run.
"""
from __future__ import annotations

import os

import torch

from . import cuda, reference

_CHOICES = ("auto", "torch")
#: The backend setting, read once at import.
REQUESTED = os.environ.get("DGL_MAXK_BACKEND", "auto").strip().lower() or "auto"
if REQUESTED not in _CHOICES:
    raise ImportError(f"DGL_MAXK_BACKEND must be one of {_CHOICES}, got "
                      f"{os.environ['DGL_MAXK_BACKEND']!r}")
#: Whether CUDA tensors may go to the kernels (a GPU is probed on first use).
USE_CUDA_KERNELS = REQUESTED == "auto" and cuda.runtime.HAS_CUPY


def for_tensor(tensor: torch.Tensor):
    """The backend module that serves ``tensor``: :mod:`.cuda` or :mod:`.reference`."""
    if tensor.is_cuda and USE_CUDA_KERNELS and cuda.available():
        return cuda
    return reference


__all__ = ["cuda", "reference", "for_tensor", "REQUESTED", "USE_CUDA_KERNELS"]
