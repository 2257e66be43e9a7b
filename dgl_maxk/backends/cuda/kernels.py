"""The kernel launches: each function allocates its outputs, picks the kernel's
configuration (:mod:`.launch`) and launches it (:mod:`.runtime`). The operators of
:mod:`dgl_maxk.library` reach them through the backend's functions in this package, inside
their custom ops, so ``torch.compile`` never traces a launch.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from ...sparse.cbsr import index_dtype
from .. import reference
from . import launch as heuristics  # (runtime.launch is the launch itself)
from .runtime import grid, i32, i64, kernel, launch, ptr


def _ptr_or_null(t: Optional[torch.Tensor]):
    return ptr(t) if t is not None else np.uint64(0)


def _launch_over_groups(name: str, config, num_groups: int, device, args):
    """Compile kernel ``name`` for ``config`` (defines, warps, shared bytes, persistent) and
    launch it with one warp task per edge group."""
    defines, warps, smem, persist = config
    kern = kernel(name, name, defines, device.index)
    launch(kern, grid(kern, warps, smem, num_groups, persist, device.index), warps * 32, args,
           smem, device)


def maxk_cbsr(h: torch.Tensor, k: int,
              nan_stats: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = h.shape
    values = torch.empty((n, k), dtype=h.dtype, device=h.device)
    indices = torch.empty((n, k), dtype=index_dtype(d), device=h.device)
    if n == 0:
        return values, indices
    func, defines, warps, smem = heuristics.maxk_config(h, d, k)
    kern = kernel("maxk_cbsr", func, defines, h.device.index)
    launch(kern, -(-n // warps), warps * 32,
           (ptr(h), ptr(values), ptr(indices), i64(n), i32(d), i32(k), _ptr_or_null(nan_stats)),
           smem, h.device)
    return values, indices


def layer_norm_maxk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                    k: int, nan_stats: Optional[torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, indices, mean, rstd): :func:`maxk_cbsr` of :func:`layer_norm`'s output, in
    one kernel (fp32 rows read as float4, d <= 1024)."""
    n, d = x.shape
    values = torch.empty((n, k), dtype=x.dtype, device=x.device)
    indices = torch.empty((n, k), dtype=index_dtype(d), device=x.device)
    mean, rstd = (torch.empty((n, 1), dtype=torch.float32, device=x.device) for _ in range(2))
    if n == 0:
        return values, indices, mean, rstd
    func, defines, warps, smem = heuristics.maxk_config(x, d, k)
    assert func == "maxk_reg" and defines["VEC"] == 4, "the caller checks the row layout"
    kern = kernel("maxk_cbsr", func, dict(defines, LAYER_NORM=1), x.device.index)
    launch(kern, -(-n // warps), warps * 32,
           (ptr(x), ptr(values), ptr(indices), i64(n), i32(d), i32(k), _ptr_or_null(nan_stats),
            ptr(weight), ptr(bias), ptr(mean), ptr(rstd), np.float32(eps)), smem, x.device)
    return values, indices, mean, rstd


def cbsr_to_dense(values: torch.Tensor, indices: torch.Tensor, d: int) -> torch.Tensor:
    n, k = values.shape
    out = torch.empty((n, d), dtype=values.dtype, device=values.device)
    if n == 0 or d == 0:
        return out
    defines, warps, smem = heuristics.to_dense_config(values, indices, d)
    kern = kernel("dense_rows", "cbsr_to_dense", defines, values.device.index)
    launch(kern, -(-n // warps), warps * 32,
           (ptr(values), ptr(indices), ptr(out), i64(n), i32(d), i32(k)), smem, values.device)
    return out


def cbsr_to_dense_sums(values: torch.Tensor, indices: torch.Tensor,
                       d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense rows, column sums) of fp32 CBSR of width d % 4 == 0: persistent warps build
    each row in shared memory, write it, and add it into their row of partial sums, which
    are added up here in a fixed order."""
    n, k = values.shape
    out = torch.empty((n, d), dtype=torch.float32, device=values.device)
    if n == 0:
        return out, values.new_zeros(d)
    sums = _partial_sums_launch(
        "cbsr_to_dense_sums", {"IDX_BYTES": indices.element_size()}, n, d, 1, d * 4,
        lambda parts: (ptr(values), ptr(indices), ptr(out), ptr(parts[0]), i64(n), i32(d),
                       i32(k)), values.device)
    return out, sums[0]


def _partial_sums_launch(func, defines, n, d, count, smem_per_warp, args, device):
    """Launch the dense-row kernel ``func`` over ``n`` rows on persistent warps, each writing
    ``count`` rows of ``d`` partial sums (``args(parts)`` gives its arguments); returns
    those sums added up over the warps in a fixed order (``count`` x ``d``)."""
    config, warps = heuristics.layer_norm_config(d)
    kern = kernel("dense_rows", func, dict(config, **defines), device.index)
    smem = warps * smem_per_warp
    blocks = grid(kern, warps, smem, n, True, device.index)
    parts = torch.empty((count, blocks * warps, d), dtype=torch.float32, device=device)
    launch(kern, blocks, warps * 32, args(parts), smem, device)
    return parts.sum(1)


def cbsr_gather(dense: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    (n, d), k = dense.shape, indices.shape[1]
    out = torch.empty((n, k), dtype=dense.dtype, device=dense.device)
    if n == 0 or k == 0:
        return out
    defines, threads = heuristics.gather_config(dense, indices)
    kern = kernel("dense_rows", "cbsr_gather", defines, dense.device.index)
    launch(kern, -(-(n * k) // threads), threads,
           (ptr(dense), ptr(indices), ptr(out), i32(n * k), i32(d), i32(k)), 0, dense.device)
    return out


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    y = torch.empty_like(x)
    mean, rstd = (torch.empty((n, 1), dtype=torch.float32, device=x.device) for _ in range(2))
    if n == 0:
        return y, mean, rstd
    defines, warps = heuristics.layer_norm_config(d)
    kern = kernel("dense_rows", "layer_norm", defines, x.device.index)
    launch(kern, -(-n // warps), warps * 32,
           (ptr(x), ptr(weight), ptr(bias), ptr(y), ptr(mean), ptr(rstd), i64(n), i32(d),
            np.float32(eps)), 0, x.device)
    return y, mean, rstd


def layer_norm_backward(grad_y: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor,
                        weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, [dweight; dbias])."""
    return _layer_norm_backward("layer_norm_backward", (ptr(grad_y),), x, mean, rstd, weight)


def layer_norm_backward_cbsr(grad_values: torch.Tensor, grad_indices: torch.Tensor,
                             x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                             weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`layer_norm_backward` with dy as CBSR (grad_values, grad_indices) of x's width:
    each warp makes its row of dy in shared memory."""
    return _layer_norm_backward(
        "layer_norm_backward_cbsr",
        (ptr(grad_values), ptr(grad_indices), i32(grad_values.shape[1])), x, mean, rstd,
        weight, {"IDX_BYTES": grad_indices.element_size()}, smem_per_warp=x.shape[1] * 4)


def _layer_norm_backward(func, dy_args, x, mean, rstd, weight, defines=None,
                         smem_per_warp=0):
    """Launch the LayerNorm backward kernel ``func`` (dy given by ``dy_args``, its first
    arguments) on persistent warps; their partial sums of the weight and bias gradients are
    added up here, in a fixed order."""
    n, d = x.shape
    dx = torch.empty_like(x)
    if n == 0:
        return dx, x.new_zeros((2, d))
    return dx, _partial_sums_launch(
        func, defines or {}, n, d, 2, smem_per_warp,
        lambda parts: (*dy_args, ptr(x), ptr(mean), ptr(rstd), ptr(weight), ptr(dx),
                       ptr(parts[0]), ptr(parts[1]), i64(n), i32(d)), x.device)


def cbsr_spgemm(group_row: torch.Tensor, group_start: torch.Tensor, col: torch.Tensor,
                edge_values: Optional[torch.Tensor], row_scale: Optional[torch.Tensor],
                x_values: torch.Tensor, x_indices: torch.Tensor, num_dst: int, d: int,
                multi_rows: torch.Tensor) -> torch.Tensor:
    """``edge_values`` (one per CSR entry) or None (each edge 1, then ``row_scale``, one per
    destination row, if not None). ``multi_rows``: the rows of several groups, whose partial
    sums meet by atomic adds: zeroed first, and only they (the kernel stores every other row
    whole)."""
    k = x_values.shape[1]
    num_groups = group_row.numel()
    y = torch.empty((num_dst, d), dtype=torch.float32, device=x_values.device)
    if multi_rows.numel():
        _zero_rows(y, multi_rows)
    if num_groups == 0:
        return y
    config = heuristics.spgemm_config(k, d, x_values, x_indices, edge_values)
    entries = _entries(config[0]["P_PACKED"], x_values, x_indices)
    _launch_over_groups(
        "cbsr_spgemm", config, num_groups, x_values.device,
        (ptr(group_row), ptr(group_start), ptr(col), _ptr_or_null(edge_values),
         _ptr_or_null(row_scale), ptr(entries), ptr(x_indices), ptr(y), i64(num_groups), i32(k),
         i32(d)))
    return y


def _entries(form: int, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """X's entries as the forward gathers them (``launch.spgemm_entries``): the values as
    they are (the kernel reads the indices apart), or each entry's value bits and index
    written side by side, in place (no temporaries): half-precision values as int16 pairs
    (one 32-bit word, value low, index high, little-endian), fp32 ones as int32 pairs."""
    if form == heuristics.ENTRIES_APART:
        return values
    half = form == heuristics.ENTRIES_PACKED
    word = torch.int16 if half else torch.int32
    pairs = torch.empty((*values.shape, 2), dtype=word, device=values.device)
    pairs[..., 0] = values.view(word)
    pairs[..., 1] = indices  # uint8 widened; int16 (< MAX_WIDTH: non-negative) copied
    return pairs.flatten(-2).view(torch.int32) if half else pairs


def _zero_rows(y: torch.Tensor, rows: torch.Tensor) -> None:
    """Zeros over ``rows`` (int64) of fp32 ``y`` (a memset's speed a row; torch's
    ``index_fill_`` took three times that: H200, 107k of 233k rows of 256)."""
    warps = heuristics.option("dense_rows", "warps")
    kern = kernel("dense_rows", "zero_rows", {"ELEM_BYTES": 4, "WARPS": warps}, y.device.index)
    launch(kern, -(-rows.numel() // warps), warps * 32,
           (ptr(rows), ptr(y), i64(rows.numel()), i32(y.shape[1])), 0, y.device)


def cbsr_sspmm(group_row: torch.Tensor, group_start: torch.Tensor, group_end: torch.Tensor,
               col: torch.Tensor, edge_values: Optional[torch.Tensor],
               row_scale: Optional[torch.Tensor], grad_y: torch.Tensor,
               x_indices: torch.Tensor) -> torch.Tensor:
    """Group g covers CSR entries [group_start[g], group_end[g]) (``group_start[1:]`` for
    the forward's groups, or a walk of ``GraphPlan.source_slices``); A's values as in
    :func:`cbsr_spgemm`."""
    n_src, k = x_indices.shape
    d = grad_y.shape[1]
    dx = torch.zeros((n_src, k), dtype=torch.float32, device=grad_y.device)
    num_groups = group_row.numel()
    if num_groups == 0 or n_src == 0 or col.numel() == 0:
        return dx
    _launch_over_groups(
        "cbsr_sspmm", heuristics.sspmm_config(k, d, grad_y, x_indices, edge_values), num_groups,
        grad_y.device,
        (ptr(group_row), ptr(group_start), ptr(col), ptr(group_end), _ptr_or_null(edge_values),
         _ptr_or_null(row_scale), ptr(grad_y), ptr(x_indices), ptr(dx), i64(num_groups), i32(k),
         i32(d)))
    return dx


def cbsr_sddmm(group_row: torch.Tensor, group_start: torch.Tensor, col: torch.Tensor,
               grad_y: torch.Tensor, x_values: torch.Tensor,
               x_indices: torch.Tensor) -> torch.Tensor:
    k = x_values.shape[1]
    d = grad_y.shape[1]
    out = torch.empty(col.numel(), dtype=torch.float32, device=grad_y.device)
    num_groups = group_row.numel()
    if num_groups == 0 or col.numel() == 0:
        return out
    _launch_over_groups(
        "cbsr_sddmm", heuristics.sddmm_config(k, d, grad_y, x_values, x_indices), num_groups,
        grad_y.device, (ptr(group_row), ptr(group_start), ptr(col), ptr(grad_y), ptr(x_values),
                        ptr(x_indices), ptr(out), i64(num_groups), i32(k), i32(d)))
    return out


def block_degrees(graph_indptr: torch.Tensor, dst: torch.Tensor, fanout: int,
                  rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """min(in-degree, ``fanout``) of each node of ``dst`` (all for -1), int64; with
    ``rows`` (an int64 count on the device), 0 for the rows of ``dst`` past it."""
    n = dst.numel()
    out = torch.empty(n, dtype=torch.int64, device=dst.device)
    if n:
        defines, threads = heuristics.sample_config()
        kern = kernel("sample_neighbors", "block_degrees", defines, dst.device.index)
        launch(kern, -(-n // threads), threads,
               (ptr(graph_indptr), ptr(dst), _ptr_or_null(rows), ptr(out), i64(n), i32(fanout)),
               0, dst.device)
    return out


def sample_edges(graph_indptr: torch.Tensor, graph_indices: torch.Tensor,
                 graph_edge_ids: Optional[torch.Tensor], dst: torch.Tensor,
                 block_indptr: torch.Tensor, draws: Optional[torch.Tensor], num_edges: int,
                 fanout: int, rows: Optional[torch.Tensor] = None):
    """(source ids in the graph's dtype, edge ids int64 or None) of the sampled in-edges
    (int32 or int64 ids, as :class:`~dgl_maxk.sampling.DeviceGraph` checks them) of the
    nodes of ``dst``, or of its first ``rows`` (an int64 count on the device)."""
    sources = torch.empty(num_edges, dtype=graph_indices.dtype, device=dst.device)
    edge_ids = (None if graph_edge_ids is None else
                torch.empty(num_edges, dtype=torch.int64, device=dst.device))
    n = dst.numel()
    if n == 0 or num_edges == 0:
        return sources, edge_ids
    defines, threads = heuristics.sample_config()
    if fanout > defines["MAX_FANOUT"]:  # the kernel's per-thread pick list
        raise ValueError(f"the sampling kernel takes fan-outs up to {defines['MAX_FANOUT']}, "
                         f"got {fanout}")
    defines = {**defines, "SRC_BYTES": graph_indices.element_size(),
               "EID_BYTES": 0 if graph_edge_ids is None else graph_edge_ids.element_size()}
    kern = kernel("sample_neighbors", "sample_edges", defines, dst.device.index)
    launch(kern, -(-n // threads), threads,
           (ptr(graph_indptr), ptr(graph_indices), _ptr_or_null(graph_edge_ids), ptr(dst),
            _ptr_or_null(rows), ptr(block_indptr), _ptr_or_null(draws), ptr(sources),
            _ptr_or_null(edge_ids), i64(n), i32(fanout)), 0, dst.device)
    return sources, edge_ids


def relabel_sources(dst: torch.Tensor, sources: torch.Tensor, block_indptr: torch.Tensor,
                    rows: Optional[torch.Tensor] = None, max_nodes: Optional[int] = None):
    """(src_nodes, local, counts) of a sampled block whose edges' sources (int32 or int64)
    fill ``sources`` up to ``block_indptr[-1]`` (the rest is room, ignored): the source nodes
    (``dst``, or its first ``rows`` where that int64 count on the device is given, then the
    new ones in the order of their first edge) and each edge's local id (int64), valid up
    to ``counts`` = [edges, source nodes] (int64, on the device). ``max_nodes``, the
    graph's node count, bounds the distinct nodes the hash table holds."""
    n, capacity = dst.numel(), sources.numel()
    distinct = n + capacity if max_nodes is None else min(n + capacity, max_nodes)
    src_nodes = torch.empty(n + capacity, dtype=torch.int64, device=dst.device)
    local = torch.empty(capacity, dtype=torch.int64, device=dst.device)
    counts = torch.empty(2, dtype=torch.int64, device=dst.device)
    # at most half the slots are taken: short probes
    log2_slots = max(1, (2 * distinct - 1).bit_length())
    table = torch.full((2 << log2_slots,), -1, dtype=torch.int64, device=dst.device)
    new_rank = torch.empty(capacity, dtype=torch.int64, device=dst.device)
    _, threads = heuristics.sample_config()
    defines = {"SRC_BYTES": sources.element_size()}
    positions = -(-(n + capacity) // threads)
    common = (i64(n), i64(capacity), i32(log2_slots))
    launch(kernel("relabel_sources", "relabel_insert", defines, dst.device.index), positions,
           threads, (ptr(dst), _ptr_or_null(rows), ptr(sources), ptr(block_indptr),
                     ptr(table)) + common, 0, dst.device)
    if capacity:
        launch(kernel("relabel_sources", "relabel_flags", defines, dst.device.index),
               -(-capacity // threads), threads,
               (ptr(sources), ptr(block_indptr), ptr(table), ptr(new_rank)) + common, 0,
               dst.device)
        new_rank.cumsum_(0)
    launch(kernel("relabel_sources", "relabel_assign", defines, dst.device.index), positions,
           threads, (ptr(dst), _ptr_or_null(rows), ptr(sources), ptr(block_indptr),
                     ptr(table), ptr(new_rank), ptr(src_nodes), ptr(local), ptr(counts))
           + common, 0, dst.device)
    return src_nodes, local, counts


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` (int64, on the GPU) of ``table`` (contiguous; device memory or pinned
    host memory, read through its device pointer) on the index's GPU."""
    n = index.numel()
    out = torch.empty((n,) + table.shape[1:], dtype=table.dtype, device=index.device)
    row_bytes = math.prod(table.shape[1:]) * table.element_size()
    if n == 0 or row_bytes == 0:
        return out
    source = table.data_ptr()
    if not table.is_cuda:
        import cupy
        # pinned host memory: its address in the device's space (the host's, under UVA)
        with cupy.cuda.Device(index.device.index):
            source = cupy.cuda.runtime.pointerGetAttributes(source).devicePointer
        if not source:
            raise RuntimeError("this pinned host memory is not mapped into the GPU's address "
                               "space; pin it with torch's pin_memory()")
    defines, warps = heuristics.gather_rows_config(row_bytes, table, out)
    kern = kernel("gather_rows", "gather_rows", defines, index.device.index)
    word = defines["WORD_BYTES"]
    launch(kern, -(-n // warps), warps * 32,
           (np.uint64(source), ptr(index), ptr(out), i64(n), i64(row_bytes // word)), 0,
           index.device)
    return out


def nan_counters(x: torch.Tensor) -> torch.Tensor:
    """[NaN count, numel - flat position of the first NaN] of ``x`` (contiguous fp32, fp16
    or bf16, on the GPU) as uint64 counters in an int64 tensor: one read of ``x``."""
    counters = torch.zeros(2, dtype=torch.int64, device=x.device)
    if x.numel() == 0:
        return counters
    defines, warps = heuristics.nan_counters_config(x)
    kern = kernel("nan_counters", "nan_counters", defines, x.device.index)
    words = x.numel() * x.element_size() // defines["WORD_BYTES"]
    blocks = grid(kern, warps, 0, -(-words // (32 * defines["UNROLL"])), True,
                  x.device.index)
    launch(kern, blocks, warps * 32, (ptr(x), i64(words), i64(x.numel()), ptr(counters)), 0,
           x.device)
    return counters


def _elementwise_launch(func: str, numel: int, args, device):
    """Launch ``func`` of relu_dropout.cu with a thread per 4 elements."""
    warps = heuristics.option("relu_dropout", "warps")
    kern = kernel("relu_dropout", func, {"WARPS": warps}, device.index)
    launch(kern, -(-numel // (4 * 32 * warps)), 32 * warps, args, 0, device)


def relu_dropout(x: torch.Tensor, seed: Optional[torch.Tensor], p: float, num_head: int,
                 nan_stats: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(x)
    head = x.new_empty((num_head,) + x.shape[1:])
    if x.numel():
        # kept where the element's 32 random bits reach ceil(p 2^32): never at p = 1
        threshold = 0 if p == 0 else min(math.ceil(p * 2 ** 32), 2 ** 32)
        _elementwise_launch(
            "relu_dropout", x.numel(),
            (ptr(x), ptr(out), ptr(head), i64(x.numel() // 4), i64(head.numel() // 4),
             _ptr_or_null(seed), np.uint64(threshold),
             np.float32(reference.dropout_scale(p, torch.float32)), _ptr_or_null(nan_stats)),
            x.device)
    return out, head


def relu_dropout_backward(out: torch.Tensor, grad: torch.Tensor, grad_head: torch.Tensor,
                          p: float) -> torch.Tensor:
    grad_x = torch.empty_like(out)
    if out.numel():
        _elementwise_launch(
            "relu_dropout_backward", out.numel(),
            (ptr(out), ptr(grad), ptr(grad_head), ptr(grad_x), i64(out.numel() // 4),
             i64(grad_head.numel() // 4), np.float32(reference.dropout_scale(p, torch.float32))),
            out.device)
    return grad_x
