"""The sparse core: the CBSR type, graph plans and input checks.

It imports only torch, the ``torch.library`` version shim (:mod:`dgl_maxk._custom_ops`, for
the checks' ops) and (for graph plans) DGL; the operators of :mod:`dgl_maxk.ops` and the
backends of :mod:`dgl_maxk.backends` build on it.
"""
from .cbsr import CBSR, MAX_WIDTH, index_dtype
from .checks import (NaNError, check_features, check_k, check_nan_counters, checks_enabled,
                     deferred_checks, input_checks, raise_recorded_checks,
                     raise_recorded_flags, recorded_checks, recorded_flags)
from .plan import NORMS, GraphPlan, SampledBlock, check_graph, graph_plan

__all__ = ["CBSR", "MAX_WIDTH", "index_dtype", "NaNError", "check_features", "check_k",
           "check_nan_counters", "checks_enabled", "deferred_checks", "input_checks",
           "raise_recorded_checks", "raise_recorded_flags", "recorded_checks",
           "recorded_flags", "NORMS", "GraphPlan",
           "SampledBlock", "check_graph", "graph_plan"]
