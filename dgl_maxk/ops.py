"""The MaxK operators: MaxK to CBSR, and aggregation of CBSR (or dense) features over a graph.

Three thin layers per operator: an autograd ``Function`` that calls the backend chosen for the
tensor (:func:`dgl_maxk.backends.for_tensor`: the CUDA kernels, or the pure-torch reference),
and the documented function below that checks its inputs and calls the Function.

Aggregations return the dtype of the features they were given and accumulate in fp32 (fp64
for fp64 features), outside autocast, so half-precision models stay in half precision as
DGL's do.
"""
from __future__ import annotations

import math

import torch

from . import backends
from ._dgl import DGLError
from .sparse import (CBSR, GraphPlan, check_features, check_k, check_nan_counters, graph_plan,
                     index_dtype, nan_counters)


class _MaxK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, k, nan_counters):
        values, indices = backends.for_tensor(h).maxk_cbsr(h, k, nan_counters)
        ctx.save_for_backward(indices)
        ctx.width = h.shape[1]
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, _grad_indices):
        (indices,) = ctx.saved_tensors
        return _dense_rows(grad_values, indices, ctx.width), None, None


def maxk(h: torch.Tensor, k: int, *, check_nan: bool = True) -> CBSR:
    r"""MaxK nonlinearity: keep the k largest entries of each row of ``h`` (sign kept).

    .. math:: \mathrm{MaxK}(h)_{ij} = h_{ij} \text{ if } h_{ij} \text{ is among the k largest
              of row } i, \text{ else } 0

    Exactly k entries per row survive (ties go to the lower column), returned as :class:`CBSR`
    (columns ascending on the CPU; on the GPU in the order its aggregation kernel reads
    fastest). The gradient flows to the kept positions only. Values are kept as
    they are: a row of ``-inf`` keeps k ``-inf`` values (ReLU would zero them), which makes
    the layers' outputs for it NaN; mask such rows first.

    Parameters
    ----------
    h : Tensor, shape (N, d), floating point
    k : int, 1 <= k <= d
    check_nan : bool
        Check ``h`` for NaN (found by the top-k kernel as it reads ``h``; reading the result
        is a GPU synchronisation unless inside ``dgl_maxk.deferred_checks()``; off inside
        ``dgl_maxk.input_checks(False)``).
    """
    return maxk_checked(h, k, "maxk input" if check_nan else None)


def maxk_checked(h: torch.Tensor, k: int, nan_name: str | None, norm=None) -> CBSR:
    """:func:`maxk`, its NaN check naming the input ``nan_name`` (None: no NaN check); with
    ``norm`` = (weight, bias, eps), MaxK of the LayerNorm of ``h`` (:func:`layer_norm_maxk`;
    the NaN check then reads the normalised rows)."""
    check_features(nan_name or "maxk input", h, nan=False)
    if h.dim() != 2:
        raise ValueError(f"{nan_name or 'maxk input'} must be N x d, got shape "
                         f"{tuple(h.shape)}")
    d = h.shape[1]
    k = check_k(k, d)
    index_dtype(d)  # rejects widths CBSR cannot index
    counters = nan_counters(h) if nan_name is not None else None
    if norm is None:
        values, indices = _MaxK.apply(h, k, counters)
    else:
        values, indices = _LayerNormMaxK.apply(h, *norm, k, counters)
    check_nan_counters(nan_name, h.shape, counters)
    return CBSR(values, indices, d, True)  # maxk's pattern is valid by construction


class _LayerNormMaxK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, k, nan_counters):
        values, indices, mean, rstd = backends.for_tensor(x).layer_norm_maxk(
            x, weight, bias, eps, k, nan_counters)
        ctx.save_for_backward(x, weight, bias, mean, rstd, indices)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, _grad_indices):
        x, weight, bias, mean, rstd, indices = ctx.saved_tensors
        grads = backends.for_tensor(x).layer_norm_backward_cbsr(
            grad_values, indices, x, mean, rstd, weight, bias, ctx.needs_input_grad[:3])
        return (*grads, None, None, None)


def layer_norm_maxk(x: torch.Tensor, k: int, weight, bias, eps: float = 1e-5, *,
                    check_nan: bool = True) -> CBSR:
    """``maxk(layer_norm(x, (d,), weight, bias, eps), k)`` as one operator: on a GPU one kernel
    normalises each row and takes its top k (the normalised rows are never written), and
    the backward takes MaxK's k-sparse gradient straight into the LayerNorm's (its dense
    gradient is never made either): one N x d pass less each way. It keeps ``x``, not the
    normalised rows, for the backward. ``check_nan`` scans the normalised rows as
    :func:`maxk` does. Without weight and bias, for input other than N x d, or under
    autocast: the two operators one after the other."""
    name = "features" if check_nan else None
    if x.dim() != 2 or weight is None or bias is None or _autocast_enabled(x.device.type):
        return maxk_checked(layer_norm(x, x.shape[-1:], weight, bias, eps), k, name)
    return maxk_checked(x, k, name, norm=(weight, bias, eps))


class _ToDense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, indices, d):
        ctx.save_for_backward(indices)
        return backends.for_tensor(values).cbsr_to_dense(values, indices, d)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        return _pattern_entries(grad, indices), None, None


def _dense_rows(values, indices, d):
    """The dense rows of CBSR (values, indices) inside a backward: recorded for a second
    derivative when the backward itself builds a graph (``create_graph=True``)."""
    if torch.is_grad_enabled():
        return _ToDense.apply(values, indices, d)
    return backends.for_tensor(values).cbsr_to_dense(values, indices, d)


def _pattern_entries(dense, indices):
    """The entries of ``dense`` at a CBSR pattern inside a backward (the gradient of
    :func:`_dense_rows`): torch's differentiable gather when the backward builds a graph,
    else the backend's."""
    if torch.is_grad_enabled():
        return dense.gather(1, indices.long())
    return backends.for_tensor(dense).cbsr_gather(dense, indices)


def cbsr_to_dense(x: CBSR) -> torch.Tensor:
    """The N x d dense matrix of CBSR ``x`` (zeros off its pattern), differentiable with
    respect to ``x.values``; also ``x.to_dense()``."""
    return _ToDense.apply(x.values, x.indices, x.d)


# the operators attach themselves to the type
CBSR.from_dense = staticmethod(maxk)
CBSR.to_dense = cbsr_to_dense


class _CBSRAddmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, c, values, indices, d, weight, inplace):
        ctx.save_for_backward(values, indices, weight)  # X as CBSR, not N x d
        ctx.d = d
        dense = backends.for_tensor(values).cbsr_to_dense(values, indices, d)
        if inplace:  # out-of-place addmm copies c into its result first: one N x d pass
            ctx.mark_dirty(c)
            return c.addmm_(dense, weight.t())
        return torch.addmm(c, dense, weight.t())

    @staticmethod
    def backward(ctx, grad):
        values, indices, weight = ctx.saved_tensors
        grad_values = grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_values = _pattern_entries(grad @ weight, indices)
        if ctx.needs_input_grad[4]:  # the dense rows again, for this one GEMM
            dense = _dense_rows(values, indices, ctx.d)
            grad_weight = grad.t() @ dense
        return ((grad if ctx.needs_input_grad[0] else None), grad_values, None, None,
                grad_weight, None)


def cbsr_addmm(c: torch.Tensor, x: CBSR, weight: torch.Tensor, *,
               inplace: bool = False) -> torch.Tensor:
    """``c + x.to_dense() @ weight.T`` (a Linear on CBSR rows, added to ``c`` in the GEMM's
    epilogue) that keeps ``x`` for the backward as CBSR, not as N x d dense rows: the dense
    rows are made again (one pass) for the weight's gradient. ``inplace=True`` adds into
    ``c`` and returns it (``c`` must not be needed elsewhere; it saves copying ``c``). Under
    autocast: torch's out-of-place ``addmm`` on the dense rows."""
    if _autocast_enabled(c.device.type):
        return torch.addmm(c, x.to_dense(), weight.t())
    return _CBSRAddmm.apply(c, x.values, x.indices, x.d, weight, inplace)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        return (torch.is_autocast_enabled() if device_type == "cuda"
                else torch.is_autocast_cpu_enabled())


class _Linear(torch.autograd.Function):
    generate_vmap_rule = True  # with setup_context: torch.func's transforms work on it

    @staticmethod
    def forward(x, weight, bias):
        return torch.addmm(bias, x, weight.t())

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, _ = inputs
        need_x, need_weight, _ = ctx.needs_input_grad
        ctx.save_for_backward(x if need_weight else None, weight if need_x else None)
        ctx.save_for_forward(x, weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        return (grad.mm(weight) if need[0] else None, grad.t().mm(x) if need[1] else None,
                grad.t().mv(grad.new_ones(grad.shape[0])) if need[2] else None)

    @staticmethod
    def jvp(ctx, x_t, weight_t, bias_t):
        x, weight = ctx.saved_tensors
        terms = [t for t in (None if x_t is None else x_t.mm(weight.t()),
                             None if weight_t is None else x.mm(weight_t.t()), bias_t)
                 if t is not None]
        return sum(terms[1:], terms[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``torch.nn.functional.linear`` whose bias gradient is a matrix-vector product (ones
    times the output's gradient) instead of torch's column sum, which reads tall rows at half
    the speed (H200, 233k x 256 fp32: 0.19 against 0.09 ms). 2-D input with a bias, outside
    autocast; otherwise torch's own."""
    if bias is None or x.dim() != 2 or _autocast_enabled(x.device.type):
        return torch.nn.functional.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = backends.for_tensor(x).layer_norm(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        grads = backends.for_tensor(x).layer_norm_backward(
            grad_y.contiguous(), x, mean, rstd, weight, bias, ctx.needs_input_grad[:3])
        return (*grads, None)


def layer_norm(x: torch.Tensor, normalized_shape, weight=None, bias=None,
               eps: float = 1e-5) -> torch.Tensor:
    """``torch.nn.functional.layer_norm``; on a GPU, 2-D fp32 input of width d % 4 == 0,
    d <= 1024 (the backward: d <= 512), with weight and bias runs dgl_maxk's kernels (one
    warp per row; the forward about three times faster than torch's on rows of 256). Under
    autocast, or for any other input, torch's own."""
    if (x.dim() != 2 or tuple(normalized_shape) != (x.shape[-1],) or weight is None
            or bias is None or _autocast_enabled(x.device.type)):  # torch's (or its error)
        return torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)
    return _LayerNorm.apply(x, weight, bias, eps)


class _CBSRSpGEMM(torch.autograd.Function):
    """Y = A X with A's values either ``edge_values`` (one per edge) or, where they are
    None, ``src_scale[c] * row_scale[r]`` (each None: 1): the source scale is applied to X's
    values, the row scale by the kernels once per row."""

    @staticmethod
    def forward(ctx, plan, edge_values, src_scale, row_scale, x_values, x_indices, d):
        ctx.plan = plan
        ctx.save_for_backward(edge_values, src_scale, row_scale, x_values, x_indices)
        values = x_values if src_scale is None else x_values * src_scale[:, None]
        y = backends.for_tensor(x_values).cbsr_spgemm(plan, edge_values, values, x_indices, d,
                                                      row_scale)
        return y.to(x_values.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        edge_values, src_scale, row_scale, x_values, x_indices = ctx.saved_tensors
        backend, grad_y = backends.for_tensor(grad_y), grad_y.contiguous()
        grad_edges = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_edges = backend.cbsr_sddmm(ctx.plan, grad_y, x_values, x_indices)
            grad_edges = grad_edges.to(edge_values.dtype)
        if ctx.needs_input_grad[4]:
            if src_scale is not None:  # scaled before the cast: unscaled half sums overflow
                grad_y = grad_y.to(torch.promote_types(grad_y.dtype, torch.float32))
            grad_x = backend.cbsr_sspmm(ctx.plan, edge_values, grad_y, x_indices, row_scale)
            if src_scale is not None:
                grad_x = grad_x * src_scale[:, None]
            grad_x = grad_x.to(x_values.dtype)
        return None, grad_edges, None, None, grad_x, None, None


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, edge_values, x):
        ctx.plan = plan
        ctx.save_for_backward(edge_values, x)
        return backends.reference.spmm(plan, edge_values, x).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        edge_values, x = ctx.saved_tensors
        grad_edges = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_edges = backends.reference.sddmm(ctx.plan, grad_y, x).to(edge_values.dtype)
        if ctx.needs_input_grad[2]:
            grad_x = backends.reference.spmm_transposed(ctx.plan, edge_values, grad_y)
            grad_x = grad_x.to(x.dtype)
        return None, grad_edges, grad_x


def check_edge_weight(edge_weight, num_edges: int, device):
    """Raise a DGLError or ValueError naming the problem unless ``edge_weight`` is None or
    one finite float per edge, shaped (E,) or (E, 1), on the CPU or on the features'
    ``device``. NaN and infinite weights are refused alike, in one scan: the MaxK layers
    aggregate before they project, where an infinite weight would meet zeros and give NaN
    where DGL gives +-inf, so every path refuses them."""
    if edge_weight is None:
        return
    if not isinstance(edge_weight, torch.Tensor):
        raise ValueError(f"edge_weight must be a torch.Tensor, got {type(edge_weight).__name__}")
    if edge_weight.device != torch.device(device) and edge_weight.device.type != "cpu":
        raise DGLError(f"edge_weight is on {edge_weight.device} but the features are on "
                       f"{device}")
    check_features("edge_weight", edge_weight, finite=True)
    if edge_weight.numel() != num_edges or edge_weight.dim() > 2 or (
            edge_weight.dim() == 2 and edge_weight.shape[1] != 1):
        raise DGLError(f"edge_weight must have one value per edge ({num_edges}), "
                       f"got shape {tuple(edge_weight.shape)}")


def _checked_plan(graph, x, num_src, edge_weight):
    """The plan of ``graph`` on ``x``'s device, checked against the features and weights."""
    plan = graph if isinstance(graph, GraphPlan) else graph_plan(graph, x.device)
    if plan.device != x.device:
        raise DGLError(f"the graph plan is on {plan.device} but the features are on "
                       f"{x.device}; build it with dgl_maxk.graph_plan(graph, device)")
    if num_src != plan.num_src:
        raise ValueError(f"features have {num_src} rows but the graph has {plan.num_src} "
                         "source nodes")
    check_edge_weight(edge_weight, plan.num_edges, x.device)
    return plan


def _scale_dtype(x):
    """The dtype of A's values for features ``x``: float64 for float64, else fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def cbsr_spgemm(graph, x: CBSR, edge_weight=None, norm: str = "none", *,
                check_nan: bool = True) -> torch.Tensor:
    r"""Aggregate CBSR features over a graph: :math:`Y = A X`, dense ``num_dst x d``.

    .. math:: Y_r = \sum_{e = (c \to r)} w_e \, s_{src}(c) \, s_{dst}(r) \, X_c

    with edge weights :math:`w` (1 without ``edge_weight``) and the node scales of ``norm``
    (DGL GraphConv's: 'none'; 'left' = 1/out-degree of c; 'right' = 1/in-degree of r, the
    mean; 'both' = both to the power -1/2; degrees clamped to at least 1). Y has the dtype of
    ``x.values`` (accumulated in fp32). The backward returns the gradient of ``x.values``
    (CBSR, sampled at X's pattern) and of ``edge_weight``.

    Parameters
    ----------
    graph : DGLGraph, DGL block or GraphPlan
        One edge type; on the CPU or on the device of ``x``.
    x : CBSR of shape (num_src, d)
    edge_weight : Tensor (num_edges,) or (num_edges, 1), optional
        Finite: NaN and +-inf raise a ValueError naming the first position.
    norm : 'none' | 'left' | 'right' | 'both'
    check_nan : bool
        Scan ``x.values`` for NaN (a GPU synchronisation); False for values scanned already.
    """
    if not isinstance(x, CBSR):
        raise ValueError(f"cbsr_spgemm takes CBSR features, got {type(x).__name__}")
    check_features("CBSR values", x.values, nan=check_nan)
    plan = _checked_plan(graph, x.values, x.shape[0], edge_weight)
    dtype = _scale_dtype(x.values)
    if edge_weight is None:  # A's values are node scales: no per-edge values to read
        return _CBSRSpGEMM.apply(plan, None, plan.node_scale(norm, "src", dtype),
                                 plan.node_scale(norm, "dst", dtype), x.values, x.indices,
                                 x.d)
    return _CBSRSpGEMM.apply(plan, plan.edge_values(norm, edge_weight, dtype), None, None,
                             x.values, x.indices, x.d)


def spmm(graph, x: torch.Tensor, edge_weight=None, norm: str = "none", *,
         check_nan: bool = True) -> torch.Tensor:
    """Aggregate dense features: :math:`Y = A X` with A as in :func:`cbsr_spgemm`.

    Runs ``torch.sparse.mm`` on a CSR tensor (cuSPARSE on GPUs, the kernel DGL uses there).
    Features with more than two dimensions are aggregated over their flattened trailing ones.
    Y has the dtype of ``x``. ``check_nan`` as in :func:`cbsr_spgemm`.
    """
    check_features("features", x, nan=check_nan)
    if x.dim() == 0:
        raise ValueError("features must have one row per source node, got a 0-d tensor")
    plan = _checked_plan(graph, x, x.shape[0], edge_weight)
    edge_values = plan.edge_values(norm, edge_weight, _scale_dtype(x))
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))  # also for 0 rows
    out = _SpMM.apply(plan, edge_values, flat)
    return out.reshape((plan.num_dst,) + tuple(x.shape[1:]))


def aggregate(graph, x, edge_weight=None, norm: str = "none", *,
              check_nan: bool = True) -> torch.Tensor:
    """:func:`cbsr_spgemm` for CBSR features, :func:`spmm` for dense ones."""
    if isinstance(x, CBSR):
        return cbsr_spgemm(graph, x, edge_weight, norm, check_nan=check_nan)
    return spmm(graph, x, edge_weight, norm, check_nan=check_nan)
