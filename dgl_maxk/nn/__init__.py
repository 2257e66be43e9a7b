"""Drop-in replacements for ``dgl.nn.SAGEConv``, ``GraphConv`` and ``GINConv`` with MaxK, and
``LayerNorm`` on dgl_maxk's row kernel."""
from .. import patch
from .ginconv import GINConv
from .graphconv import GraphConv
from .layernorm import LayerNorm
from .sageconv import SAGEConv

patch.register(SAGEConv=SAGEConv, GraphConv=GraphConv, GINConv=GINConv)

__all__ = ["SAGEConv", "GraphConv", "GINConv", "LayerNorm"]
