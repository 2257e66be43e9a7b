"""Drop-in replacements for ``dgl.nn.SAGEConv``, ``GraphConv`` and ``GINConv`` with MaxK."""
from .ginconv import GINConv
from .graphconv import GraphConv
from .sageconv import SAGEConv

__all__ = ["SAGEConv", "GraphConv", "GINConv"]
