"""Pure-torch implementations of the CBSR kernels.

They run on any device and are the reference the CUDA kernels (``kernels/<name>.cu``,
launched by the function of the same name in :mod:`dgl_maxk.backends.cuda`) are tested against.
Written for exactness first: no loops over nodes or edges, no dense N x N matrices; per-edge
intermediates are processed in chunks of bounded size.

Shapes: the plan's A is num_dst x num_src in CSR over destination rows with values
``edge_values`` (one per CSR entry); the CBSR aggregations also take ``edge_values=None``
with ``row_scale`` (one per destination row, or None: 1 in fp32), A then holding row r's
scale at each of its entries. A CBSR matrix is ``values`` (N x k) with ``indices`` (N x k,
columns in [0, d)).
"""
from __future__ import annotations

import warnings

import torch

from ..sparse.cbsr import index_dtype
from ..sparse.checks import nan_scan

# Per-edge intermediates are at most this many elements at a time.
_CHUNK_ELEMENTS = 1 << 24


def maxk_cbsr(h: torch.Tensor, k: int, nan_stats=None):
    """The k largest entries of each row of ``h`` as CBSR (values, indices).

    Ties are broken towards the lower column (as a stable descending sort would); each row's
    indices are ascending. The k-th largest value of each row comes from ``torch.topk``; the
    entries above it are kept, and as many entries equal to it as are still needed, lowest
    columns first. Inputs with NaN (which ``torch.sort`` ranks highest and no comparison
    matches) take the sort itself.

    ``nan_stats``, optional: two int64 counters (zeroed by the caller) that receive the NaN
    count of ``h`` (added to [0]) and ``h.numel()`` minus the flat position of its first NaN
    (the maximum of [1] and that, when ``h`` holds NaN).
    """
    if nan_stats is not None:
        _add_nan_stats(nan_stats, h)
    n, d = h.shape
    if n == 0:
        return h.new_empty((0, k)), torch.empty((0, k), dtype=index_dtype(d), device=h.device)
    if bool(torch.isnan(h).any()):
        top = torch.sort(h, dim=1, descending=True, stable=True).indices[:, :k]
        indices = top.sort(dim=1).values
    else:
        kth = torch.topk(h, k, dim=1).values[:, k - 1:k]
        greater = h > kth
        tied = h == kth
        need = k - greater.sum(1, keepdim=True)
        keep = greater | (tied & (tied.cumsum(1) <= need))
        indices = keep.nonzero()[:, 1].view(n, k)
    return h.gather(1, indices), indices.to(index_dtype(d))


def cbsr_to_dense(values: torch.Tensor, indices: torch.Tensor, d: int) -> torch.Tensor:
    """The dense rows (N x d, values' dtype) of CBSR (values, indices)."""
    out = values.new_zeros((values.shape[0], d))
    return out.scatter_(1, indices.long(), values)


def cbsr_to_dense_sums(values: torch.Tensor, indices: torch.Tensor,
                       d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense rows, column sums) of CBSR (values, indices): the sums in fp32 (float64 for
    float64 values), e.g. a Linear's bias gradient from MaxK's gradient of its output."""
    dense = cbsr_to_dense(values, indices, d)
    acc = torch.float64 if values.dtype == torch.float64 else torch.float32
    return dense, dense.sum(0, dtype=acc)


def cbsr_gather(dense: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The entries of ``dense`` (N x d) at the CBSR pattern ``indices`` (N x k)."""
    return dense.gather(1, indices.long())


def layer_norm(x: torch.Tensor, weight, bias, eps: float):
    """(y, mean, rstd) of a LayerNorm over the last dimension of ``x`` (torch's own)."""
    return torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)


def layer_norm_backward(grad_y, x, mean, rstd, weight, bias, output_mask):
    """(dx, dweight, dbias) of :func:`layer_norm` (torch's own; None where ``output_mask``
    is False)."""
    return torch.ops.aten.native_layer_norm_backward(grad_y, x, [x.shape[-1]], mean, rstd,
                                                     weight, bias, list(output_mask))


def layer_norm_maxk(x, weight, bias, eps: float, k: int, nan_stats=None):
    """(values, indices, mean, rstd): :func:`maxk_cbsr` of :func:`layer_norm`'s output."""
    y, mean, rstd = layer_norm(x, weight, bias, eps)
    return (*maxk_cbsr(y, k, nan_stats), mean, rstd)


def layer_norm_backward_cbsr(grad_values, grad_indices, x, mean, rstd, weight, bias,
                             output_mask):
    """:func:`layer_norm_backward` for dy given as CBSR (``grad_values``, ``grad_indices``)
    of x's width."""
    dy = cbsr_to_dense(grad_values, grad_indices, x.shape[-1])
    return layer_norm_backward(dy, x, mean, rstd, weight, bias, output_mask)


def _add_nan_stats(nan_stats, h):
    """The counters of :func:`maxk_cbsr`'s ``nan_stats``, on the device (no host sync)."""
    count, first = nan_scan(h)
    nan_stats[0] += count
    from_end = torch.where(count > 0, h.numel() - first, torch.zeros_like(first))
    nan_stats[1] = torch.maximum(nan_stats[1], from_end)


def nan_counters(x: torch.Tensor) -> torch.Tensor:
    """[NaN count, numel - flat position of the first NaN] of ``x`` (both 0 without NaN),
    int64 on its device: the counters of :func:`maxk_cbsr`'s ``nan_stats`` for any tensor."""
    counters = torch.zeros(2, dtype=torch.int64, device=x.device)
    _add_nan_stats(counters, x)
    return counters


def dropout_scale(p: float, dtype: torch.dtype) -> float:
    """What dropout at probability ``p`` multiplies kept values by, rounded to ``dtype``'s
    precision (0 at p = 1, where every value is dropped)."""
    return 0.0 if p == 1 else torch.tensor(1 / (1 - p), dtype=dtype).item()


def relu_dropout(x: torch.Tensor, seed, p: float, num_head: int, nan_stats=None):
    """(out, head): torch's dropout at probability ``p`` (none at 0) of ``relu(x)``, and a
    copy of out's first ``num_head`` rows. ``seed`` is the CUDA kernel's (its mask's bits);
    here torch's generator draws the mask. ``nan_stats`` as in :func:`maxk_cbsr`, for x."""
    if nan_stats is not None:
        _add_nan_stats(nan_stats, x)
    out = torch.relu(x)
    if p > 0:
        out = torch.nn.functional.dropout(out, p)
    return out, out[:num_head].clone(memory_format=torch.contiguous_format)


def relu_dropout_backward(out, grad, grad_head, p: float):
    """The gradient of :func:`relu_dropout`'s ``x`` from those of ``out`` and ``head``:
    (grad, plus grad_head on the first rows) times the dropout's scale where out != 0 (a
    kept, positive value), else 0; scaled as torch's dropout scales on the device (fp32
    for half precision on GPUs, the tensor's dtype elsewhere)."""
    if grad_head.shape[0]:
        grad = torch.cat((grad[:grad_head.shape[0]] + grad_head, grad[grad_head.shape[0]:]))
    acc = torch.float32 if grad.is_cuda and grad.element_size() < 4 else grad.dtype
    scaled = (grad.to(acc) * dropout_scale(p, acc)).to(grad.dtype)
    return torch.where(out != 0, scaled, 0)


def _sparse_adjacency(indptr, indices, values, shape):
    # The plan's CSR is valid by construction: skip torch's invariant checks (and their
    # warning about skipping them) and its beta-state notice.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
        return torch.sparse_csr_tensor(indptr, indices, values, shape,
                                       check_invariants=False)


def given_values(edge_values, row_scale):
    """A's values as the aggregations take them: ``edge_values`` or ``row_scale`` (None for
    both: all 1), not both (the kernels read one or the other)."""
    if edge_values is not None and row_scale is not None:
        raise ValueError("A's values are edge_values or row_scale, not both")
    return edge_values if edge_values is not None else row_scale


def entry_values(plan, edge_values, row_scale):
    """A's value at each CSR entry: ``edge_values``, else each row's scale (``row_scale``,
    or 1 in fp32) repeated over its entries."""
    values = given_values(edge_values, row_scale)
    if values is None:
        return torch.ones(plan.num_edges, dtype=torch.float32, device=plan.device)
    if values is edge_values:
        return edge_values
    return torch.repeat_interleave(row_scale, plan.in_degrees, output_size=plan.num_edges)


def cbsr_spgemm(plan, edge_values, x_values, x_indices, d, row_scale=None):
    """Y = A . X (num_dst x d, dense) for X = CBSR(x_values, x_indices) of width d."""
    edge_values = entry_values(plan, edge_values, row_scale)
    dtype = torch.promote_types(x_values.dtype, edge_values.dtype)
    x_dense = x_values.new_zeros((plan.num_src, d), dtype=dtype)
    x_dense.scatter_(1, x_indices.long(), x_values.to(dtype))
    return spmm(plan, edge_values, x_dense)


def _edge_sum(rows, cols, values, x, num_rows):
    """out[rows[e]] += values[e] * x[cols[e]], edge by edge (chunked)."""
    out = x.new_zeros((num_rows, x.shape[1]))
    step = max(1, _CHUNK_ELEMENTS // max(1, x.shape[1]))
    for start in range(0, rows.numel(), step):
        sl = slice(start, start + step)
        out.index_add_(0, rows[sl], x[cols[sl]] * values[sl, None])
    return out


def _csr_mm(indptr, indices, rows, values, x, shape):
    """A . x for A in CSR. Summed edge by edge instead where torch's sparse product fails:
    cuSPARSE rejects a CSR holding more entries than rows x columns, which a small
    multigraph can have, and the sparse tensor's gradient merges repeated entries (a
    multigraph's), which a double backward through edge values needs one per edge."""
    dtype = torch.promote_types(x.dtype, values.dtype)
    values, x = values.to(dtype), x.to(dtype)
    with torch.autocast(x.device.type, enabled=False):
        if indices.numel() == 0:
            return x.new_zeros((shape[0], x.shape[1]))
        if (indices.numel() > shape[0] * shape[1]
                or (values.requires_grad and torch.is_grad_enabled())):
            return _edge_sum(rows, indices, values, x, shape[0])
        return torch.sparse.mm(_sparse_adjacency(indptr, indices, values, shape), x)


def spmm(plan, edge_values, x):
    """Y = A . X for dense X (num_src x d): what cuSPARSE computes for DGL on GPUs.

    Computed in the wider of the two dtypes (fp32 for half-precision features), outside
    autocast, which would otherwise hand torch.sparse.mm half-precision operands.
    """
    return _csr_mm(plan.indptr, plan.indices, plan.dst_of_edge, edge_values, x,
                   (plan.num_dst, plan.num_src))


def spmm_transposed(plan, edge_values, grad_y):
    """A^T . dY (num_src x d), in the wider of the two dtypes."""
    t_indptr, t_indices, perm = plan.transpose()
    return _csr_mm(t_indptr, t_indices, plan.indices[perm], edge_values[perm], grad_y,
                   (plan.num_src, plan.num_dst))


def cbsr_sspmm(plan, edge_values, grad_y, x_indices, row_scale=None):
    """dX_cbsr[c, j] = sum_r A[r, c] * dY[r, x_indices[c, j]]: (A^T dY) sampled at X's pattern."""
    edge_values = entry_values(plan, edge_values, row_scale)
    return spmm_transposed(plan, edge_values, grad_y).gather(1, x_indices.long())


def _accumulating(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the dtype sums are taken in: fp32 for half precision, as the kernels do."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def cbsr_sddmm(plan, grad_y, x_values, x_indices):
    """dA[e] = sum_j dY[r_e, x_indices[c_e, j]] * x_values[c_e, j], each CSR entry e = (r_e, c_e).

    The gradient of ``cbsr_spgemm`` with respect to ``edge_values``.
    """
    k, d = x_values.shape[1], grad_y.shape[1]
    grad_y = _accumulating(grad_y)
    flat = grad_y.reshape(-1)
    out = grad_y.new_empty(plan.num_edges)
    step = max(1, _CHUNK_ELEMENTS // k)
    for start in range(0, plan.num_edges, step):
        rows = plan.dst_of_edge[start:start + step]
        cols = plan.indices[start:start + step]
        picked = flat[rows[:, None] * d + x_indices[cols].long()]
        out[start:start + step] = (picked * x_values[cols].to(grad_y.dtype)).sum(1)
    return out


def sddmm(plan, grad_y, x):
    """dA[e] = dY[r_e] . X[c_e]: the gradient of ``spmm`` with respect to ``edge_values``."""
    grad_y = _accumulating(grad_y)
    out = grad_y.new_empty(plan.num_edges)
    step = max(1, _CHUNK_ELEMENTS // max(1, x.shape[1]))
    for start in range(0, plan.num_edges, step):
        rows = plan.dst_of_edge[start:start + step]
        cols = plan.indices[start:start + step]
        out[start:start + step] = (grad_y[rows] * x[cols].to(grad_y.dtype)).sum(1)
    return out


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of ``table`` (any device), on the index's device."""
    return table.index_select(0, index.to(table.device)).to(index.device, non_blocking=True)


def block_degrees(graph_indptr, dst, fanout: int, rows=None):
    """min(in-degree, ``fanout``) of each node of ``dst`` in the graph of in-edge row
    pointers ``graph_indptr`` (all its in-edges for ``fanout`` < 0), int64: the rows of the
    block that :func:`sample_edges` fills; with ``rows`` (a count, 0-d, on dst's device),
    0 for the rows of ``dst`` past it, whatever they hold (room)."""
    if rows is not None:
        real = torch.arange(dst.numel(), device=dst.device) < rows
        dst = torch.where(real, dst, 0)
    degree = graph_indptr[dst + 1] - graph_indptr[dst]
    degree = degree if fanout < 0 else degree.clamp(max=fanout)
    return degree if rows is None else degree * real


def sample_edges(graph_indptr, graph_indices, graph_edge_ids, dst, block_indptr,
                 num_edges: int, fanout: int, draws):
    """(sources, edge ids) of the in-edges that :func:`sample_neighbors` picks: the graph's
    ``graph_indices`` (in their dtype) and ``graph_edge_ids`` (int64; None without them) at
    the picked positions."""
    positions = sample_neighbors(graph_indptr, dst, block_indptr, num_edges, fanout, draws)
    return (graph_indices[positions],
            None if graph_edge_ids is None else graph_edge_ids[positions].long())


def samples_without_reads(fanout: int) -> bool:
    """False: :func:`sample_block_edges` counts the rows it is given on the host."""
    return False


def sample_block_edges(graph_indptr, graph_indices, graph_edge_ids, dst, block_indptr,
                       capacity: int, fanout: int, draws, rows=None):
    """(src_nodes, local ids, edge ids, counts) of the block whose rows ``block_indptr``
    gives, for the nodes of ``dst`` (its first ``rows`` where that count is given, 0-d on
    dst's device, the rest room): :func:`sample_edges`' picks, relabelled by
    :func:`relabel_sources`; ``counts`` = [edges, source nodes] (int64, on dst's device),
    up to which the others hold the block. ``capacity`` bounds the edge count for backends
    that size the block before counting it; here it is counted."""
    if rows is not None:
        real = int(rows)
        dst, block_indptr = dst[:real], block_indptr[:real + 1]
        draws = None if draws is None else draws[:real]
    num_edges = int(block_indptr[-1])
    sources, edge_ids = sample_edges(graph_indptr, graph_indices, graph_edge_ids, dst,
                                     block_indptr, num_edges, fanout, draws)
    src_nodes, local = relabel_sources(dst, sources)
    counts = torch.tensor([num_edges, src_nodes.numel()], device=dst.device)
    return src_nodes, local, edge_ids, counts


def relabel_sources(dst, neighbours):
    """(src_nodes, local ids of ``neighbours``), int64: a block's source nodes are ``dst``
    (distinct) in its order, then the other neighbours in the order of their first
    appearance, as DGL's ``to_block`` numbers them."""
    n = dst.numel()
    nodes, inverse = torch.unique(torch.cat([dst.to(neighbours.dtype), neighbours]),
                                  return_inverse=True)
    positions = torch.arange(inverse.numel(), device=dst.device)
    first = torch.full((nodes.numel(),), inverse.numel(), dtype=torch.int64,
                       device=dst.device).scatter_reduce_(0, inverse, positions, "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(),
                                                                   device=dst.device))
    return nodes[order].long(), rank[inverse[n:]]


def sample_neighbors(graph_indptr, dst, block_indptr, num_edges: int, fanout: int, draws):
    """The sampled in-edges of each node of ``dst`` as positions (int64) in the graph's
    in-edge CSR ``graph_indptr``, in the order of the block's CSR ``block_indptr``
    (``num_edges`` entries, min(in-degree, ``fanout``) a row): all of a node's in-edges when
    its in-degree is at most ``fanout`` (or ``fanout`` < 0), else the uniform
    ``fanout``-subset that Floyd's algorithm picks with the row's ``draws`` (n x fanout,
    float64 in [0, 1)): step j draws t = floor(u_j * (top + 1)) with top = degree - fanout + j,
    and keeps top instead when t was drawn before. Only the rows above the fan-out are drawn
    for, in O(fanout log fanout) each, without reading anything back to the host.
    """
    n = dst.numel()
    start = graph_indptr[dst]
    degree = graph_indptr[dst + 1] - start
    row = torch.repeat_interleave(torch.arange(n, device=dst.device),
                                  block_indptr[1:] - block_indptr[:-1], output_size=num_edges)
    offset = torch.arange(num_edges, device=dst.device) - block_indptr[row]
    # each row above the fan-out holds exactly fanout of the block's entries
    max_sampled = min(n, num_edges // fanout) if fanout > 0 else 0
    if max_sampled == 0:
        return start[row] + offset
    sampled = degree > fanout
    count = torch.cumsum(sampled, 0)
    # the s-th sampled row is the first whose running count reaches s; slots past the last
    # sampled row hold the last row, whose picks no entry reads
    rows = torch.searchsorted(count, torch.arange(1, max_sampled + 1, device=dst.device))
    rows = rows.clamp(max=n - 1)
    chosen = _floyd_picks(degree[rows].clamp(min=fanout), draws[rows], fanout)
    offset = torch.where(sampled[row], chosen[(count[row] - 1).clamp(min=0), offset], offset)
    return start[row] + offset


def _floyd_picks(degree, draws, fanout: int):
    """Floyd's picks (rows x fanout) for rows of ``degree`` >= ``fanout``, all steps at once.

    The set after steps 0..j-1 is every value drawn so far plus top_i of each step i < j that
    collided, as top_i exceeds all earlier values. So step j collides when its draw t repeats
    an earlier draw, or t = top_i (i = t - top_0 < j) and step i collided: an OR along a chain
    of earlier steps, which pointer jumping resolves in ceil(log2(fanout)) rounds.
    """
    step = torch.arange(fanout, device=degree.device)
    top = degree[:, None] - fanout + step
    drawn = torch.minimum((draws * (top + 1)).long(), top)
    # repeats of an earlier draw: equal neighbours in a stable sort, all but the first
    ordered, order = torch.sort(drawn, dim=1, stable=True)
    collided = torch.zeros_like(drawn, dtype=torch.bool).scatter_(
        1, order[:, 1:], ordered[:, 1:] == ordered[:, :-1])
    earlier = drawn - top[:, :1]
    link = torch.where((earlier >= 0) & (earlier < step), earlier, step)
    for _ in range((fanout - 1).bit_length()):
        collided |= collided.gather(1, link)
        link = link.gather(1, link)
    return torch.where(collided, top, drawn)
