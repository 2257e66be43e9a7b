"""The CUDA backend: CBSR kernels compiled at run time through CuPy.

The functions below have the signatures and semantics of
:mod:`dgl_maxk.backends.reference`; the operators of :mod:`dgl_maxk.library` send CUDA
tensors here when :func:`available` is true. :mod:`.runtime` compiles and launches,
:mod:`.launch` holds the launch table, :mod:`.kernels` makes the launches.

Precision and determinism:

* ``maxk_cbsr``: exact (values copied bit for bit), deterministic; fp32, fp16, bf16 inputs.
* ``cbsr_to_dense``, ``cbsr_gather``: exact (raw bits copied), deterministic.
* ``cbsr_to_dense_sums``: the dense rows exact; the column sums fp32, deterministic
  (per-warp partial sums added in a fixed order), not bit-identical to torch's sum.
* ``layer_norm``, ``layer_norm_backward``: fp32, deterministic (the weight and bias
  gradients are per-warp partial sums added in a fixed order); not bit-identical to
  torch's kernels (another summation order).
* ``cbsr_spgemm``: fp32 accumulation. Rows of A with at most ``group_size`` entries (see
  :data:`.launch.DEFAULTS`) are summed in a fixed order and stored: bit-deterministic. Longer
  rows are split over several warps whose partial sums meet through global atomic adds: NOT
  bit-deterministic there (the rounding depends on the order of the adds).
* ``cbsr_sspmm``: global atomic adds into dX: NOT bit-deterministic.
* ``cbsr_sddmm``: no atomics, bit-deterministic.
* ``block_degrees``, ``sample_edges``: exact, deterministic (integer work on the
  reference's draws).
* ``gather_rows``: exact (raw bytes copied); reads rows of pinned host memory directly.
* ``nan_counters``: exact (integer counts; the first position is a maximum).
* float64 inputs are not run by the kernels: these functions fall back to the reference for
  them (same results, pure torch on the GPU).
"""
from __future__ import annotations

import torch

from .. import reference
from . import kernels, launch
from .launch import KERNEL_DTYPES
from .runtime import available

__all__ = ["available", "maxk_cbsr", "cbsr_to_dense", "cbsr_to_dense_sums", "cbsr_gather",
           "cbsr_spgemm", "cbsr_sspmm", "cbsr_sddmm", "layer_norm", "layer_norm_backward",
           "layer_norm_maxk", "layer_norm_backward_cbsr",
           "block_degrees", "sample_edges", "sample_block_edges", "samples_without_reads",
           "gather_rows", "nan_counters",
           "relu_dropout", "relu_dropout_backward", "launch"]


def maxk_cbsr(h: torch.Tensor, k: int, nan_stats=None):
    """The k largest entries of each row of ``h`` as CBSR (values, indices).

    Ties go to the lower column; values are copied bit for bit, and each row holds the
    reference's entries, in the order that spares the forward's shared-memory bank conflicts
    (``launch.bank_order``; ascending where that does not apply). fp32 / fp16 / bf16 run the
    kernel (one warp per row, threshold search over order-preserving keys), float64 the
    reference. ``nan_stats`` as in the reference (the kernel finds the NaN as it reads the
    rows).
    """
    if h.dtype not in KERNEL_DTYPES or h.dim() != 2:
        return reference.maxk_cbsr(h, k, nan_stats)
    return kernels.maxk_cbsr(h.contiguous(), int(k), nan_stats)


def cbsr_to_dense(values, indices, d: int):
    """The dense rows (N x d, values' dtype) of CBSR (values, indices): one pass, raw bits
    copied (bit-identical to the reference); float64 and rows wider than
    ``launch.DENSE_ROWS_MAX_WIDTH`` go to the reference."""
    if values.dtype not in KERNEL_DTYPES or d > launch.DENSE_ROWS_MAX_WIDTH:
        return reference.cbsr_to_dense(values, indices, d)
    return kernels.cbsr_to_dense(values.contiguous(), indices.contiguous(), int(d))


def cbsr_to_dense_sums(values, indices, d: int):
    """(dense rows, column sums) of CBSR (values, indices), as the reference: the dense
    rows exact, the sums in fp32 (float64 for float64), deterministic (per-warp partial sums
    added in a fixed order). The kernel takes fp32 values of width d % 4 == 0 up to
    ``launch.DENSE_ROWS_MAX_WIDTH``; anything else goes to the reference."""
    if values.dtype != torch.float32 or d % 4 or not 0 < d <= launch.DENSE_ROWS_MAX_WIDTH:
        return reference.cbsr_to_dense_sums(values, indices, d)
    return kernels.cbsr_to_dense_sums(values.contiguous(), indices.contiguous(), int(d))


def cbsr_gather(dense, indices):
    """The entries of ``dense`` (N x d) at the CBSR pattern ``indices`` (N x k, dense's
    dtype): raw bits copied, the indices read as they are (no int64 copy); float64, and
    2^31 entries or more, go to the reference."""
    if dense.dtype not in KERNEL_DTYPES or indices.numel() >= 2 ** 31:
        return reference.cbsr_gather(dense, indices)
    return kernels.cbsr_gather(dense.contiguous(), indices.contiguous())


def layer_norm(x, weight, bias, eps: float):
    """(y, mean, rstd) of a LayerNorm over the rows of ``x``, as the reference. The kernel
    takes fp32 rows of width d % 4 == 0, 0 < d <= ``launch.DENSE_ROWS_MAX_WIDTH``, 16-byte
    aligned, with fp32 weight and bias of width d; anything else goes to the reference."""
    if not _layer_norm_kernels_take(x, weight, bias, launch.DENSE_ROWS_MAX_WIDTH, bias):
        return reference.layer_norm(x, weight, bias, eps)
    return kernels.layer_norm(x, weight, bias, float(eps))


def _layer_norm_kernels_take(x, weight, bias, max_width, *rows) -> bool:
    """Whether the LayerNorm kernels take ``x``: 2-D fp32 rows of width 0 < d <= max_width
    read as float4 (with ``weight`` and ``rows``), and weight and bias of width d (else
    torch's error, not a read past them)."""
    d = x.shape[-1]
    return (x.dim() == 2 and 0 < d <= max_width and weight is not None and bias is not None
            and weight.shape == bias.shape == (d,) and launch.float4_rows(x, weight, *rows))


def layer_norm_maxk(x, weight, bias, eps: float, k: int, nan_stats=None):
    """(values, indices, mean, rstd): :func:`maxk_cbsr` of :func:`layer_norm`'s output. Where
    both kernels take the rows (fp32, float4 rows, d <= 1024) one kernel does both, with the
    LayerNorm kernel's arithmetic (the same bits), never writing the normalised rows."""
    if not _layer_norm_kernels_take(x, weight, bias, launch.DENSE_ROWS_MAX_WIDTH, bias):
        y, mean, rstd = layer_norm(x, weight, bias, eps)
        return (*maxk_cbsr(y, k, nan_stats), mean, rstd)
    return kernels.layer_norm_maxk(x, weight, bias, float(eps), int(k), nan_stats)


def layer_norm_backward(grad_y, x, mean, rstd, weight, bias, output_mask):
    """(dx, dweight, dbias) of :func:`layer_norm`, as the reference (None where
    ``output_mask`` says no). The kernel takes what the forward kernel takes, up to
    ``launch.LAYER_NORM_BACKWARD_MAX_WIDTH`` wide; the weight and bias gradients are summed
    in a fixed order (deterministic)."""
    if not _layer_norm_kernels_take(x, weight, bias, launch.LAYER_NORM_BACKWARD_MAX_WIDTH,
                                    grad_y):
        return reference.layer_norm_backward(grad_y, x, mean, rstd, weight, bias, output_mask)
    dx, sums = kernels.layer_norm_backward(grad_y, x, mean.contiguous(), rstd.contiguous(),
                                           weight)
    return tuple(g if need else None for g, need in zip((dx, sums[0], sums[1]), output_mask))


def layer_norm_backward_cbsr(grad_values, grad_indices, x, mean, rstd, weight, bias,
                             output_mask):
    """:func:`layer_norm_backward` for dy given as CBSR (``grad_values``, ``grad_indices``:
    MaxK's gradient when the LayerNorm feeds a MaxK), without making dy dense where the kernel
    applies (fp32 values; what :func:`layer_norm_backward`'s kernel takes)."""
    if not (grad_values.dtype == torch.float32 and _layer_norm_kernels_take(
            x, weight, bias, launch.LAYER_NORM_BACKWARD_MAX_WIDTH)):
        dy = cbsr_to_dense(grad_values, grad_indices, x.shape[-1])
        return layer_norm_backward(dy, x, mean, rstd, weight, bias, output_mask)
    dx, sums = kernels.layer_norm_backward_cbsr(grad_values.contiguous(),
                                                grad_indices.contiguous(), x, mean.contiguous(),
                                                rstd.contiguous(), weight)
    return tuple(g if need else None for g, need in zip((dx, sums[0], sums[1]), output_mask))


def _edge_groups(plan):
    return plan.edge_groups(launch.group_size())


def _values_dtype(edge_values, row_scale):
    """The dtype of A's values (``reference.given_values``), fp32 where none are given."""
    values = reference.given_values(edge_values, row_scale)
    return torch.float32 if values is None else values.dtype


def _fp32(t):
    """``t`` as contiguous fp32, None as None (the kernels' optional edge values and scales)."""
    return None if t is None else t.to(torch.float32).contiguous()


def cbsr_spgemm(plan, edge_values, x_values, x_indices, d, row_scale=None):
    """Y = A . X (num_dst x d, dense) for X = CBSR(x_values, x_indices) of width d, A's
    values ``edge_values`` or (None) each row's ``row_scale``.

    dtype = promote(x_values.dtype, the values' dtype); fp32 accumulation; float64 falls back
    to the reference.
    """
    dtype = torch.promote_types(x_values.dtype, _values_dtype(edge_values, row_scale))
    if dtype not in KERNEL_DTYPES or x_values.dtype not in KERNEL_DTYPES:
        return reference.cbsr_spgemm(plan, edge_values, x_values, x_indices, d, row_scale)
    group_row, group_start, col, multi_rows = _edge_groups(plan)
    y = kernels.cbsr_spgemm(group_row, group_start, col, _fp32(edge_values), _fp32(row_scale),
                            x_values.contiguous(), x_indices.contiguous(), plan.num_dst,
                            int(d), multi_rows)
    return y if dtype == torch.float32 else y.to(dtype)


def cbsr_sspmm(plan, edge_values, grad_y, x_indices, row_scale=None):
    """dX_cbsr[c, j] = sum_r A[r, c] * dY[r, x_indices[c, j]] (num_src x k, grad_y's dtype),
    A's values as in :func:`cbsr_spgemm`.

    fp32 accumulation with global atomic adds; float64 falls back to the reference.
    """
    if (grad_y.dtype not in KERNEL_DTYPES
            or _values_dtype(edge_values, row_scale) == torch.float64):
        return reference.cbsr_sspmm(plan, edge_values, grad_y, x_indices, row_scale)
    group_row, group_start, col, _ = _edge_groups(plan)
    group_end = group_start[1:]
    slices = launch.sspmm_slices(plan.num_src, plan.num_edges, x_indices.shape[1],
                                 plan.num_dst * grad_y.shape[1] * 4)  # dY staged as fp32
    if slices > 1 and plan.rows_sorted_by_source():  # dX beyond L2, sources reused
        group_row, group_start, group_end = plan.source_slices(launch.group_size(), slices)
    dx = kernels.cbsr_sspmm(group_row, group_start, group_end, col, _fp32(edge_values),
                            _fp32(row_scale), _fp32(grad_y), x_indices.contiguous())
    return dx if grad_y.dtype == torch.float32 else dx.to(grad_y.dtype)


def cbsr_sddmm(plan, grad_y, x_values, x_indices):
    """dA[e] = sum_j dY[r_e, x_indices[c_e, j]] * x_values[c_e, j] for each CSR entry e.

    The gradient of ``cbsr_spgemm`` with respect to ``edge_values`` (CSR order, grad_y's
    dtype); no atomics; float64 falls back to the reference.
    """
    if grad_y.dtype not in KERNEL_DTYPES or x_values.dtype not in KERNEL_DTYPES:
        return reference.cbsr_sddmm(plan, grad_y, x_values, x_indices)
    group_row, group_start, col, _ = _edge_groups(plan)
    out = kernels.cbsr_sddmm(group_row, group_start, col, grad_y.to(torch.float32).contiguous(),
                             x_values.contiguous(), x_indices.contiguous())
    return out if grad_y.dtype == torch.float32 else out.to(grad_y.dtype)


def block_degrees(graph_indptr, dst, fanout: int, rows=None):
    """The reference's block degrees, in one kernel."""
    return kernels.block_degrees(graph_indptr, dst.contiguous(), fanout, rows)


def samples_without_reads(fanout: int) -> bool:
    """Whether :func:`sample_block_edges` samples with ``fanout`` (-1: all in-edges) in its
    kernels, nothing read back to the host (larger fan-outs go to the reference, which
    counts the rows first)."""
    return fanout <= launch.option("sample_neighbors", "max_fanout")


def sample_edges(graph_indptr, graph_indices, graph_edge_ids, dst, block_indptr,
                 num_edges: int, fanout: int, draws):
    """The reference's sampled in-edges (the same sources and edge ids), read at the picked
    positions by the picking kernel itself: one thread per row (fan-outs up to
    ``launch.DEFAULTS['sample_neighbors']['max_fanout']``; larger ones go to the
    reference)."""
    if not samples_without_reads(fanout):
        return reference.sample_edges(graph_indptr, graph_indices, graph_edge_ids, dst,
                                      block_indptr, num_edges, fanout, draws)
    return _picked_edges(graph_indptr, graph_indices, graph_edge_ids, dst.contiguous(),
                         block_indptr, num_edges, fanout, draws)


def _picked_edges(graph_indptr, graph_indices, graph_edge_ids, dst, block_indptr,
                  num_edges: int, fanout: int, draws, rows=None):
    """The picking kernel's sources and edge ids, for ``dst`` (contiguous) or its first
    ``rows``."""
    return kernels.sample_edges(graph_indptr, graph_indices.contiguous(),
                                None if graph_edge_ids is None else graph_edge_ids.contiguous(),
                                dst, block_indptr, draws, num_edges, fanout, rows)


def sample_block_edges(graph_indptr, graph_indices, graph_edge_ids, dst, block_indptr,
                       capacity: int, fanout: int, draws, rows=None):
    """The reference's block (the same source nodes, local ids and edge ids, up to the same
    counts) in four kernels, nothing read back to the host: the edges are picked into room
    for ``capacity`` of them (at least ``block_indptr[-1]``, not read) and relabelled in
    three passes over a hash table (``kernels/relabel_sources.cu``), in place of
    ``torch.unique``'s sort and the dozen torch calls around it."""
    if not samples_without_reads(fanout) or not dst.numel():
        return reference.sample_block_edges(graph_indptr, graph_indices, graph_edge_ids, dst,
                                            block_indptr, capacity, fanout, draws, rows)
    dst = dst.contiguous()
    sources, edge_ids = _picked_edges(graph_indptr, graph_indices, graph_edge_ids, dst,
                                      block_indptr, capacity, fanout, draws, rows)
    src_nodes, local, counts = kernels.relabel_sources(dst, sources, block_indptr, rows,
                                                       graph_indptr.numel() - 1)
    return src_nodes, local, edge_ids, counts


def nan_counters(x):
    """The reference's NaN counters, in one read of ``x`` (contiguous fp32, fp16 or bf16;
    other tensors go to the reference)."""
    if x.dtype not in KERNEL_DTYPES or not x.is_contiguous():
        return reference.nan_counters(x)
    return kernels.nan_counters(x)


def gather_rows(table, index):
    """Rows ``index`` of ``table`` on the index's GPU, by the row gather kernel: from the
    GPU's memory (twice index_select's bytes a second on an H200: 550k random rows of 416
    bytes, 0.16 against 0.34 ms) or from pinned host memory, read row by row over the bus (no
    copy of the table, no host work). Other tables go to the reference (torch's index_select;
    a host table that is not pinned is gathered on the host, then copied)."""
    if not (table.is_contiguous() and table.dim() >= 1 and (table.is_cuda or table.is_pinned())):
        return reference.gather_rows(table, index)
    return kernels.gather_rows(table, index.to(torch.int64).contiguous())


def _relu_dropout_kernels_take(*tensors) -> bool:
    """fp32, contiguous, 16-byte aligned, rows of a multiple of 4 elements (the kernels move
    4 at a time, and a head of whole rows is whole words)."""
    return all(t.dtype == torch.float32 and t.is_contiguous() and t.data_ptr() % 16 == 0
               and t.dim() >= 1 and (t.numel() // max(t.shape[0], 1)) % 4 == 0
               for t in tensors)


def relu_dropout(x, seed, p: float, num_head: int, nan_stats=None):
    """(out, head) as the reference, in one pass; the dropout's mask from Philox4x32-10 bits
    under ``seed`` (an int64 on the GPU, drawn by torch's generator), so that a seed gives
    one mask. Tensors the kernel does not take (``_relu_dropout_kernels_take``), and p > 0
    without a seed, go to the reference."""
    if not _relu_dropout_kernels_take(x) or (p > 0 and seed is None):
        return reference.relu_dropout(x, seed, p, num_head, nan_stats)
    return kernels.relu_dropout(x, seed, p, num_head, nan_stats)


def relu_dropout_backward(out, grad, grad_head, p: float):
    """The reference's gradient, in one pass."""
    if not _relu_dropout_kernels_take(out, grad, grad_head):
        return reference.relu_dropout_backward(out, grad, grad_head, p)
    return kernels.relu_dropout_backward(out, grad, grad_head, p)
