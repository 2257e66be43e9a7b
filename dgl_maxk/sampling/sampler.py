"""Uniform neighbour sampling without replacement, in torch, on the device of the graph.

The in-edges of each row are picked by the tensors' backend (CUDA kernels, or the pure-torch
reference) at positions in the graph's CSR, where it reads the block's source nodes and its
edges' ids in the graph, and relabelled: the block's source nodes are its destination nodes,
then the other neighbours in the order of their first edge, as DGL's ``to_block`` numbers
them. On the GPU the picks go into room for the most the fan-out allows, so that a block
costs one read back to the host (its edge and source node counts, which size its tensors);
everything else stays on the device. The result is that of DGL's ``NeighborSampler`` with
``replace=False`` in distribution: every destination node keeps ``min(in-degree, fan-out)``
in-neighbours, each subset of that size equally likely. The random streams differ from DGL's.
"""
from __future__ import annotations

import functools
import numbers

import torch

from .. import backends
from ..sparse import SampledBlock, checks_enabled
from ..sparse.plan import cached_per_graph


class DeviceGraph:
    """The in-edges of a homogeneous graph as a CSR over destination nodes, on one device.

    Attributes
    ----------
    indptr : Tensor (num_nodes + 1,), int64
    indices : Tensor (num_edges,), int32 (int64 from 2^31 nodes)
        Source of each in-edge
    num_nodes : int
    edge_ids : Tensor (num_edges,), int32 or int64, optional
        The graph's id of each in-edge (``from_dgl`` sets DGL's edge ids), which the sampled
        blocks then carry

    Edge positions (``indptr`` and everything derived from it) are int64 throughout, so
    graphs of 2^31 edges and more sample as smaller ones do.
    """

    def __init__(self, indptr, indices, num_nodes, edge_ids=None):
        if indptr.dtype != torch.int64 or indptr.shape != (num_nodes + 1,):
            raise ValueError(f"indptr must be int64 with num_nodes + 1 = {num_nodes + 1} "
                             f"entries, got {indptr.dtype} of shape {tuple(indptr.shape)}")
        if indices.dtype not in (torch.int32, torch.int64) or indices.dim() != 1:
            raise ValueError(f"indices must be a 1-d int32 or int64 tensor, got {indices.dtype} "
                             f"{tuple(indices.shape)}")
        if indices.dtype == torch.int32 and num_nodes > 2 ** 31:
            raise ValueError(f"indices must be int64 for a graph of {num_nodes} nodes (int32 "
                             "holds node ids below 2^31)")
        if indices.device != indptr.device:
            raise ValueError(f"indptr is on {indptr.device} but indices on {indices.device}")
        if edge_ids is not None and (edge_ids.dtype not in (torch.int32, torch.int64)
                                     or edge_ids.shape != indices.shape
                                     or edge_ids.device != indices.device):
            raise ValueError(f"edge_ids must be an int32 or int64 tensor like indices "
                             f"({tuple(indices.shape)} on {indices.device}), got "
                             f"{edge_ids.dtype} {tuple(edge_ids.shape)} on {edge_ids.device}")
        self.indptr, self.indices, self.num_nodes = indptr, indices, int(num_nodes)
        self.edge_ids = edge_ids

    @property
    def device(self):
        return self.indptr.device

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @functools.cached_property
    def max_in_degree(self) -> int:
        """The largest in-degree (read back to the host once)."""
        return int((self.indptr[1:] - self.indptr[:-1]).max()) if self.num_nodes else 0

    @functools.cached_property
    def out_degrees(self) -> torch.Tensor:
        """(num_nodes,) int64: each node's out-degree, counted once, a slice of the indices
        at a time (no int64 copy of them all)."""
        counts = torch.zeros(self.num_nodes, dtype=torch.int64, device=self.device)
        ones = torch.ones(1, dtype=torch.int64, device=self.device)
        for chunk in self.indices.split(_OUT_DEGREE_CHUNK):
            counts.index_add_(0, chunk, ones.expand(chunk.numel()))
        return counts

    def to(self, device) -> "DeviceGraph":
        """This graph on ``device`` (itself when it is there)."""
        device = torch.device(device)
        if device == self.device or (device.index is None and device.type == self.device.type):
            return self
        return DeviceGraph(self.indptr.to(device), self.indices.to(device), self.num_nodes,
                           None if self.edge_ids is None else self.edge_ids.to(device))

    @classmethod
    def of(cls, graph, device) -> "DeviceGraph":
        """:meth:`from_dgl`, built once per graph and device and cached on the graph (a
        structural change of the graph replaces DGL's graph index and the cached copy); a
        DeviceGraph is moved to ``device`` (:meth:`to`)."""
        if isinstance(graph, DeviceGraph):
            return graph.to(device)
        return cached_per_graph("_dgl_maxk_device_graphs", graph, torch.device(device),
                                cls.from_dgl)

    @classmethod
    def from_dgl(cls, graph, device) -> "DeviceGraph":
        """The in-edges of a DGL graph with one node and edge type, on ``device``, with DGL's
        edge ids."""
        if graph.is_block:
            raise ValueError("DeviceGraph takes a graph, not a block")
        if len(graph.ntypes) != 1 or len(graph.canonical_etypes) != 1:
            raise ValueError(f"DeviceGraph takes a graph with one node type and one edge type, "
                             f"got node types {graph.ntypes} and edge types "
                             f"{graph.canonical_etypes}")
        src, dst = (t.to(device, torch.int64) for t in graph.edges())
        n = graph.num_nodes()
        order = torch.argsort(dst, stable=True)
        index_dtype = torch.int32 if n < 2 ** 31 else torch.int64
        indices = src[order].to(index_dtype)
        del src
        edge_ids = order.to(torch.int32 if order.numel() < 2 ** 31 else torch.int64)
        del order
        indptr = torch.zeros(n + 1, dtype=torch.int64, device=device)
        torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
        return cls(indptr, indices, n, edge_ids)

    def __repr__(self):
        return (f"DeviceGraph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"device={self.device})")


#: Indices counted at a time by ``DeviceGraph.out_degrees``.
_OUT_DEGREE_CHUNK = 1 << 26

#: What a list of fan-outs must be (the sampler's rule, also the config's).
FANOUTS_RULE = "must be a non-empty list of positive integers (or -1 for all neighbours)"


def check_fanouts(fanouts) -> list:
    """``fanouts`` as a list of ints, one per layer, each positive or -1; else a ValueError."""
    fanouts = list(fanouts)
    if not fanouts or not all(isinstance(f, numbers.Integral) and not isinstance(f, bool)
                              and (f > 0 or f == -1) for f in fanouts):
        raise ValueError(f"fan-outs {FANOUTS_RULE}, one per layer; got {fanouts!r}")
    return [int(f) for f in fanouts]


def check_seeds(seeds, num_nodes: int, scan: bool = True) -> torch.Tensor:
    """``seeds`` (a tensor or sequence of node ids) as a 1-d int64 tensor; a ValueError for
    non-integer or multi-dimensional seeds and, with ``scan`` (which reads them back to the
    host), for repeated ids or ids outside ``[0, num_nodes)``."""
    seeds = torch.as_tensor(seeds)
    if seeds.numel() and (seeds.is_floating_point() or seeds.is_complex()
                          or seeds.dtype == torch.bool):
        raise ValueError(f"seeds must be integer node ids, got {seeds.dtype}")
    if seeds.dim() != 1:
        raise ValueError(f"seeds must be 1-d, got shape {tuple(seeds.shape)}")
    seeds = seeds.to(torch.int64)
    if scan and seeds.numel():
        distinct = torch.unique(seeds).numel()
        low, high = torch.stack([seeds.min(), seeds.max()]).tolist()
        if distinct != seeds.numel():
            raise ValueError(f"seeds must not repeat: {seeds.numel() - distinct} repeated "
                             "node id(s)")
        if low < 0 or high >= num_nodes:
            raise ValueError(f"seed node ids must be in [0, {num_nodes}), got ids from {low} "
                             f"to {high}")
    return seeds


def check_device_graph(graph):
    """A TypeError unless ``graph`` is a :class:`DeviceGraph` (a DGL graph, as DGL's samplers
    take, is converted once by ``DeviceGraph.of``)."""
    if not isinstance(graph, DeviceGraph):
        raise TypeError(f"the device sampler takes a DeviceGraph, got {type(graph).__name__}: "
                        "make one with dgl_maxk.sampling.DeviceGraph.of(g, device)")


class NeighborSampler:
    """Sample a block per layer, from the output layer down, as DGL's ``NeighborSampler``.

    Parameters
    ----------
    fanouts : list of int
        Neighbours kept per destination node in each layer, input layer first; -1 keeps all.

    Example
    -------
    >>> import dgl, torch
    >>> from dgl_maxk.sampling import DeviceGraph, NeighborSampler
    >>> graph = DeviceGraph.from_dgl(dgl.rand_graph(1000, 8000), "cpu")
    >>> input_nodes, output_nodes, blocks = NeighborSampler([10, 5]).sample(
    ...     graph, torch.arange(32))
    >>> [b.num_dst_nodes() for b in blocks][-1]
    32
    """

    def __init__(self, fanouts):
        self.fanouts = check_fanouts(fanouts)

    def sample(self, graph: DeviceGraph, seeds: torch.Tensor, generator=None):
        """(input_nodes, output_nodes, blocks) for ``seeds`` (global ids in
        ``[0, graph.num_nodes)`` without repeats, any integer tensor or sequence), as DGL's
        loaders give them, int64 on the graph's device: ``blocks[0]`` is the input layer's,
        and each block's source nodes start with its destination nodes. The seeds' ids are
        checked (one read back to the host) unless content checks are off
        (:func:`dgl_maxk.input_checks`): :class:`~dgl_maxk.sampling.NeighborLoader` checks its
        seeds once, and samples without."""
        check_device_graph(graph)
        seeds = check_seeds(seeds, graph.num_nodes, scan=checks_enabled()).to(graph.device)
        dst = seeds
        blocks = []
        for fanout in reversed(self.fanouts):
            blocks.insert(0, sample_block(graph, dst, fanout, generator))
            dst = blocks[0].src_nodes
        return dst, seeds, blocks


def row_ranges(indptr, max_edges: int, max_rows: int | None = None) -> list:
    """Consecutive row ranges ``(r0, r1, e0, e1)`` covering the CSR of row pointers ``indptr``
    (rows [r0, r1), entries [e0, e1)), each of at most ``max_edges`` entries (a longer row
    alone) and ``max_rows`` rows: the chunks that bound the temporaries of whole-graph passes.
    One read back to the host per range."""
    num_rows, ranges, r0 = indptr.numel() - 1, [], 0
    max_rows = num_rows if max_rows is None else max_rows
    while r0 < num_rows:
        e0 = int(indptr[r0])
        r1 = int(torch.searchsorted(indptr, e0 + max_edges, right=True)) - 1
        r1 = min(max(r1, r0 + 1), r0 + max_rows, num_rows)
        ranges.append((r0, r1, e0, int(indptr[r1])))
        r0 = r1
    return ranges


def block_indptr(graph_indptr, dst, fanout: int):
    """(indptr, num_edges): the CSR row pointers of the block of ``dst`` in the graph of
    in-edge row pointers ``graph_indptr``, min(in-degree, ``fanout``) entries a row (all for
    -1), and its edge count, read back to the host."""
    indptr = _block_rows(graph_indptr, dst, fanout)
    return indptr, int(indptr[-1])


def _block_rows(graph_indptr, dst, fanout: int):
    """The row pointers of :func:`block_indptr`, on the device (nothing read back)."""
    count = backends.for_tensor(dst).block_degrees(graph_indptr, dst, fanout)
    indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(count, 0, out=indptr[1:])
    return indptr


def sample_block(graph: DeviceGraph, dst: torch.Tensor, fanout: int, generator=None,
                 graph_degrees: bool = False):
    """The block of ``fanout`` in-neighbours (all for -1) of each node of ``dst``; with
    ``graph_degrees``, its sources keep their out-degrees in the graph
    (``SampledBlock(src_out_degrees=...)``)."""
    n = dst.numel()
    indptr = _block_rows(graph.indptr, dst, fanout)
    # a fan-out above every in-degree takes all in-edges: nothing to draw (n x fanout draws
    # would cost memory in proportion to the fan-out, not to the degrees)
    picked = fanout if 0 < fanout <= graph.max_in_degree else -1
    draws = (torch.rand(n, picked, dtype=torch.float64, device=dst.device, generator=generator)
             if picked > 0 else None)
    # room for the most the fan-out allows, so that the block's sizes come back to the host
    # in one read; all in-edges (-1) are counted first, as hubs would make that room vast
    capacity = (n * min(fanout, graph.max_in_degree) if fanout > 0
                else int(indptr[-1]))
    src_nodes, local, edge_ids = backends.for_tensor(dst).sample_block_edges(
        graph.indptr, graph.indices, graph.edge_ids, dst, indptr, capacity, picked, draws)
    return SampledBlock(indptr, local, src_nodes, n,
                        max_in_degree=fanout if fanout > 0 else None, edge_ids=edge_ids,
                        src_out_degrees=graph.out_degrees[src_nodes] if graph_degrees else None)
