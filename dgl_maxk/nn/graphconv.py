"""Graph convolution layer with MaxK aggregation."""
from __future__ import annotations

import torch

from .._dgl import DGLError, dgl
from ..ops import aggregate
from ._inputs import INSTALLED_K, check_zero_in_degree, resolve_k, split_features


class GraphConv(dgl.nn.GraphConv):
    r"""Graph convolution (Kipf and Welling, 2017), a drop-in replacement for
    ``dgl.nn.GraphConv`` whose aggregation runs on MaxK-sparse (CBSR) features.

    .. math::
        x_j = \mathrm{MaxK}_k(h_j) \quad (x_j = h_j \text{ when } k \text{ is None})

        h_i^{out} = \sigma\left(b + \sum_{j \in \mathcal{N}(i)} \frac{e_{ji}}{c_{ji}} x_j W
        \right)

    where :math:`c_{ji}` is given by ``norm``: 'both' :math:`\sqrt{|\mathcal{N}(j)|}
    \sqrt{|\mathcal{N}(i)|}`, 'right' :math:`|\mathcal{N}(i)|`, 'left' :math:`|\mathcal{N}(j)|`,
    'none' 1 (degrees clamped to at least 1), and :math:`e_{ji}` is the optional edge weight.

    With ``k`` set the layer is ``dgl.nn.GraphConv`` applied to MaxK of its input, aggregating
    the k-sparse rows (:func:`dgl_maxk.cbsr_spgemm`) before multiplying by ``W`` whatever
    ``in_feats`` and ``out_feats`` are. A CBSR input (say MaxK followed by dropout on the kept
    values, as in the paper's GCN) is aggregated as it is. With ``k=None`` the layer computes
    what DGL's does, in the same order, on any device the features are on, with the same
    defaults and the same zero-in-degree DGLError.

    Parameters
    ----------
    in_feats, out_feats, norm, weight, bias, activation, allow_zero_in_degree
        As in ``dgl.nn.GraphConv``.
    k : int or None, optional
        Entries kept per row by MaxK (default: the k of :func:`dgl_maxk.install` while it is in
        effect, else None); ``1 <= k <= in_feats``. None disables MaxK.

    Notes
    -----
    Parameter shapes are DGL's (``weight``: in x out, ``bias``: out).

    Example
    -------
    >>> import dgl_maxk, dgl, torch
    >>> from dgl_maxk.nn import GraphConv
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> conv = GraphConv(64, 64, norm="both", weight=False, k=8)
    >>> conv(g, torch.randn(100, 64)).shape
    torch.Size([100, 64])
    """

    def __init__(self, in_feats, out_feats, norm="both", weight=True, bias=True,
                 activation=None, allow_zero_in_degree=False, k=INSTALLED_K):
        super().__init__(in_feats, out_feats, norm=norm, weight=weight, bias=bias,
                         activation=activation, allow_zero_in_degree=allow_zero_in_degree)
        self.k = resolve_k("GraphConv", k, (in_feats,))

    def extra_repr(self):
        summary = super().extra_repr()
        return summary + (f", k={self.k}" if self.k is not None else "")

    def forward(self, graph, feat, weight=None, edge_weight=None):
        """Compute the layer on ``graph`` (DGLGraph or block) for ``feat``: a tensor, a CBSR
        matrix, or a (source, destination) pair of them. Returns (N_dst, out_feats).
        ``edge_weight`` must be finite (see :func:`dgl_maxk.cbsr_spgemm`)."""
        src, _, plan = split_features(graph, feat, self.k, widths=(self._in_feats, None),
                                      use_dst=False)
        if not self._allow_zero_in_degree:
            check_zero_in_degree(plan)
        if weight is not None:
            if self.weight is not None:
                raise DGLError(
                    "External weight is provided while at the same time the"
                    " module has defined its own weight parameter. Please"
                    " create the module with flag weight=False.")
        else:
            weight = self.weight
        # The degree scales are folded into the edge values (the sum is linear in them).
        if isinstance(src, torch.Tensor) and self._in_feats > self._out_feats:
            if weight is not None:
                src = torch.matmul(src, weight)
            rst = aggregate(plan, src, edge_weight, self._norm, check_nan=False)
        else:
            rst = aggregate(plan, src, edge_weight, self._norm, check_nan=False)
            if weight is not None:
                rst = torch.matmul(rst, weight)
        if self.bias is not None:
            rst = rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst
