"""Graphs too large for a DGL graph on the host, built as a :class:`DeviceGraph` on the
training device a chunk at a time, so that the peak memory stays near the final CSR's.

- :func:`csr_from_edges` -- the in-edge CSR of an edge list streamed in chunks (a counting
  sort: one pass counts the in-degrees, a second writes each edge at its row's cursor);
- :func:`canonical_rows` -- each row's sources sorted, without duplicates and self-loops as
  asked, with one self-loop per node as asked (what ``build_dataset`` does to DGL graphs).

Sources are int32 for graphs of fewer than 2^31 nodes; row pointers and every edge position
are int64, so graphs of 2^31 edges and more (ogbn-papers100M made bidirected: 3.2B) build as
smaller ones do.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from ..sampling import DeviceGraph
from ..sampling.sampler import row_ranges

#: Edges handled at a time by the whole-graph passes (int64 temporaries of a few times this).
CHUNK_EDGES = 1 << 26


def source_dtype(num_nodes: int) -> torch.dtype:
    """The dtype of a DeviceGraph's sources: int32 below 2^31 nodes."""
    return torch.int32 if num_nodes < 2 ** 31 else torch.int64


def csr_from_edges(edges: Callable[[], Iterable], num_nodes: int, device) -> DeviceGraph:
    """The in-edges of the edge list that ``edges()`` yields as ``(src, dst)`` chunks of
    integer tensors (on any device; called twice), as a DeviceGraph on ``device``. Each row
    keeps its edges in the order of the stream. The caller checks the ids: they must be in
    ``[0, num_nodes)``."""
    device = torch.device(device)
    counts = torch.zeros(num_nodes, dtype=torch.int64, device=device)
    for _, dst in edges():
        dst = dst.to(device)
        counts.index_add_(0, dst, torch.ones(1, dtype=torch.int64, device=device)
                          .expand(dst.numel()))
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=indptr[1:])
    del counts
    indices = torch.empty(int(indptr[-1]), dtype=source_dtype(num_nodes), device=device)
    cursor = indptr[:-1].clone()  # each row's next free position
    for src, dst in edges():
        dst = dst.to(device, torch.int64)
        order = torch.argsort(dst, stable=True)
        rows, run = torch.unique_consecutive(dst[order], return_counts=True)
        # an edge's rank among the chunk's edges of its row, in stream order
        rank = torch.arange(order.numel(), device=device) - torch.repeat_interleave(
            torch.cumsum(run, 0) - run, run, output_size=order.numel())
        positions = torch.repeat_interleave(cursor[rows], run, output_size=order.numel()) + rank
        indices[positions] = src.to(device)[order].to(indices.dtype)
        cursor[rows] += run
    return DeviceGraph(indptr, indices, num_nodes)


def canonical_rows(graph: DeviceGraph, dedupe: bool, self_loops: bool) -> DeviceGraph:
    """``graph`` with each row's sources in ascending order, repeated edges kept once
    (``dedupe``), and self-loops removed then one added per node (``self_loops``); built a
    chunk of rows at a time beside ``graph`` (drop it after). Its edge ids are not kept."""
    n, device = graph.num_nodes, graph.device
    capacity = graph.num_edges + (n if self_loops else 0)
    indices = torch.empty(capacity, dtype=graph.indices.dtype, device=device)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=device)
    written = 0
    for r0, r1, e0, e1 in row_ranges(graph.indptr, CHUNK_EDGES):
        rows = torch.arange(r1 - r0, device=device)
        row = torch.repeat_interleave(rows, graph.indptr[r0 + 1:r1 + 1] - graph.indptr[r0:r1],
                                      output_size=e1 - e0)
        src = graph.indices[e0:e1].long()
        if self_loops:
            keep = src != row + r0
            src = torch.cat([src[keep], rows + r0])
            row = torch.cat([row[keep], rows])
        key = torch.sort(row * n + src).values  # by row, then by source
        if dedupe:
            key = torch.unique_consecutive(key)
        count = torch.bincount(key // n, minlength=r1 - r0)
        indices[written:written + key.numel()] = key % n
        torch.cumsum(count, 0, out=indptr[r0 + 1:r1 + 1])
        indptr[r0 + 1:r1 + 1] += written
        written += key.numel()
    # a view keeps the unused tail: copied out where that tail is large (many duplicates)
    indices = indices[:written].clone() if written < capacity * 7 // 8 else indices[:written]
    return DeviceGraph(indptr, indices, n)
