"""The MaxK operators: MaxK to CBSR, and aggregation of CBSR (or dense) features over a graph.

Three thin layers per operator: the documented function below checks its inputs and calls
the operator of :mod:`dgl_maxk.library` (a ``torch.library`` custom op, so ``torch.compile``
captures it whole; eager calls take an autograd ``Function`` of the same pieces), which
hands the tensors to the backend chosen for their device
(:func:`dgl_maxk.backends.for_tensor`: the CUDA kernels, or the pure-torch reference).

Aggregations return the dtype of the features they were given and accumulate in fp32 (fp64
for fp64 features), outside autocast, so half-precision models stay in half precision as
DGL's do.
"""
from __future__ import annotations

import math

import torch

from . import backends, library
from ._custom_ops import tracing
from ._dgl import DGLError
from .sparse import (CBSR, GraphPlan, check_features, check_k, check_nan_counters,
                     checks_enabled, graph_plan, index_dtype)
from .sparse.plan import check_norm


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


def maxk_checked(h: torch.Tensor, k: int, nan_name: str | None, norm=None,
                 linear=None) -> CBSR:
    """:func:`maxk`, its NaN check naming the input ``nan_name`` (None: no NaN check); with
    ``norm`` = (weight, bias, eps), MaxK of the LayerNorm of ``h`` (:func:`layer_norm_maxk`;
    the NaN check then reads the normalised rows); with ``linear`` = (weight, bias), MaxK of
    ``h @ weight.T + bias`` (:func:`linear_maxk`; the check reads the Linear's output)."""
    check_features(nan_name or "maxk input", h, nan=False)
    if h.dim() != 2:
        raise ValueError(f"{nan_name or 'maxk input'} must be N x d, got shape "
                         f"{tuple(h.shape)}")
    d = h.shape[1] if linear is None else linear[0].shape[0]
    k = check_k(k, d)
    index_dtype(d)  # rejects widths CBSR cannot index
    count = nan_name is not None and checks_enabled()  # counted as the top-k reads h
    if linear is not None:
        values, indices, counters = library.linear_maxk(h, *linear, k, count)
    elif norm is None:
        values, indices, counters = library.maxk_cbsr(h, k, count)
    else:
        values, indices, _, _, counters = library.layer_norm_maxk(h, *norm, k, count)
    if count:
        check_nan_counters(nan_name, (h.shape[0], d), counters)
    return CBSR(values, indices, d, True)  # maxk's pattern is valid by construction


def linear_maxk(x: torch.Tensor, k: int, weight: torch.Tensor, bias=None, *,
                check_nan: bool = True) -> CBSR:
    """``maxk(linear(x, weight, bias), k)`` as one operator, whose backward makes MaxK's
    k-sparse gradient dense once, for the weight's GEMM, and takes the bias gradient from
    the same pass (the two operators read the dense gradient again for it: one N x d pass
    less). ``check_nan`` scans the Linear's output as :func:`maxk` does. Without a bias, for
    input other than dense N x d, or under autocast: the two operators one after the other.

    Example
    -------
    >>> lin = torch.nn.Linear(16, 32)
    >>> linear_maxk(torch.randn(5, 16), 4, lin.weight, lin.bias).values.shape
    torch.Size([5, 4])
    """
    name = "maxk input" if check_nan else None
    if (x.dim() != 2 or x.layout != torch.strided or bias is None
            or _autocast_enabled(x.device.type)):
        return maxk_checked(linear(x, weight, bias), k, name)
    return maxk_checked(x, k, name, linear=(weight, bias))


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


def relu_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, *,
                 num_head: int = 0, check_nan: bool = True):
    """``dropout(relu(x), p, training)`` as one operator, and a copy of its first
    ``num_head`` rows: ``(out, head)``.

    A layer on a block reads its source rows and, apart, its destination rows (the first
    ``num_head``), which DGL's layers take as a view: given ``(out, head)`` instead,
    autograd hands the two gradients to this operator's backward, which adds them as it
    reads them, where a view's gradient would be padded with zeros to out's shape and
    added to out's (two N x d passes). On GPUs one kernel reads ``x`` once, scanning it for
    NaN as it goes (``check_nan``, as :func:`maxk`), and writes ``out`` (and ``head``); the
    backward reads ``out`` and the gradients once, and keeps no mask. The kernel's mask comes
    from Philox4x32-10 bits under a seed that torch's generator draws for each call: one mask
    for one ``torch.manual_seed``, a new one on each CUDA graph replay, but other bits than
    torch's dropout. Elsewhere, and for tensors other than fp32 of rows of a multiple of 4
    elements: torch's ReLU and dropout. A dropped +inf gives NaN, as in torch (inf x 0),
    and there the backward passes the gradient, where torch's gives 0.

    Example
    -------
    >>> out, head = relu_dropout(torch.randn(6, 8), 0.5, num_head=2)
    >>> torch.equal(out[:2], head)
    True
    """
    check_features("features", x, nan=False)
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if x.dim() == 0 or not 0 <= num_head <= x.shape[0]:
        raise ValueError(f"num_head must be a row count of features of shape "
                         f"{tuple(x.shape)}, got {num_head}")
    p = float(p) if training else 0.0
    seed = (torch.randint(2 ** 62, (), dtype=torch.int64, device=x.device)
            if p > 0 and x.is_cuda else None)
    count = check_nan and checks_enabled()
    out, head, counters = library.relu_dropout(x, seed, p, int(num_head), count)
    if count:
        check_nan_counters("features", tuple(x.shape), counters)
    return out, head


def cbsr_to_dense(x: CBSR) -> torch.Tensor:
    """The N x d dense matrix of CBSR ``x`` (zeros off its pattern), differentiable with
    respect to ``x.values``; also ``x.to_dense()``."""
    return library.cbsr_to_dense(x.values, x.indices, x.d)


# the operators attach themselves to the type
CBSR.from_dense = staticmethod(maxk)
CBSR.to_dense = cbsr_to_dense


def cbsr_addmm(c: torch.Tensor, x: CBSR, weight: torch.Tensor, *,
               inplace: bool = False) -> torch.Tensor:
    """``c + x.to_dense() @ weight.T`` (a Linear on CBSR rows, added to ``c`` in the GEMM's
    epilogue) that keeps ``x`` for the backward as CBSR, not as N x d dense rows: the dense
    rows are made again (one pass) for the weight's gradient. ``inplace=True`` adds into
    ``c`` and returns it (``c`` must not be needed elsewhere; it saves copying ``c``; under
    ``torch.compile`` the compiler decides). Under autocast: torch's out-of-place ``addmm``
    on the dense rows."""
    if _autocast_enabled(c.device.type):
        return torch.addmm(c, x.to_dense(), weight.t())
    if inplace and not tracing():
        return library.CBSRAddmmInPlace.apply(c, x.values, x.indices, x.d, weight)
    return library.cbsr_addmm(c, x.values, x.indices, x.d, weight)


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
    autocast and ``torch.compile`` (which makes its own reduction, and cannot trace a
    Function with a forward-mode rule); otherwise torch's own."""
    if bias is None or x.dim() != 2 or _autocast_enabled(x.device.type) or tracing():
        return torch.nn.functional.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


def layer_norm(x: torch.Tensor, normalized_shape, weight=None, bias=None,
               eps: float = 1e-5) -> torch.Tensor:
    """``torch.nn.functional.layer_norm``; on a GPU, 2-D fp32 input of width d % 4 == 0,
    d <= 1024 (the backward: d <= 512), with weight and bias runs dgl_maxk's kernels (one
    warp per row; the forward about three times faster than torch's on rows of 256). Under
    autocast, or for any other input, torch's own."""
    if (x.dim() != 2 or tuple(normalized_shape) != (x.shape[-1],) or weight is None
            or bias is None or _autocast_enabled(x.device.type)):  # torch's (or its error)
        return torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)
    return library.layer_norm(x, weight, bias, eps)[0]


def check_dense_features(name: str, x, nan: bool = True):
    """:func:`~dgl_maxk.sparse.check_features` (``nan``: with the NaN scan), whose NaN scan
    of a GPU tensor is one pass of a kernel (:func:`dgl_maxk.library.nan_counters`; torch's
    takes three on a large tensor: the mask, its count, its first position). The same
    errors, recorded alike inside :func:`~dgl_maxk.deferred_checks`."""
    on_gpu = (isinstance(x, torch.Tensor) and not tracing()
              and backends.for_tensor(x) is backends.cuda)
    check_features(name, x, nan=nan and not on_gpu)
    if nan and on_gpu and checks_enabled():
        check_nan_counters(name, x.shape, library.nan_counters(x))


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


def _checked_plan(graph, x, num_src, edge_weight, norm):
    """The plan of ``graph`` on ``x``'s device, checked against the features, weights and
    ``norm``."""
    check_norm(norm)
    plan = graph if isinstance(graph, GraphPlan) else graph_plan(graph, x.device)
    if plan.device != x.device:
        raise DGLError(f"the graph plan is on {plan.device} but the features are on "
                       f"{x.device}; build it with dgl_maxk.graph_plan(graph, device)")
    if num_src != plan.num_src:
        raise ValueError(f"features have {num_src} rows but the graph has {plan.num_src} "
                         "source nodes")
    check_edge_weight(edge_weight, plan.num_edges, x.device)
    return plan


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
    plan = _checked_plan(graph, x.values, x.shape[0], edge_weight, norm)
    return library.cbsr_spgemm(plan.indptr, plan.indices, plan.num_src,
                               _csr_weights(plan, edge_weight), norm, x.values, x.indices, x.d)


def _csr_weights(plan, edge_weight):
    return None if edge_weight is None else plan.csr_order(edge_weight)


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
    plan = _checked_plan(graph, x, x.shape[0], edge_weight, norm)
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))  # also for 0 rows
    out = library.spmm(plan.indptr, plan.indices, plan.num_src, _csr_weights(plan, edge_weight),
                       norm, flat)
    return out.reshape((plan.num_dst,) + tuple(x.shape[1:]))


def aggregate(graph, x, edge_weight=None, norm: str = "none", *,
              check_nan: bool = True) -> torch.Tensor:
    """:func:`cbsr_spgemm` for CBSR features, :func:`spmm` for dense ones."""
    if isinstance(x, CBSR):
        return cbsr_spgemm(graph, x, edge_weight, norm, check_nan=check_nan)
    return spmm(graph, x, edge_weight, norm, check_nan=check_nan)
