"""Graph plans: the structure of a DGL graph in the form the aggregation operators need.

A :class:`GraphPlan` holds the CSR over destination rows (``indptr``, source ``indices`` and the
DGL edge id of each CSR entry), the degrees, the per-edge aggregation weights of each
normalisation, the transpose and the edge groups of the CUDA kernels, all on the device of
the features and each derived once. :func:`graph_plan` builds it once per graph
and device and caches it on the graph; a structural change of the graph (``add_edges``,
``remove_nodes``, ...) replaces DGL's graph index and so invalidates the cached plan.

The operators take a plan as its CSR tensors (``indptr``, ``indices``, ``num_src``: what a
``torch.library`` custom op can take) and find the plan again with :meth:`GraphPlan.of`, so
that what it derived and cached serves every call.

A graph on the CPU with features on a GPU is the normal case with the DGL wheels of the
package index (which have no CUDA); a graph on a GPU must have its features on that GPU.

A :class:`SampledBlock` is a block made on the device by :mod:`dgl_maxk.sampling` (the DGL
wheels of the package index cannot hold a graph on a GPU): its plan is built from the CSR
the sampler made, with no sort and no host synchronisation, and dgl_maxk's layers take it
wherever they take a DGL block.

Everything a plan caches is built outside ``torch.inference_mode``: a graph first used for
inference (a validation pass before training) must still serve training afterwards.
"""
from __future__ import annotations

import functools
import weakref

import torch

from .._custom_ops import compiling
from .._dgl import DGLError, dgl

NORMS = ("none", "left", "right", "both")

# The live plans by id(indptr), for GraphPlan.of (a plan holds its indptr: the id is unique
# while the entry exists).
_BY_INDPTR: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


class GraphPlan:
    """CSR over destination rows of a one-edge-type graph or block, on one device.

    Building a plan from CSR tensors reads nothing back to the host.

    Attributes
    ----------
    num_src, num_dst, num_edges : int
    indptr : Tensor (num_dst + 1,), int64
    indices : Tensor (num_edges,), int64
        Source node of each CSR entry
    edge_ids : Tensor (num_edges,), int64, or None
        DGL edge id of each CSR entry (None: entry i is edge i)
    in_degrees : Tensor (num_dst,), int64
    max_in_degree : int or None
        A known bound on the in-degrees (e.g. a sampler's fan-out)
    rows_sorted : bool or None
        Whether each row lists its sources in ascending order, if known (None:
        :meth:`rows_sorted_by_source` checks, with one host sync)
    norm_out_degrees : Tensor (num_src,), int64, or None
        The sources' out-degrees that the 'left' and 'both' norms scale by where they are not
        this CSR's (a block standing for its sources' rows of a larger graph holds theirs
        there); None: :attr:`out_degrees`. The CSR's own out-degrees still build the
        transpose.
    """

    @torch.inference_mode(False)
    def __init__(self, indptr, indices, edge_ids, num_src, num_dst, max_in_degree=None,
                 rows_sorted=None, norm_out_degrees=None):
        self.indptr, self.indices, self.edge_ids = indptr, indices, edge_ids
        self.num_src, self.num_dst = int(num_src), int(num_dst)
        self.num_edges = indices.numel()
        self.max_in_degree = max_in_degree
        self.device = indptr.device
        self.in_degrees = indptr[1:] - indptr[:-1]
        self._edge_values: dict = {}
        self._node_scales: dict = {}
        self._edge_groups: dict = {}
        self._source_slices: dict = {}
        self._rows_sorted = rows_sorted
        self._indices_i32 = None
        self._transpose = None
        self._has_zero_in_degree = None
        self.norm_out_degrees = norm_out_degrees
        _BY_INDPTR[id(indptr)] = self

    @staticmethod
    def of(indptr, indices, num_src: int) -> "GraphPlan":
        """The plan whose CSR is ``indptr`` and ``indices`` (these very tensors) over
        ``num_src`` sources, with all it has cached, else a new plan of them. The operators'
        results never depend on which (only the work of deriving the structures they need),
        except through ``norm_out_degrees``, which only the plan holds: the block that holds
        the plan keeps it alive, so it is the one found."""
        plan = _BY_INDPTR.get(id(indptr))
        if plan is not None and plan.indices is indices and plan.num_src == num_src:
            return plan
        fresh = GraphPlan(indptr, indices, None, num_src, indptr.numel() - 1)
        if plan is not None:  # the registered plan (of other indices) stays the one found
            _BY_INDPTR[id(indptr)] = plan
        return fresh

    @functools.cached_property
    @torch.inference_mode(False)
    def out_degrees(self) -> torch.Tensor:
        """(num_src,) int64: the out-degree of each source node, built on first use
        (scatter_add, not bincount, which reads the largest index back to the host)."""
        ones = torch.ones_like(self.indices)
        return torch.zeros(self.num_src, dtype=torch.int64,
                           device=self.device).scatter_add_(0, self.indices, ones)

    @functools.cached_property
    @torch.inference_mode(False)
    def dst_of_edge(self) -> torch.Tensor:
        """(num_edges,) int64: the destination row of each CSR entry, built on first use."""
        return torch.repeat_interleave(torch.arange(self.num_dst, device=self.device),
                                       self.in_degrees, output_size=self.num_edges)

    def has_zero_in_degree(self) -> bool:
        """Whether some destination node has no in-edge (computed once: a host sync)."""
        if self._has_zero_in_degree is None:
            self._has_zero_in_degree = bool((self.in_degrees == 0).any())
        return self._has_zero_in_degree

    @staticmethod
    @torch.inference_mode(False)
    def from_graph(graph, device) -> "GraphPlan":
        # From the COO edge list: dgl 2.1's adj_tensors("csc") returns garbage or crashes on
        # blocks under newer torch.
        src, dst = graph.edges()
        device = torch.device(device)
        src, dst = src.to(device, torch.int64), dst.to(device, torch.int64)
        # rows sorted by source: a row's entries of one source slice are then consecutive
        edge_ids = torch.argsort(dst * graph.num_src_nodes() + src, stable=True)
        counts = torch.bincount(dst, minlength=graph.num_dst_nodes())
        indptr = torch.zeros(graph.num_dst_nodes() + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=indptr[1:])
        plan = GraphPlan(indptr, src[edge_ids], edge_ids, graph.num_src_nodes(),
                         graph.num_dst_nodes(), rows_sorted=True)
        plan.has_zero_in_degree()  # now, where a host sync is no graph break
        return plan

    def node_scale(self, norm: str, side: str, dtype) -> torch.Tensor | None:
        """The factor a normalisation applies per source ('src') or destination ('dst') node
        (cached), or None where it applies none."""
        check_norm(norm)
        if norm not in (("left", "both") if side == "src" else ("right", "both")):
            return None
        key = (norm, side, dtype)
        if key not in self._node_scales:
            with torch.inference_mode(False):
                deg = self.in_degrees if side == "dst" else (
                    self.out_degrees if self.norm_out_degrees is None
                    else self.norm_out_degrees)
                deg = deg.to(dtype).clamp(min=1)
                self._node_scales[key] = deg.rsqrt() if norm == "both" else deg.reciprocal()
        return self._node_scales[key]

    def edge_values(self, norm: str = "none", edge_weight: torch.Tensor | None = None,
                    dtype=torch.float32) -> torch.Tensor:
        """The non-zeros of the weighted adjacency A (num_dst x num_src), in CSR order.

        A[r, c] = edge_weight[e] * scale_src[c] * scale_dst[r] for each edge e = (c -> r),
        where the scales are those of DGL's GraphConv ``norm``: 'none', 'left' (1 / out-degree
        of c), 'right' (1 / in-degree of r, i.e. the mean) or 'both' (both to the power -1/2).
        Differentiable with respect to ``edge_weight``. Cached when ``edge_weight`` is None.
        """
        check_norm(norm)
        if edge_weight is None:
            key = (norm, dtype)
            if key not in self._edge_values:
                with torch.inference_mode(False):
                    self._edge_values[key] = self.scaled(None, norm, dtype)
            return self._edge_values[key]
        return self.scaled(self.csr_order(edge_weight).to(dtype), norm, dtype)

    def csr_order(self, edge_weight: torch.Tensor) -> torch.Tensor:
        """``edge_weight`` (one value per DGL edge, ``num_edges`` elements) as one value per
        CSR entry, on the plan's device; differentiable."""
        weights = edge_weight.to(self.device).reshape(-1)
        return weights if self.edge_ids is None else weights[self.edge_ids]

    def scaled(self, values, norm: str, dtype) -> torch.Tensor:
        """``values`` (one per CSR entry; None: all ones) times the source, then the
        destination node scales of ``norm``, per CSR entry."""
        src = self.node_scale(norm, "src", dtype)
        dst = self.node_scale(norm, "dst", dtype)
        factors = [values] if values is not None else []
        if src is not None:
            factors.append(src[self.indices])
        if dst is not None:  # repeated row by row: no per-entry row index needed
            factors.append(torch.repeat_interleave(dst, self.in_degrees,
                                                   output_size=self.num_edges))
        if not factors:
            return torch.ones(self.num_edges, dtype=dtype, device=self.device)
        out = factors[0]
        for factor in factors[1:]:
            out = out * factor
        return out

    def transpose(self):
        """(indptr, indices, perm) of the CSR over source rows: entry i of it is CSR entry
        perm[i] of this plan, so A^T's values are ``edge_values[perm]``."""
        if self._transpose is None:
            self._transpose = self._build_transpose()
        return self._transpose

    @torch.inference_mode(False)
    def _build_transpose(self):
        perm = torch.argsort(self.indices, stable=True)
        t_indptr = torch.zeros(self.num_src + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(self.out_degrees, 0, out=t_indptr[1:])
        return t_indptr, self.dst_of_edge[perm], perm

    def edge_groups(self, group_size: int):
        """(group_row int32, group_start int64, indices int32, multi_rows int64) for the CUDA
        kernels.

        Destination row r is cut into max(1, ceil(deg(r) / group_size)) groups of consecutive
        CSR entries; ``group_start`` has one more element (num_edges), so group g covers
        ``[group_start[g], group_start[g + 1])``; bit 31 of ``group_row`` marks rows of several
        groups, and ``multi_rows`` lists them (ascending; their partial sums meet by atomic
        adds, so only they need zeros first). Built once per group size with vectorised torch
        on the plan's device: one host sync for the group count, none when
        ``max_in_degree`` says every row is one group (then the groups are the rows).
        """
        if group_size not in self._edge_groups:
            self._edge_groups[group_size] = self._build_edge_groups(int(group_size))
        return self._edge_groups[group_size]

    @torch.inference_mode(False)
    def _build_edge_groups(self, g: int):
        dev = self.device
        if self.max_in_degree is not None and self.max_in_degree <= g:
            rows = torch.arange(self.num_dst, dtype=torch.int32, device=dev)
            return (rows, self.indptr, self._indices_int32(),
                    torch.zeros(0, dtype=torch.int64, device=dev))
        per_row = torch.clamp((self.in_degrees + (g - 1)) // g, min=1)
        rows, first = _groups_of_rows(self.indptr[:-1], per_row, g)
        start = torch.cat([first, self.indptr[-1:]])
        multi = per_row > 1
        group_row = torch.where(multi[rows], rows - 2 ** 31, rows).to(torch.int32)
        return group_row, start, self._indices_int32(), multi.nonzero().view(-1)

    def _indices_int32(self) -> torch.Tensor:
        if self._indices_i32 is None:
            if self.num_src >= 2 ** 31 or self.num_dst >= 2 ** 31:
                raise ValueError("the CUDA kernels index nodes with int32 (< 2^31 nodes)")
            self._indices_i32 = self.indices.to(torch.int32)
        return self._indices_i32

    def rows_sorted_by_source(self) -> bool:
        """Whether each CSR row lists its sources in ascending order (as :meth:`from_graph`
        makes them); checked once, with a host sync."""
        if self._rows_sorted is None:
            with torch.inference_mode(False):
                step = self.indices[1:] < self.indices[:-1]
                first = self.indptr[1:-1]
                step[first[(first > 0) & (first < self.num_edges)] - 1] = False  # across rows
                self._rows_sorted = not bool(step.any())
        return self._rows_sorted

    def source_slices(self, group_size: int, slices: int):
        """(group_row int32, group_start int64, group_end int64) of a walk over the CSR
        entries source slice by source slice, for kernels that scatter into per-source rows.

        Slice s holds the sources [s * w, (s + 1) * w), w = ceil(num_src / slices). Each row's
        entries of one slice are consecutive when the rows are sorted by source
        (:meth:`rows_sorted_by_source`, required); they are cut into groups of at most
        ``group_size`` entries ``[group_start[g], group_end[g])`` of the CSR, listed slice by
        slice and, within a slice, row by row. Rows without entries in a slice have no group
        there. Built once per (group size, slices), with two host syncs (the bincount's
        size check and the group count).
        """
        if not self.rows_sorted_by_source():
            raise ValueError("source slices need each row's sources in ascending order")
        key = (int(group_size), int(slices))
        if key not in self._source_slices:
            self._source_slices[key] = self._build_source_slices(*key)
        return self._source_slices[key]

    @torch.inference_mode(False)
    def _build_source_slices(self, g: int, slices: int):
        dev, n = self.device, self.num_dst
        width = -(-self.num_src // slices)
        # (row, slice) of each entry: ascending along the CSR, since rows are sorted by source
        small = torch.int32 if n * slices < 2 ** 31 else torch.int64
        sub_row = torch.div(self._indices_int32(), width, rounding_mode="floor").to(small)
        sub_row += torch.repeat_interleave(torch.arange(n, device=dev, dtype=small) * slices,
                                           self.in_degrees, output_size=self.num_edges)
        counts = torch.bincount(sub_row, minlength=n * slices)
        del sub_row
        starts = torch.cumsum(counts, 0) - counts
        counts, starts = (t.view(n, slices).t().reshape(-1) for t in (counts, starts))
        groups, start = _groups_of_rows(starts, (counts + (g - 1)) // g, g)
        end = torch.minimum(start + g, (starts + counts)[groups])
        return (groups % n).to(torch.int32), start, end


def check_norm(norm: str) -> None:
    """Raise a ValueError unless ``norm`` is one of :data:`NORMS`."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def _groups_of_rows(first_entry, per_row, g: int):
    """(row of each group int64, first CSR entry of each group int64) of rows cut into
    ``per_row`` groups of at most g consecutive entries from ``first_entry`` (one host sync:
    the group count)."""
    dev = first_entry.device
    total = int(per_row.sum())
    rows = torch.repeat_interleave(torch.arange(per_row.numel(), device=dev), per_row,
                                   output_size=total)
    first_group = torch.cumsum(per_row, 0) - per_row
    local = torch.arange(total, device=dev) - first_group[rows]
    return rows, first_entry[rows] + local * g


class SampledBlock:
    """A sampled block on the device, with what dgl_maxk's layers need of a DGL block (stock
    DGL layers need :meth:`to_dgl`): ``num_dst`` destination nodes, which are also the first
    ``num_dst`` of its ``num_src`` source nodes (DGL's convention), and its edges as a CSR
    over destination rows.

    Parameters
    ----------
    indptr : Tensor (num_dst + 1,), int64
        Row pointers of the CSR over destination rows
    indices : Tensor (num_edges,), int64
        Local source node of each edge, in CSR order
    src_nodes : Tensor (num_src,), int64
        Global id of each source node
    num_dst : int
    max_in_degree : int, optional
        A bound on the in-degrees (the fan-out), which lets the CUDA kernels' edge groups be
        built without reading the degrees back to the host
    edge_ids : Tensor (num_edges,), int64, optional
        The id in the sampled graph of each edge, in CSR order (DGL's
        ``block.edata[dgl.EID]``): ``weight[block.edge_ids]`` gives a sampled layer its edge
        weights
    src_out_degrees : Tensor (num_src,), int64, optional
        The source nodes' out-degrees in the sampled graph, which GraphConv's 'left' and
        'both' norms then scale by (as on the whole graph: layer-wise inference); default:
        their out-degrees in the block, as in DGL's blocks

    Example
    -------
    >>> import dgl, torch
    >>> from dgl_maxk.sampling import DeviceGraph, NeighborSampler
    >>> g = dgl.rand_graph(100, 800)
    >>> weight = torch.rand(g.num_edges())
    >>> _, _, (block,) = NeighborSampler([4]).sample(DeviceGraph.of(g, "cpu"), torch.arange(8))
    >>> weight[block.edge_ids].shape == (block.num_edges(),)
    True
    """

    is_block = True

    def __init__(self, indptr, indices, src_nodes, num_dst, max_in_degree=None,
                 edge_ids=None, src_out_degrees=None):
        self.src_nodes = src_nodes
        self.edge_ids = edge_ids
        # rows in pick order: not sorted by source (no source slices, no host sync to check)
        self.plan = GraphPlan(indptr, indices, None, src_nodes.numel(), num_dst,
                              max_in_degree=max_in_degree, rows_sorted=False,
                              norm_out_degrees=src_out_degrees)

    @property
    def device(self):
        return self.plan.device

    @property
    def dst_nodes(self):
        """Global ids of the destination nodes (the first ``num_dst`` source nodes)."""
        return self.src_nodes[:self.plan.num_dst]

    def num_src_nodes(self) -> int:
        return self.plan.num_src

    def num_dst_nodes(self) -> int:
        return self.plan.num_dst

    def num_edges(self) -> int:
        return self.plan.num_edges

    def in_degrees(self) -> torch.Tensor:
        return self.plan.in_degrees

    def to(self, device, **kwargs):
        """The block itself, on its device already (a DGL training loop's
        ``[b.to(device, non_blocking=True) for b in blocks]``: the keywords change nothing); a
        sampled block stays where it was sampled."""
        device = torch.device(device)
        if device.type == self.device.type and device.index in (None, self.device.index):
            return self
        raise ValueError(f"a SampledBlock stays on the device it was sampled on "
                         f"({self.device}): sample on {device} (DeviceGraph.of(g, device)), "
                         f"or move block.to_dgl()")

    def __getattr__(self, name):
        # only reached for what this block lacks of DGL's block API
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"'SampledBlock' object has no attribute {name!r}: it holds what "
                             "dgl_maxk's layers take; block.to_dgl() gives a DGL block (on "
                             "the CPU) with all of DGL's API, for stock DGL layers")

    def to_dgl(self):
        """The same block as a DGL block on the CPU (edge i is CSR entry i), with the global
        node ids in ``srcdata[dgl.NID]`` and ``dstdata[dgl.NID]`` (and the edge ids, if the
        block has them, in ``edata[dgl.EID]``), for stock DGL layers."""
        plan = self.plan
        src = plan.indices.cpu()
        dst = plan.dst_of_edge.cpu()
        block = dgl.create_block((src, dst), num_src_nodes=plan.num_src,
                                 num_dst_nodes=plan.num_dst)
        block.srcdata[dgl.NID] = self.src_nodes.cpu()
        block.dstdata[dgl.NID] = self.dst_nodes.cpu()
        if self.edge_ids is not None:
            block.edata[dgl.EID] = self.edge_ids.cpu()
        return block

    def __repr__(self):
        return (f"SampledBlock(num_src_nodes={self.num_src_nodes()}, num_dst_nodes="
                f"{self.num_dst_nodes()}, num_edges={self.num_edges()}, device={self.device})")


def check_graph(graph):
    """Raise a DGLError unless ``graph`` is a DGLGraph or block with one edge type, or a
    :class:`SampledBlock`."""
    if isinstance(graph, SampledBlock):
        return
    if not isinstance(graph, dgl.DGLGraph):
        raise DGLError(f"expected a DGLGraph or a DGL block, got {type(graph).__name__}")
    if len(graph.canonical_etypes) != 1:
        raise DGLError(
            "dgl_maxk aggregates over graphs with one edge type; this graph has "
            f"{len(graph.canonical_etypes)} ({graph.canonical_etypes}). Use "
            "dgl.nn.HeteroGraphConv over dgl_maxk layers, or dgl.to_homogeneous.")


def graph_plan(graph, device) -> GraphPlan:
    """The cached :class:`GraphPlan` of ``graph`` on ``device`` (built on first use).

    A model compiled with ``torch.compile`` reads the cached plan (the graph's DGL calls
    cannot be traced): build it first, by this call or by one eager call of the model."""
    check_graph(graph)
    device = torch.device(device)
    if device.index is None and device.type == "cuda":  # one cache entry for cuda, cuda:0
        device = torch.device("cuda", torch.cuda.current_device())
    if isinstance(graph, SampledBlock):
        if graph.plan.device != device:
            raise DGLError(f"the sampled block is on {graph.plan.device} but the features are "
                           f"on {device}")
        return graph.plan
    return cached_per_graph("_dgl_maxk_plans", graph, device, _build_plan)


def _build_plan(graph, device) -> GraphPlan:
    if compiling():  # DGL's C API, next, breaks the graph anyway: say what avoids it
        torch._dynamo.graph_break(
            "building a graph's plan calls DGL's C API, which torch.compile cannot trace: for "
            "one graph, build it first (dgl_maxk.graph_plan(graph, device), or one eager "
            "call)")
    if graph.device.type != "cpu" and graph.device != device:
        raise DGLError(
            f"the graph is on {graph.device} but the features are on {device}; move one of "
            "them (a graph on the CPU may be used with features on any device)")
    return GraphPlan.from_graph(graph, device)


class _PerGraph:
    """What :func:`cached_per_graph` keeps on a graph: one value per device, for the graph
    index ``index``. A pickled or deep-copied graph takes an empty one (the values may sit
    on a GPU and are rebuilt on demand)."""

    def __init__(self, index):
        self.index, self.values = index, {}

    def __reduce__(self):
        return _PerGraph, (None,)


def cached_per_graph(attribute: str, graph, device, build):
    """``build(graph, device)``, kept on ``graph`` (as ``attribute``) per device until the
    graph's structure changes (``add_edges``, ... replace DGL's graph index). On the graph,
    not in a table, so that ``torch.compile`` can read it and guard on it."""
    cache = graph.__dict__.get(attribute)
    if cache is None or cache.index is not graph._graph:
        cache = _PerGraph(graph._graph)
        setattr(graph, attribute, cache)
    if device not in cache.values:
        cache.values[device] = build(graph, device)
    return cache.values[device]
