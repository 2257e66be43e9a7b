"""GraphSAGE layer with MaxK aggregation."""
from __future__ import annotations

import functools

import torch

from .._dgl import dgl
from ..ops import aggregate, cbsr_addmm, linear
from ..sparse import CBSR
from ._inputs import (INSTALLED_K, GraphInputError, check_dgl_path, dense, resolve_k,
                      split_features, stands_for_its_weights)


class SAGEConv(dgl.nn.SAGEConv):
    r"""GraphSAGE layer (Hamilton et al., 2017), a drop-in replacement for
    ``dgl.nn.SAGEConv`` whose aggregation runs on MaxK-sparse (CBSR) features.

    .. math::
        x_i = \mathrm{MaxK}_k(h_i) \quad (x_i = h_i \text{ when } k \text{ is None})

        h_{\mathcal{N}(i)} = \mathrm{aggregate}\left(\{e_{ji} x_j, j \in \mathcal{N}(i)\}\right)

        h_i^{out} = \mathrm{norm}\left(\sigma\left(W_{self} x_i + W_{neigh} h_{\mathcal{N}(i)}
        + b\right)\right)

    With ``k`` set the layer is ``dgl.nn.SAGEConv`` applied to MaxK of its input: MaxK feeds
    both the neighbour and the self path, ``feat_drop`` drops kept values, and the neighbour
    aggregation runs on the k-sparse rows (:func:`dgl_maxk.cbsr_spgemm`) *before* ``fc_neigh``
    whatever ``in_feats`` and ``out_feats`` are (DGL projects first when
    ``in_feats > out_feats``, which would destroy the sparsity). With ``k=None`` it computes
    what DGL's layer computes, in the same order, on any device the features are on (a graph
    on the CPU may serve features on a GPU). On CBSR rows the 'mean' aggregator fuses the two
    GEMMs on ``fc_self`` and ``fc_neigh``'s weights when they are plain ``torch.nn.Linear``
    modules that no hook watches; otherwise it calls them (hooks, pruning and wrapped
    modules act as in DGL's layer). MaxK applies to the 'mean' and 'gcn' aggregators; 'pool'
    and 'lstm' run DGL's own code (k=None only).

    Parameters
    ----------
    in_feats, out_feats, aggregator_type, feat_drop, bias, norm, activation
        As in ``dgl.nn.SAGEConv``.
    k : int or None, optional
        Entries kept per row by MaxK (default: the k of :func:`dgl_maxk.install` while it is in
        effect, else None); ``1 <= k <= in_feats``. None disables MaxK.

    Notes
    -----
    Parameter shapes are DGL's (``fc_self.weight``: out x in, ``fc_neigh.weight``: out x in),
    so state dicts load both ways.

    Example
    -------
    >>> import dgl_maxk, dgl, torch
    >>> from dgl_maxk.nn import SAGEConv
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> conv = SAGEConv(64, 32, "mean", k=16)
    >>> conv(g, torch.randn(100, 64)).shape
    torch.Size([100, 32])
    """

    def __init__(self, in_feats, out_feats, aggregator_type, feat_drop=0.0, bias=True,
                 norm=None, activation=None, k=INSTALLED_K):
        super().__init__(in_feats, out_feats, aggregator_type, feat_drop=feat_drop,
                         bias=bias, norm=norm, activation=activation)
        if aggregator_type in ("pool", "lstm"):
            if k is not INSTALLED_K and k is not None:
                raise ValueError(
                    f"MaxK does not apply to the '{aggregator_type}' aggregator (it is not a "
                    "weighted sum of neighbour rows); use 'mean' or 'gcn', or k=None")
            k = None  # an installed default k leaves these aggregators dense
        self.k = resolve_k("SAGEConv", k, (self._in_src_feats, self._in_dst_feats))

    def extra_repr(self):
        return f"k={self.k}" if self.k is not None else ""

    def forward(self, graph, feat, edge_weight=None, *, skip_norm=False,
                skip_feat_drop=False):
        """Compute the layer on ``graph`` (DGLGraph or block) for ``feat``: a tensor, a CBSR
        matrix, or a (source, destination) pair of them. Returns (N_dst, out_feats).
        ``skip_norm=True`` returns the output before ``norm`` ('mean' and 'gcn'), for a
        caller that applies the norm itself (the models fuse the LayerNorm with the next
        layer's MaxK: :meth:`dgl_maxk.nn.LayerNorm.maxk`). ``skip_feat_drop=True`` leaves
        out ``feat_drop``, for a caller that applied it ('mean' and 'gcn'; the models fuse
        it with their ReLU: :func:`dgl_maxk.ops.relu_dropout`). ``edge_weight`` must be
        finite (see :func:`dgl_maxk.cbsr_spgemm`)."""
        if self._aggre_type in ("pool", "lstm"):
            if skip_norm or skip_feat_drop:
                raise ValueError(f"skip_norm and skip_feat_drop apply to the 'mean' and "
                                 f"'gcn' aggregators, not '{self._aggre_type}'")
            feat = check_dgl_path(graph, feat, edge_weight,
                                  (self._in_src_feats, self._in_dst_feats))
            return super().forward(graph, feat, edge_weight)
        rst = self._combine(graph, feat, edge_weight, skip_feat_drop)
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None and not skip_norm:
            rst = self.norm(rst)
        return rst

    def _combine(self, graph, feat, edge_weight, skip_feat_drop):
        src, dst, plan = split_features(graph, feat, self.k,
                                        None if skip_feat_drop else self.feat_drop,
                                        (self._in_src_feats, self._in_dst_feats))
        agg = functools.partial(aggregate, plan, check_nan=False)  # scanned by split_features
        # DGL projects before aggregating when that is cheaper; never on sparse input.
        lin_before_mp = isinstance(src, torch.Tensor) and self._in_src_feats > self._out_feats
        if self._aggre_type == "mean":
            if (isinstance(src, CBSR) and (isinstance(dst, CBSR) or dst.dim() == 2)
                    and stands_for_its_weights(self.fc_self)
                    and stands_for_its_weights(self.fc_neigh)):
                # the self GEMM adds into the neighbour GEMM's output in place (no N x d
                # sum or copy pass) and keeps CBSR rows, not dense ones, for its backward
                h_neigh = linear(agg(src, edge_weight, "right"), self.fc_neigh.weight,
                                 self.fc_self.bias)
                if isinstance(dst, CBSR):
                    rst = cbsr_addmm(h_neigh, dst, self.fc_self.weight, inplace=True)
                elif dst.dtype == h_neigh.dtype:
                    rst = h_neigh.addmm_(dst, self.fc_self.weight.t())
                else:  # autocast casts out-of-place ops only
                    rst = torch.addmm(h_neigh, dst, self.fc_self.weight.t())
            else:
                if lin_before_mp:
                    h_neigh = agg(self.fc_neigh(src), edge_weight, "right")
                else:
                    h_neigh = self.fc_neigh(agg(src, edge_weight, "right"))
                rst = self.fc_self(dense(dst)) + h_neigh
        else:  # gcn: (sum of neighbours + self) / (in-degree + 1)
            if isinstance(feat, tuple) and dense(src).shape[1:] != dense(dst).shape[1:]:
                raise GraphInputError("the 'gcn' aggregator needs source and destination "
                                      "features of the same width")
            scale = (plan.in_degrees.to(torch.float32) + 1).unsqueeze(-1)
            if lin_before_mp:
                h_neigh = (agg(self.fc_neigh(src), edge_weight)
                           + self.fc_neigh(dst)) / scale.to(dst.dtype)
            else:
                total = agg(src, edge_weight) + dense(dst)
                h_neigh = self.fc_neigh(total / scale.to(total.dtype))
            rst = h_neigh if self.bias is None else h_neigh + self.bias
        return rst
