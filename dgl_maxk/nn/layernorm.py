"""LayerNorm on dgl_maxk's row kernel."""
from __future__ import annotations

from torch import nn

from ..ops import layer_norm, layer_norm_maxk


class LayerNorm(nn.LayerNorm):
    r"""``torch.nn.LayerNorm`` whose forward on a GPU runs dgl_maxk's row kernel.

    .. math:: y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} \cdot \gamma
              + \beta

    over the last dimension (biased variance). Same constructor, parameters (``weight``
    :math:`\gamma` and ``bias`` :math:`\beta`, shape ``normalized_shape``) and state dict as
    torch's. 2-D fp32 input of width d % 4 == 0, d <= 1024, with ``elementwise_affine`` and a
    bias runs one warp per row forward (torch's kernel made a third of a MaxK epoch's dense
    work on the products-sized graph) and backward (d <= 512; torch's above); other input,
    and input under autocast, runs torch's own.

    Example
    -------
    >>> import torch
    >>> from dgl_maxk.nn import LayerNorm
    >>> LayerNorm(64)(torch.randn(10, 64)).shape
    torch.Size([10, 64])
    """

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def maxk(self, x, k, check_nan=True):
        """MaxK of this norm's output as CBSR, in one operator
        (:func:`dgl_maxk.ops.layer_norm_maxk`: its backward never makes the dense gradient of
        the normalised rows). Rows of ``x`` are N x ``normalized_shape``."""
        if tuple(self.normalized_shape) != tuple(x.shape[-1:]):
            self(x)  # torch's error for the wrong width
        return layer_norm_maxk(x, k, self.weight, self.bias, self.eps, check_nan=check_nan)
