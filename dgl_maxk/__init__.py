"""dgl_maxk: MaxK-GNN for DGL.

MaxK nonlinearity, CBSR features, and CBSR aggregation kernels behind drop-in replacements
for ``dgl.nn.SAGEConv``, ``GraphConv`` and ``GINConv``.
"""
from ._dgl import dgl  # noqa: F401  (applies DGL's compatibility fix first)
from .cbsr import CBSR
from .graph_plan import GraphPlan, graph_plan
from .ops import aggregate, cbsr_spgemm, maxk, spmm
from .patch import install, installed, is_installed, uninstall
from . import models, nn  # noqa: E402

__version__ = "0.1.0"
__all__ = ["CBSR", "GraphPlan", "graph_plan", "maxk", "cbsr_spgemm", "spmm", "aggregate",
           "install", "uninstall", "installed", "is_installed", "nn", "models"]
