"""The MaxK operators: MaxK to CBSR, and aggregation of CBSR (or dense) features over a graph.

Each operator is a ``torch.autograd.Function`` over one backend: the CUDA kernels of
:mod:`dgl_maxk.cuda` for CUDA tensors when CuPy can run them, the pure-torch functions of
:mod:`dgl_maxk.reference` otherwise (same signatures, same results). Setting the environment
variable ``DGL_MAXK_BACKEND=torch`` forces the pure-torch path everywhere.
"""
from __future__ import annotations

import numbers
import os

import torch

from . import reference
from ._dgl import DGLError
from .cbsr import CBSR, index_dtype
from .graph_plan import GraphPlan, graph_plan

#: Validate operator inputs (NaN scan included). The scan synchronises with the GPU once per
#: call; a tuned training loop may turn it off after its first steps.
CHECK_INPUTS = True


def backend_for(tensor: torch.Tensor):
    """The module whose kernels serve ``tensor``: dgl_maxk.cuda or dgl_maxk.reference."""
    if tensor.is_cuda and os.environ.get("DGL_MAXK_BACKEND", "auto") != "torch":
        from . import cuda
        if cuda.available():
            return cuda
    return reference


def check_features(name: str, x: torch.Tensor, rows: int | None = None, nan: bool = True):
    """Raise a ValueError naming the problem if ``x`` cannot be aggregated. ``nan=False``
    skips the NaN scan (for tensors the caller has scanned already)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name} has {x.shape[0]} rows but the graph has {rows} nodes there")
    if CHECK_INPUTS and nan:
        bad = torch.isnan(x)
        if bad.any():
            where = bad.nonzero()[0].tolist()
            raise ValueError(f"{name} contains {int(bad.sum())} NaN value(s), the first at "
                             f"index {tuple(where)}")


class _MaxK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, k):
        values, indices = backend_for(h).maxk_cbsr(h, k)
        ctx.save_for_backward(indices)
        ctx.width = h.shape[1]
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, _grad_indices):
        (indices,) = ctx.saved_tensors
        grad = grad_values.new_zeros((grad_values.shape[0], ctx.width))
        return grad.scatter_(1, indices.long(), grad_values), None


def maxk(h: torch.Tensor, k: int, *, check_nan: bool = True) -> CBSR:
    r"""MaxK nonlinearity: keep the k largest entries of each row of ``h`` (sign kept).

    .. math:: \mathrm{MaxK}(h)_{ij} = h_{ij} \text{ if } h_{ij} \text{ is among the k largest
              of row } i, \text{ else } 0

    Exactly k entries per row survive (ties go to the lower column), returned as :class:`CBSR`
    with ascending columns. The gradient flows to the kept positions only.

    Parameters
    ----------
    h : Tensor, shape (N, d), floating point
    k : int, 1 <= k <= d
    check_nan : bool
        Scan ``h`` for NaN (a GPU synchronisation); the layers pass False for inputs they
        have scanned already.
    """
    check_features("maxk input", h, nan=check_nan)
    if h.dim() != 2:
        raise ValueError(f"maxk input must be N x d, got shape {tuple(h.shape)}")
    d = h.shape[1]
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= d:
        raise ValueError(f"k must be an integer in [1, d = {d}], got {k!r}")
    k = int(k)
    index_dtype(d)  # rejects widths CBSR cannot index
    values, indices = _MaxK.apply(h, k)
    return CBSR(values, indices, d, True)  # maxk's pattern is valid by construction


class _CBSRSpGEMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, edge_values, x_values, x_indices, d):
        ctx.plan = plan
        ctx.save_for_backward(edge_values, x_values, x_indices)
        return backend_for(x_values).cbsr_spgemm(plan, edge_values, x_values, x_indices, d)

    @staticmethod
    def backward(ctx, grad_y):
        edge_values, x_values, x_indices = ctx.saved_tensors
        backend, grad_y = backend_for(grad_y), grad_y.contiguous()
        grad_edges = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_edges = backend.cbsr_sddmm(ctx.plan, grad_y, x_values, x_indices)
            grad_edges = grad_edges.to(edge_values.dtype)
        if ctx.needs_input_grad[2]:
            grad_x = backend.cbsr_sspmm(ctx.plan, edge_values, grad_y, x_indices)
            grad_x = grad_x.to(x_values.dtype)
        return None, grad_edges, grad_x, None, None


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, edge_values, x):
        ctx.plan = plan
        ctx.save_for_backward(edge_values, x)
        return reference.spmm(plan, edge_values, x)

    @staticmethod
    def backward(ctx, grad_y):
        edge_values, x = ctx.saved_tensors
        grad_edges = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_edges = reference.sddmm(ctx.plan, grad_y, x).to(edge_values.dtype)
        if ctx.needs_input_grad[2]:
            grad_x = reference.spmm_transposed(ctx.plan, edge_values, grad_y).to(x.dtype)
        return None, grad_edges, grad_x


def check_edge_weight(edge_weight, num_edges: int, device):
    """Raise a DGLError or ValueError naming the problem unless ``edge_weight`` is None or
    one float per edge, shaped (E,) or (E, 1), on the CPU or on the features' ``device``."""
    if edge_weight is None:
        return
    if not isinstance(edge_weight, torch.Tensor):
        raise ValueError(f"edge_weight must be a torch.Tensor, got {type(edge_weight).__name__}")
    if edge_weight.device != torch.device(device) and edge_weight.device.type != "cpu":
        raise DGLError(f"edge_weight is on {edge_weight.device} but the features are on "
                       f"{device}")
    check_features("edge_weight", edge_weight)
    if edge_weight.numel() != num_edges or edge_weight.dim() > 2 or (
            edge_weight.dim() == 2 and edge_weight.shape[1] != 1):
        raise DGLError(f"edge_weight must have one value per edge ({num_edges}), "
                       f"got shape {tuple(edge_weight.shape)}")


def _plan_and_edges(graph, x, num_src, norm, edge_weight):
    plan = graph if isinstance(graph, GraphPlan) else graph_plan(graph, x.device)
    if num_src != plan.num_src:
        raise ValueError(f"features have {num_src} rows but the graph has {plan.num_src} "
                         "source nodes")
    check_edge_weight(edge_weight, plan.num_edges, x.device)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return plan, plan.edge_values(norm, edge_weight, dtype)


def cbsr_spgemm(graph, x: CBSR, edge_weight=None, norm: str = "none", *,
                check_nan: bool = True) -> torch.Tensor:
    r"""Aggregate CBSR features over a graph: :math:`Y = A X`, dense ``num_dst x d``.

    .. math:: Y_r = \sum_{e = (c \to r)} w_e \, s_{src}(c) \, s_{dst}(r) \, X_c

    with edge weights :math:`w` (1 without ``edge_weight``) and the node scales of ``norm``
    (DGL GraphConv's: 'none'; 'left' = 1/out-degree of c; 'right' = 1/in-degree of r, the
    mean; 'both' = both to the power -1/2; degrees clamped to at least 1). The backward returns
    the gradient of ``x.values`` (CBSR, sampled at X's pattern) and of ``edge_weight``.

    Parameters
    ----------
    graph : DGLGraph, DGL block or GraphPlan
        One edge type; on the CPU or on the device of ``x``.
    x : CBSR of shape (num_src, d)
    edge_weight : Tensor (num_edges,) or (num_edges, 1), optional
    norm : 'none' | 'left' | 'right' | 'both'
    check_nan : bool
        Scan ``x.values`` for NaN (a GPU synchronisation); False for values scanned already.
    """
    if not isinstance(x, CBSR):
        raise ValueError(f"cbsr_spgemm takes CBSR features, got {type(x).__name__}")
    check_features("CBSR values", x.values, nan=check_nan)
    plan, edge_values = _plan_and_edges(graph, x.values, x.shape[0], norm, edge_weight)
    return _CBSRSpGEMM.apply(plan, edge_values, x.values, x.indices, x.d)


def spmm(graph, x: torch.Tensor, edge_weight=None, norm: str = "none", *,
         check_nan: bool = True) -> torch.Tensor:
    """Aggregate dense features: :math:`Y = A X` with A as in :func:`cbsr_spgemm`.

    Runs ``torch.sparse.mm`` on a CSR tensor (cuSPARSE on GPUs, the kernel DGL uses there).
    Features with more than two dimensions are aggregated over their flattened trailing ones.
    ``check_nan`` as in :func:`cbsr_spgemm`.
    """
    check_features("features", x, nan=check_nan)
    plan, edge_values = _plan_and_edges(graph, x, x.shape[0], norm, edge_weight)
    flat = x.reshape(x.shape[0], -1)
    out = _SpMM.apply(plan, edge_values, flat)
    return out.reshape((plan.num_dst,) + tuple(x.shape[1:]))


def aggregate(graph, x, edge_weight=None, norm: str = "none", *,
              check_nan: bool = True) -> torch.Tensor:
    """:func:`cbsr_spgemm` for CBSR features, :func:`spmm` for dense ones."""
    if isinstance(x, CBSR):
        return cbsr_spgemm(graph, x, edge_weight, norm, check_nan=check_nan)
    return spmm(graph, x, edge_weight, norm, check_nan=check_nan)
