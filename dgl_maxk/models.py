"""The MaxK-GNN models of the paper (MaxK-GNN, ASPLOS 2024), each also runnable with ReLU.

- GraphSAGE: lin_in -> L x [MaxK -> SAGEConv(d, d, 'mean', feat_drop=p, norm=LayerNorm)] ->
  lin_out
- GCN: relu(lin_in) -> L x [Linear(d, d) -> MaxK -> Dropout(p) -> GraphConv(d, d,
  weight=False, norm='both') -> LayerNorm] -> lin_out
- GIN: as GCN with GINConv('sum', learn_eps=True) in place of GraphConv.

``nonlinearity='relu'`` puts ReLU where MaxK is, and aggregates dense features. ``graph`` is
a DGLGraph (full-graph training) or a list of one block per layer (mini-batch training).
Under ReLU each layer's ReLU and dropout run as one operator
(:func:`dgl_maxk.ops.relu_dropout`) where no hook watches them.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn import functional as F

from .nn import GINConv, GraphConv, LayerNorm, SAGEConv
from .ops import linear, linear_maxk, maxk, relu_dropout
from .sparse import CBSR, check_k, graph_plan, input_checks

NONLINEARITIES = ("maxk", "relu")


def aligned_width(width: int) -> int:
    """``width`` rounded up to a multiple of 8: rows of that many fp32 or bf16 values start
    16 bytes apart, as cuBLAS's fast GEMM kernels need."""
    return -(-int(width) // 8) * 8


def aligned_features(x: torch.Tensor) -> torch.Tensor:
    """Dense features (N x F) with zero columns appended up to :func:`aligned_width`, for a
    model built with ``padded_input=True``; ``x`` itself where F is aligned already, or
    where ``x`` is sparse."""
    pad = aligned_width(x.shape[-1]) - x.shape[-1]
    return F.pad(x, (0, pad)) if pad and x.layout == torch.strided else x


class InputLinear(nn.Linear):
    """``torch.nn.Linear`` (same parameters, initialisation and state dict) that, with
    ``padded_input=True``, also takes its input padded by :func:`aligned_features` and
    computes the same output from it: the weight gets as many zero columns at each call.

    Why: rows of, say, 602 fp32 features are not 16-byte aligned, so cuBLAS runs its
    slowest GEMM kernels on them; in a Reddit-sized MaxK epoch on an H200 that padding took
    1 ms off 27. Any other width is a ValueError naming the widths it takes. The bias
    gradient is a matrix-vector product (:func:`dgl_maxk.ops.linear`).
    """

    def __init__(self, in_features, out_features, bias=True, *, padded_input=False, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.padded_input = padded_input

    def extra_repr(self):
        return super().extra_repr() + (", padded_input=True" if self.padded_input else "")

    def forward(self, x):
        return linear(x, self.weight_for(x), self.bias)

    def weight_for(self, x):
        """The weight for features ``x``: itself, or with zero columns for padded ones."""
        width, padded = x.shape[-1], aligned_width(self.in_features)
        if width != self.in_features and not (self.padded_input and width == padded):
            also = (f" (or {padded}: padded by aligned_features)"
                    if self.padded_input and padded != self.in_features else "")
            raise ValueError(f"features have width {width} but the model's lin_in expects "
                             f"{self.in_features}{also}")
        return self.weight if width == self.in_features else F.pad(
            self.weight, (0, width - self.in_features))


class OutputLinear(nn.Linear):
    """``torch.nn.Linear`` (same parameters, initialisation and state dict) whose GEMMs run
    on an output width rounded up to :func:`aligned_width`: the weight and bias get zero rows
    at each call, and the output is the first ``out_features`` columns of the wider one (a
    view, rows :func:`aligned_width` apart).

    Why: rows of, say, 41 fp32 logits are not 16-byte aligned, so cuBLAS runs its slowest
    GEMM kernels on them, forward and backward; in a Reddit-sized SAGE epoch on an H200
    (TF32) the padding took 0.10 ms off 44.3 at k = 32 and 0.13 off 24.7 at k = 8."""

    def forward(self, x):
        pad = aligned_width(self.out_features) - self.out_features
        if not pad:
            return linear(x, self.weight, self.bias)
        bias = None if self.bias is None else F.pad(self.bias, (0, pad))
        return linear(x, F.pad(self.weight, (0, 0, 0, pad)), bias)[..., :self.out_features]


class MaxKGNN(nn.Module):
    """Base class: input and output projections, L hidden layers, MaxK or ReLU before each
    aggregation.

    Parameters
    ----------
    in_feats, hidden_feats, out_feats : int
    num_layers : int
        Aggregation layers (at least 1)
    k : int
        Entries kept per row by MaxK (1 <= k <= hidden_feats); ignored for ReLU
    dropout : float
    nonlinearity : 'maxk' | 'relu'
    padded_input : bool
        Also take the features padded by :func:`aligned_features` (the same outputs, faster
        input GEMMs: :class:`InputLinear`)
    """

    def __init__(self, in_feats, hidden_feats, out_feats, num_layers, k=32, dropout=0.5,
                 nonlinearity="maxk", padded_input=False):
        super().__init__()
        if nonlinearity not in NONLINEARITIES:
            raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got "
                             f"{nonlinearity!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.k = check_k(k, hidden_feats, "hidden_feats") if nonlinearity == "maxk" else None
        self.nonlinearity = nonlinearity
        self.num_layers = num_layers
        self.dropout = nn.Dropout(dropout)
        self.lin_in = InputLinear(in_feats, hidden_feats, padded_input=padded_input)
        self.lin_out = OutputLinear(hidden_feats, out_feats)

    def activate(self, h):
        """MaxK (to CBSR) or ReLU (dense)."""
        return maxk(h, self.k) if self.k is not None else F.relu(h)

    def drop(self, x):
        """Dropout on the kept values of CBSR, or on a dense tensor."""
        return x.with_values(self.dropout(x.values)) if isinstance(x, CBSR) else self.dropout(x)

    @staticmethod
    def layer_graph(graph, i):
        return graph[i] if isinstance(graph, (list, tuple)) else graph

    # Layer-wise inference (dgl_maxk.training.inference) computes forward, in eval mode, one
    # aggregation layer at a time over all nodes: layer_input(0, features), then for each i
    # layer_output(i, block, x) for batches of destination nodes and layer_input(i + 1, .)
    # of those rows, and lin_out of the last layer's output. Every step but the aggregation
    # is row-wise, so each layer's aggregated input (CBSR under MaxK: k values a row) is all
    # that is stored between layers.

    def layer_input(self, i, h):
        """The input of aggregation layer ``i`` from ``h``, row by row (eval mode): from the
        input features for i = 0, else from layer i - 1's output (:meth:`layer_output`).
        CBSR under MaxK, dense under ReLU."""
        raise NotImplementedError

    def layer_output(self, i, graph, x):
        """Aggregation layer ``i`` (its norm included) on ``graph`` (a block) for its
        sources' inputs ``x`` (:meth:`layer_input`), eval mode."""
        raise NotImplementedError


class MaxKSAGE(MaxKGNN):
    """GraphSAGE of the paper; see :class:`MaxKGNN` for the parameters."""

    def __init__(self, in_feats, hidden_feats, out_feats, num_layers, k=32, dropout=0.5,
                 nonlinearity="maxk", padded_input=False):
        super().__init__(in_feats, hidden_feats, out_feats, num_layers, k, dropout,
                         nonlinearity, padded_input)
        self.layers = nn.ModuleList(
            SAGEConv(hidden_feats, hidden_feats, "mean", feat_drop=dropout,
                     norm=LayerNorm(hidden_feats), k=self.k)
            for _ in range(num_layers))

    def forward(self, graph, feat):
        # None: ReLU first (a MaxK layer a caller put in a ReLU model takes the ReLU's
        # output), or a layer of the caller's own
        first_k = getattr(self.layers[0], "k", None) if self.k is not None else None
        # whether h holds CBSR rows from an operator fused with their MaxK (lin_in's here,
        # then a LayerNorm's)
        fused = _fusable_linear(self.lin_in, first_k, self.layers[0])
        h = _linear_maxk(self.lin_in, feat, first_k) if fused else self.lin_in(feat)
        last = len(self.layers) - 1
        for i, conv in enumerate(self.layers):
            g = self.layer_graph(graph, i)
            if self.k is None:
                if _fusable_dropout(conv, g, h):
                    x = _relu_dropout(h, conv.feat_drop, g)
                    with input_checks(False):  # the fused operator scanned h for NaN
                        h = conv(g, x, skip_feat_drop=True)
                else:
                    h = conv(g, F.relu(h))
                continue
            fuse = i < last and _fusable(conv, self.layers[i + 1])
            # rows from the fused operator were scanned for NaN by it
            with input_checks(False) if fused else contextlib.nullcontext():
                h = conv(g, h, skip_norm=fuse)
            if fuse:  # this layer's LayerNorm and the next one's MaxK: one operator
                h = conv.norm.maxk(h, self.layers[i + 1].k)
            fused = fuse
        return self.lin_out(h)

    def layer_input(self, i, h):
        return self.activate(self.lin_in(h) if i == 0 else h)

    def layer_output(self, i, graph, x):
        return self.layers[i](graph, x)


def _fusable_linear(linear, k, following=None) -> bool:
    """Whether ``linear`` can run fused with a MaxK (``k``; None: ReLU) of its output, which
    the module ``following`` (if any) would apply (:func:`_linear_maxk`): torch's Linear or
    the model's own (not one a caller swapped in), with a bias, and no hooks, which the
    fused call does not run, or which would see the dense output it never hands over."""
    return (k is not None and type(linear) in (nn.Linear, InputLinear)
            and linear.bias is not None
            and not (linear._forward_hooks or linear._forward_pre_hooks
                     or (following is not None and following._forward_pre_hooks)))


def _linear_maxk(linear, x, k) -> CBSR:
    """MaxK of ``linear(x)`` as one operator (:func:`dgl_maxk.ops.linear_maxk`: its backward
    takes the bias gradient from MaxK's k-sparse gradient)."""
    weight = linear.weight_for(x) if isinstance(linear, InputLinear) else linear.weight
    return linear_maxk(x, k, weight, linear.bias)


def _fusable_dropout(conv, graph, h) -> bool:
    """Whether the ReLU of ``h`` can run fused with the ``feat_drop`` of ``conv``
    (:func:`_relu_dropout`): dgl_maxk's dense SAGEConv (no k: a MaxK layer drops after its
    top-k) with the 'mean' or 'gcn' aggregator, torch's Dropout, no hooks that would see the
    feature pair it hands over or the dropout it skips, and a row for each source node
    (else the layer's own error)."""
    return (isinstance(conv, SAGEConv) and conv.k is None
            and conv._aggre_type in ("mean", "gcn") and _unwatched_dropout(conv.feat_drop)
            and not (conv._forward_pre_hooks or conv._forward_hooks)
            and h.shape[0] == graph_plan(graph, h.device).num_src)


def _unwatched_dropout(dropout) -> bool:
    return (type(dropout) is nn.Dropout
            and not (dropout._forward_pre_hooks or dropout._forward_hooks))


def _relu_dropout(h, dropout, graph=None):
    """``dropout(relu(h))`` as one operator (:func:`dgl_maxk.ops.relu_dropout`); on a
    block, the pair (source rows, destination rows), the latter a tensor of their own, so
    that their gradients meet in the operator's backward."""
    is_block = graph is not None and graph.is_block
    num_dst = graph_plan(graph, h.device).num_dst if is_block else 0
    out, head = relu_dropout(h, dropout.p, dropout.training, num_head=num_dst)
    return (out, head) if is_block else out


def _fusable(conv, following) -> bool:
    """Whether ``conv``'s LayerNorm can run fused with the MaxK that ``following`` applies to
    its output: dgl_maxk's LayerNorm, a MaxK layer next, and no hooks that would see the
    tensors the fusion skips (the norm's input and output, the next layer's dense input)."""
    return (type(conv.norm) is LayerNorm and following.k is not None
            and not (conv._forward_hooks or conv.norm._forward_pre_hooks
                     or conv.norm._forward_hooks or following._forward_pre_hooks))


class _LinearActDropConv(MaxKGNN):
    """GCN and GIN of the paper: relu(lin_in) -> L x [Linear -> act -> Dropout -> conv ->
    LayerNorm] -> lin_out."""

    def __init__(self, in_feats, hidden_feats, out_feats, num_layers, k=32, dropout=0.5,
                 nonlinearity="maxk", padded_input=False):
        super().__init__(in_feats, hidden_feats, out_feats, num_layers, k, dropout,
                         nonlinearity, padded_input)
        self.linears = nn.ModuleList(nn.Linear(hidden_feats, hidden_feats)
                                     for _ in range(num_layers))
        self.convs = nn.ModuleList(self.make_conv(hidden_feats) for _ in range(num_layers))
        self.norms = nn.ModuleList(LayerNorm(hidden_feats) for _ in range(num_layers))

    def forward(self, graph, feat):
        h = F.relu(self.lin_in(feat))
        fuse_dropout = self.k is None and _unwatched_dropout(self.dropout)
        for i, lin in enumerate(self.linears):
            if fuse_dropout:
                x = _relu_dropout(lin(h), self.dropout)
            else:
                x = self.drop(_linear_maxk(lin, h, self.k) if _fusable_linear(lin, self.k)
                              else self.activate(lin(h)))
            # the fused operator scanned lin(h) for NaN
            with input_checks(False) if fuse_dropout else contextlib.nullcontext():
                h = self.convs[i](self.layer_graph(graph, i), x)
            h = self.norms[i](h)
        return self.lin_out(h)

    def layer_input(self, i, h):
        return self.activate(self.linears[i](F.relu(self.lin_in(h)) if i == 0 else h))

    def layer_output(self, i, graph, x):
        return self.norms[i](self.convs[i](graph, x))


class MaxKGCN(_LinearActDropConv):
    """GCN of the paper; see :class:`MaxKGNN` for the parameters."""

    @staticmethod
    def make_conv(width):
        # k=None: the model applies MaxK (or ReLU) itself, also under dgl_maxk.install
        return GraphConv(width, width, norm="both", weight=False, bias=True,
                         allow_zero_in_degree=True, k=None)


class MaxKGIN(_LinearActDropConv):
    """GIN of the paper; see :class:`MaxKGNN` for the parameters."""

    @staticmethod
    def make_conv(width):
        return GINConv(None, "sum", learn_eps=True, k=None)


MODELS = {"sage": MaxKSAGE, "gcn": MaxKGCN, "gin": MaxKGIN}


def build_model(name, in_feats, hidden_feats, out_feats, num_layers, k=32, dropout=0.5,
                nonlinearity="maxk", padded_input=False):
    """One of the paper's models by name: 'sage', 'gcn' or 'gin'."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name](in_feats, hidden_feats, out_feats, num_layers, k, dropout,
                        nonlinearity, padded_input)
