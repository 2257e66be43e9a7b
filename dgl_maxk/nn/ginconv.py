"""Graph isomorphism network layer with MaxK aggregation."""
from __future__ import annotations

import torch

from .._dgl import dgl
from ..ops import aggregate
from ..sparse import CBSR, check_k
from ._inputs import (INSTALLED_K, check_dgl_path, dense, installed_k_applies, resolve_k,
                      split_features)


def _width(feat) -> int:
    x = feat[0] if isinstance(feat, tuple) else feat
    return x.shape[-1]


def _each(feat, fn):
    """``fn`` of the features, or of each of a (source, destination) pair."""
    return tuple(fn(f) for f in feat) if isinstance(feat, tuple) else fn(feat)


class GINConv(dgl.nn.GINConv):
    r"""Graph isomorphism network layer (Xu et al., 2019), a drop-in replacement for
    ``dgl.nn.GINConv`` whose aggregation runs on MaxK-sparse (CBSR) features.

    .. math::
        x_j = \mathrm{MaxK}_k(h_j) \quad (x_j = h_j \text{ when } k \text{ is None})

        h_i^{out} = f_\Theta\left((1 + \epsilon) x_i + \mathrm{aggregate}\left(\{e_{ji} x_j,
        j \in \mathcal{N}(i)\}\right)\right)

    With ``k`` set the layer is ``dgl.nn.GINConv`` applied to MaxK of its input (self and
    neighbour paths), aggregating the k-sparse rows with :func:`dgl_maxk.cbsr_spgemm`. A CBSR
    input is aggregated as it is. With ``k=None`` it computes what DGL's layer does on any
    device the features are on. MaxK applies to the 'sum' and 'mean' aggregators; 'max' runs
    DGL's own code (k=None only).

    Parameters
    ----------
    apply_func, aggregator_type, init_eps, learn_eps, activation
        As in ``dgl.nn.GINConv``.
    k : int or None, optional
        Entries kept per row by MaxK (default: the k of :func:`dgl_maxk.install` while it is in
        effect, else None); ``1 <= k <=`` input width. None disables MaxK.

    Example
    -------
    >>> import dgl_maxk, dgl, torch
    >>> from dgl_maxk.nn import GINConv
    >>> g = dgl.rand_graph(100, 500)
    >>> conv = GINConv(torch.nn.Linear(64, 32), "sum", learn_eps=True, k=16)
    >>> conv(g, torch.randn(100, 64)).shape
    torch.Size([100, 32])
    """

    def __init__(self, apply_func=None, aggregator_type="sum", init_eps=0, learn_eps=False,
                 activation=None, k=INSTALLED_K):
        super().__init__(apply_func, aggregator_type, init_eps=init_eps, learn_eps=learn_eps,
                         activation=activation)
        if aggregator_type == "max":
            if k is not INSTALLED_K and k is not None:
                raise ValueError("MaxK does not apply to the 'max' aggregator (it is not a "
                                 "weighted sum of neighbour rows); use 'sum' or 'mean', or "
                                 "k=None")
            k = None  # an installed default k leaves this aggregator dense
        # GIN learns its input width only at forward: an installed k that does not apply to
        # it leaves the layer dense there (as the other layers do at build)
        self._k_installed = k is INSTALLED_K
        self.k = resolve_k("GINConv", k)
        if not self._k_installed and self.k is not None and isinstance(apply_func,
                                                                         torch.nn.Linear):
            # the features are as wide as the Linear's input: say a k too large now
            check_k(self.k, apply_func.in_features, "apply_func.in_features")
        self._init_eps = float(init_eps)

    def reset_parameters(self):
        """Reinitialise ``apply_func`` (when it has ``reset_parameters``) and set eps back to
        ``init_eps``. (DGL 2.1's GINConv has no such method; the other layers do.)"""
        if self.apply_func is not None and hasattr(self.apply_func, "reset_parameters"):
            self.apply_func.reset_parameters()
        with torch.no_grad():
            self.eps.fill_(self._init_eps)

    def extra_repr(self):
        return f"k={self.k}" if self.k is not None else ""

    def forward(self, graph, feat, edge_weight=None):
        """Compute the layer on ``graph`` (DGLGraph or block) for ``feat``: a tensor, a CBSR
        matrix, or a (source, destination) pair of them. Returns (N_dst, D_out). As in DGL,
        1-D features (N,) are one column, and give (N_dst,) rows to ``apply_func``.
        ``edge_weight`` must be finite (see :func:`dgl_maxk.cbsr_spgemm`)."""
        vector = all(isinstance(f, torch.Tensor) and f.dim() == 1
                     for f in (feat if isinstance(feat, tuple) else (feat,)))
        if vector:
            feat = _each(feat, lambda f: f.unsqueeze(-1))
        if self._aggregator_type == "max":
            feat = check_dgl_path(graph, feat, edge_weight)
            if vector:  # DGL's code on the rows as given
                feat = _each(feat, lambda f: f.squeeze(-1))
            return super().forward(graph, feat, edge_weight)
        k = self.k
        if self._k_installed and k is not None and not installed_k_applies(k, [_width(feat)]):
            k = None
        if vector and k is not None and k > 1:
            raise ValueError(f"k = {k} exceeds the input width: 1-D features are one column "
                             "each (k must be 1 or None)")
        src, dst, plan = split_features(graph, feat, k)
        norm = "right" if self._aggregator_type == "mean" else "none"
        neigh = aggregate(plan, src, edge_weight, norm, check_nan=False)
        scale = 1 + self.eps
        if isinstance(dst, CBSR) and dst.values.dtype == neigh.dtype == scale.dtype:
            # (1 + eps) x added at x's k kept columns: no N x d dense x, made or saved
            rst = neigh.scatter_add_(1, dst.indices.long(), scale * dst.values)
        else:
            rst = scale * dense(dst) + neigh
        if vector:
            rst = rst.squeeze(-1)
        if self.apply_func is not None:
            rst = self.apply_func(rst)
        if self.activation is not None:
            rst = self.activation(rst)
        return rst
