"""Drop-in replacements for ``dgl.nn.SAGEConv``, ``GraphConv`` and ``GINConv`` with MaxK."""
from .. import patch
from .ginconv import GINConv
from .graphconv import GraphConv
from .sageconv import SAGEConv

patch.register(SAGEConv=SAGEConv, GraphConv=GraphConv, GINConv=GINConv)

__all__ = ["SAGEConv", "GraphConv", "GINConv"]
