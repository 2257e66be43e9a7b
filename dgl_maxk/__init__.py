"""dgl_maxk: MaxK-GNN for DGL.

MaxK nonlinearity, CBSR features, and CBSR aggregation kernels behind drop-in replacements
for ``dgl.nn.SAGEConv``, ``GraphConv`` and ``GINConv``. The layers, from the bottom up:
``_dgl`` (the one DGL import point), ``sparse`` (CBSR, graph plans, input checks),
``backends`` (pure torch, CUDA), ``ops`` (the operators), ``nn`` and ``patch``, ``models``,
``data``, ``training`` and ``cli`` (see docs/architecture.md).
"""
import sys

__version__ = "0.1.0"
__all__ = ["CBSR", "GraphPlan", "graph_plan", "deferred_checks", "input_checks", "maxk",
           "cbsr_spgemm", "spmm", "aggregate", "install", "uninstall", "installed",
           "is_installed", "nn", "models"]

# ``python -m dgl_maxk`` imports this package before dgl_maxk.__main__ runs, with sys.argv[0]
# set to "-m" meanwhile: the command line loads torch and DGL itself, after parsing its
# arguments (``--help`` needs neither) and with its start-up signal handlers in place.
if sys.argv[:1] != ["-m"]:
    from ._dgl import dgl  # noqa: F401  (applies DGL's compatibility fix first)
    from .sparse import CBSR, GraphPlan, deferred_checks, graph_plan, input_checks
    from .ops import aggregate, cbsr_spgemm, maxk, spmm
    from .patch import install, installed, is_installed, uninstall
    from . import models, nn
