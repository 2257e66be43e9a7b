"""Neighbour sampling on the training device: blocks for mini-batch training that never wait
for the CPU.

The DGL wheels of the package index sample on the CPU only, and building each sampled DGL
block's plan on the GPU costs what MaxK saves. Here the graph's in-edges live on the device as
a CSR (:class:`DeviceGraph`), :class:`NeighborSampler` draws DGL's uniform sampling without
replacement with torch on that device and returns :class:`~dgl_maxk.sparse.SampledBlock`
objects whose plans come with them (:meth:`NeighborSampler.start` queues a batch's kernels with
nothing read back, :class:`CapturedSampler` replays them from a CUDA graph), and
:class:`NeighborLoader` samples batches ahead of the training step on its own CUDA stream.
:func:`gather_rows` gives a batch its feature rows, also from features kept in pinned host
memory, which the GPU reads directly;
:func:`staged_rows` carries host rows over by a copy engine instead (the loader's way).
"""
from .loader import NeighborLoader
from .rows import gather_rows, pinned, staged_rows
from .sampler import CapturedSampler, DeviceGraph, NeighborSampler, PendingBatch

__all__ = ["DeviceGraph", "NeighborSampler", "PendingBatch", "CapturedSampler",
           "NeighborLoader", "gather_rows", "pinned", "staged_rows"]
