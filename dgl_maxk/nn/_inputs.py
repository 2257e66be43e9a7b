"""Input handling shared by the dgl_maxk layers: feature pairs, blocks, MaxK, validation."""
from __future__ import annotations

import torch

from .. import patch
from .._dgl import DGLError
from ..ops import check_dense_features, check_edge_weight, maxk_checked
from ..sparse import CBSR, MAX_WIDTH, SampledBlock, check_graph, check_k, graph_plan


class GraphInputError(DGLError, ValueError):
    """Features that do not fit the graph: a DGLError, which DGL's layers raise there, and a
    ValueError, which dgl_maxk's other input checks raise."""


class _InstalledK:
    """Default of a layer's ``k``: the one given to :func:`dgl_maxk.install`, else None."""

    def __repr__(self):
        return "<k of dgl_maxk.install, else None>"


INSTALLED_K = _InstalledK()


def installed_k_applies(k: int, widths) -> bool:
    """Whether the k of :func:`dgl_maxk.install` applies to inputs of these widths: MaxK
    keeping every entry is the identity, and CBSR cannot index wider rows than MAX_WIDTH;
    such layers stay dense (an explicit k is never adjusted)."""
    return k < min(widths) and max(widths) <= MAX_WIDTH


def resolve_k(layer: str, k, widths=(None,)):
    """A layer's k at construction: the installed default when the caller gave none, then
    validated against each input width it applies to (source, and destination if given)."""
    widths = [w for w in widths if w is not None]
    if k is INSTALLED_K:
        k = patch.installed_k(layer)
        if k is not None and widths and not installed_k_applies(k, widths):
            return None
    if k is None:
        return None
    k = check_k(k)
    names = ("in_feats",) if len(widths) < 2 or widths[0] == widths[1] else (
        "in_feats[0]", "in_feats[1]")
    for name, width in zip(names, widths):
        if width > MAX_WIDTH:
            raise ValueError(f"MaxK needs input widths of at most {MAX_WIDTH} (CBSR "
                             f"indices); {name} = {width}")
        check_k(k, width, name)
    return k


def stands_for_its_weights(linear) -> bool:
    """Whether a ``Linear`` may be replaced by a GEMM on its weight and bias with nobody the
    wiser: a plain ``torch.nn.Linear`` (not a pruned, parametrized, quantized or wrapped one)
    that no hook watches. Otherwise the layer calls the module, on dense rows."""
    # the module's own hooks and torch's global module hooks (getattr: older torch has
    # fewer kinds)
    watched = (getattr(owner, f"_{kind}_hooks", None)
               for owner, prefix in ((linear, ""), (torch.nn.modules.module, "global_"))
               for kind in (f"{prefix}forward", f"{prefix}forward_pre", f"{prefix}backward",
                            f"{prefix}backward_pre"))
    return (type(linear) is torch.nn.Linear
            and isinstance(linear.weight, torch.nn.Parameter) and not any(watched))


def _rows(x):
    return x.shape[0]


def _slice_rows(x, n):
    if isinstance(x, CBSR):
        return CBSR(x.values[:n], x.indices[:n], x.d, x._pattern_checked)
    return x[:n]


def _check_one(name, x, width, nan=True):
    if isinstance(x, CBSR):
        check_dense_features(name, x.values, nan=nan)
        d = x.d
    else:
        check_dense_features(name, x, nan=nan)
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (N, {width or 'D'}), got {tuple(x.shape)}")
        d = x.shape[-1]
    if width is not None and d != width:
        raise ValueError(f"{name} has width {d} but the layer expects {width}")


def split_features(graph, feat, k, dropout=None, widths=(None, None), use_dst=True):
    """(source, destination, plan): DGL's ``expand_as_pair`` with MaxK and dropout applied.

    A single tensor serves both sides (its first ``num_dst_nodes`` rows on a block), after one
    MaxK and one dropout, as in DGL's layers; a pair is treated side by side. Dense tensors
    become CBSR when ``k`` is set; CBSR inputs are used as they are. ``use_dst=False``, for a
    layer that never reads destination features (GraphConv, as DGL's): a pair's second
    tensor is checked for type, shape and device only (no width, NaN scan, MaxK or dropout)
    and returned as given. Raises a ValueError or DGLError naming the problem for bad input.
    """
    check_graph(graph)

    def prepare(name, x, width, used=True):
        if not isinstance(x, (torch.Tensor, CBSR)):
            raise ValueError(f"{name} must be a torch.Tensor or CBSR, got {type(x).__name__}")
        if not used:
            _check_one(name, x, None, nan=False)
            return x
        to_cbsr = k is not None and not isinstance(x, CBSR)
        _check_one(name, x, width, nan=not to_cbsr)
        if to_cbsr:
            x = maxk_checked(x, k, name)  # the top-k kernel finds the NaN as it reads x
        if dropout is not None:
            x = x.with_values(dropout(x.values)) if isinstance(x, CBSR) else dropout(x)
        return x

    # the node counts come from the plan: torch.compile can read it, not DGL's C API
    if isinstance(feat, tuple):
        if len(feat) != 2:
            raise ValueError(f"a feature pair must have 2 tensors, got {len(feat)}")
        src = prepare("source features", feat[0], widths[0])
        if isinstance(feat[1], (torch.Tensor, CBSR)) and feat[1].device != src.device:
            raise DGLError(f"source features on {src.device} but destination features on "
                           f"{feat[1].device}")
        dst = prepare("destination features", feat[1], widths[1], use_dst)
        plan = graph_plan(graph, src.device)
    else:
        src = prepare("features", feat, widths[0])
        plan = graph_plan(graph, src.device)
        dst = _slice_rows(src, plan.num_dst) if graph.is_block else src
    if _rows(src) != plan.num_src:
        raise GraphInputError(f"source features have {_rows(src)} rows but the graph has "
                              f"{plan.num_src} source nodes")
    if _rows(dst) != plan.num_dst:
        raise GraphInputError(f"destination features have {_rows(dst)} rows but the graph "
                              f"has {plan.num_dst} destination nodes")
    if dst.device != src.device:
        raise DGLError(f"source features on {src.device} but destination features on "
                       f"{dst.device}")
    return src, dst, plan


def check_dgl_path(graph, feat, edge_weight, widths=(None, None)):
    """Validate the inputs of an aggregator that runs DGL's own code ('pool', 'lstm', GIN's
    'max') with the errors of the MaxK paths; returns ``feat`` with CBSR matrices dense."""
    if isinstance(graph, SampledBlock):
        raise DGLError("this aggregator runs DGL's own code, which needs a DGL block: pass "
                       "block.to_dgl() for a dgl_maxk SampledBlock")
    src, dst, plan = split_features(graph, feat, None, widths=widths)
    check_edge_weight(edge_weight, plan.num_edges, src.device)
    return (dense(src), dense(dst)) if isinstance(feat, tuple) else dense(src)


def dense(x):
    """A CBSR matrix as a dense tensor; dense tensors unchanged."""
    return x.to_dense() if isinstance(x, CBSR) else x


def check_zero_in_degree(plan):
    """DGL's zero-in-degree error, verbatim, from the cached plan."""
    if plan.has_zero_in_degree():
        raise DGLError(
            "There are 0-in-degree nodes in the graph, "
            "output for those nodes will be invalid. "
            "This is harmful for some applications, "
            "causing silent performance regression. "
            "Adding self-loop on the input graph by "
            "calling `g = dgl.add_self_loop(g)` will resolve "
            "the issue. Setting ``allow_zero_in_degree`` "
            "to be `True` when constructing this module will "
            "suppress the check and let the code run.")
