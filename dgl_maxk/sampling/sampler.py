"""Uniform neighbour sampling without replacement, in torch, on the device of the graph.

The in-edges of each row are picked by the tensors' backend (CUDA kernels, or the pure-torch
reference) at positions in the graph's CSR, where it reads the block's source nodes and its
edges' ids in the graph, and relabelled: the block's source nodes are its destination nodes,
then the other neighbours in the order of their first edge, as DGL's ``to_block`` numbers
them. The picks go into room for the most the fan-outs allow, and each hop takes the count
of its destination nodes from the hop before on the device, so that a batch's kernels are
all queued before one read back to the host of its blocks' sizes
(:meth:`NeighborSampler.start`); everything else stays on the device. The result is that
of DGL's ``NeighborSampler`` with ``replace=False`` in distribution: every destination node
keeps ``min(in-degree, fan-out)`` in-neighbours, each subset of that size equally likely.
The random streams differ from DGL's.
"""
from __future__ import annotations

import contextlib
import functools
import numbers
from typing import NamedTuple, Optional

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
        #: (fan-outs, batch size) -> the CapturedSamplers no pass holds (captured_sampler)
        self.captured_samplers = {}

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

#: The most edges a hop makes room for before its destination rows are counted: each hop
#: makes room for the most the fan-out allows over every row the hop before had room for,
#: which grows hop by hop; a batch with a hop past it counts each hop's rows first (a read
#: back to the host a hop). Products-sized batches of 1,024 seeds with fan-outs 15, 10, 5
#: make room for 1.0M edges at most, papers100M-sized ones of 4,096 for 4.1M.
ROOM_WITHOUT_READ = 1 << 23

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
        return self.start(graph, seeds, generator).result()

    def start(self, graph: DeviceGraph, seeds: torch.Tensor, generator=None) -> "PendingBatch":
        """:meth:`sample`, its kernels queued on the current stream and nothing read back
        (but the seeds' check, and the sizes of hops without a :func:`room_plan`): the
        :class:`PendingBatch`'s ``result()`` reads the blocks' sizes once, and is the batch."""
        check_device_graph(graph)
        seeds = check_seeds(seeds, graph.num_nodes, scan=checks_enabled()).to(graph.device)
        plan = room_plan(graph, seeds.numel(), self.fanouts)
        if plan is None:
            return _pending(seeds, _counted_hops(graph, seeds, self.fanouts, generator))
        draws = torch.rand(plan.num_draws, dtype=torch.float64, device=graph.device,
                           generator=generator)
        return _pending(seeds, queue_hops(graph, seeds, self.fanouts, plan, draws))


class RoomPlan(NamedTuple):
    """Per hop, output layer first: the destination rows (real ones first, then room), the
    draws a row takes (-1: none, every row takes all its in-edges) and the edges made room
    for; and all the hops' draws together."""
    rows: list
    picked: list
    capacity: list
    num_draws: int


def hop_room(graph: DeviceGraph, rows: int, fanout: int) -> tuple:
    """The draws each of ``rows`` destination rows takes for ``fanout`` (-1: none, every row
    takes all its in-edges) and the most edges the hop makes (None for a fan-out of -1,
    whose edges are counted: hubs would make that room vast)."""
    # a fan-out above every in-degree takes all in-edges: nothing to draw (n x fanout draws
    # would cost memory in proportion to the fan-out, not to the degrees)
    picked = fanout if 0 < fanout <= graph.max_in_degree else -1
    return picked, (rows * min(fanout, graph.max_in_degree) if fanout > 0 else None)


def room_plan(graph: DeviceGraph, num_seeds: int, fanouts) -> Optional[RoomPlan]:
    """How a batch of ``num_seeds`` seeds is sampled without reading its sizes: each hop
    makes room for the most the fan-out allows over every row the hop before had room for
    (at most every node); None where a hop takes all in-edges (-1) or would make room for
    more than :data:`ROOM_WITHOUT_READ` edges."""
    rows, picked, capacity, n = [], [], [], num_seeds
    for fanout in reversed(fanouts):
        draws, room = hop_room(graph, n, fanout)
        if room is None or room > ROOM_WITHOUT_READ:
            return None
        rows.append(n)
        picked.append(draws)
        capacity.append(room)
        n = min(n + room, graph.num_nodes)
    return RoomPlan(rows, picked, capacity, sum(r * max(p, 0) for r, p in zip(rows, picked)))


def queue_hops(graph: DeviceGraph, seeds, fanouts, plan: RoomPlan, draws) -> list:
    """Every hop's :func:`start_block` as ``plan`` says, each taking its destination count
    from the hop before on the device, and its draws from ``draws`` (``plan.num_draws``);
    input layer first. Nothing is read back to the host, so a CUDA graph can hold it."""
    dst, rows, hops, offset = seeds, None, [], 0
    for fanout, n, picked, capacity in zip(reversed(fanouts), plan.rows, plan.picked,
                                           plan.capacity):
        hop_draws = draws[offset:offset + n * picked].view(n, picked) if picked > 0 else None
        offset += n * max(picked, 0)
        hops.insert(0, start_block(graph, dst, fanout, rows=rows, draws=hop_draws,
                                   capacity=capacity))
        # the next hop's destination rows: these sources, of which at most every node
        dst, rows = hops[0].src_nodes[:graph.num_nodes], hops[0].counts[1]
    return hops


def _counted_hops(graph: DeviceGraph, seeds, fanouts, generator) -> list:
    """Every hop's block, input layer first, each hop's destination rows counted first (a
    read back to the host) and its draws drawn then."""
    dst, hops = seeds, []
    for fanout in reversed(fanouts):
        hops.insert(0, start_block(graph, dst, fanout, generator))
        dst = hops[0].src_nodes[:int(hops[0].counts[1])]
    return hops


def _pending(seeds, hops, counts=None, owner=None) -> "PendingBatch":
    """The batch of ``hops``, its sizes (``counts``: the hops' counts stacked) copied to
    pinned memory behind its kernels on a GPU; ``owner``: the CapturedSampler whose tensors
    the hops are."""
    sizes = torch.stack([hop.counts for hop in hops]) if counts is None else counts
    ready = None
    if sizes.is_cuda:  # result() waits for this copy alone
        host = torch.empty(sizes.shape, dtype=sizes.dtype, pin_memory=True)
        sizes = host.copy_(sizes, non_blocking=True)
        ready = torch.cuda.current_stream(seeds.device).record_event()
    return PendingBatch(seeds, hops, sizes, ready, owner)


class CapturedSampler:
    """:meth:`NeighborSampler.start` for batches of ``batch_size`` seeds of one graph,
    replayed from a CUDA graph: per batch the seeds and the draws are copied in and one
    replay runs the hops' kernels, in place of some 30 launches from Python, whose host time
    bounded the sampled step (docs' performance notes). The same batches as ``start`` from
    the same generator. One replay's outputs are copied out by its ``result()``, which must
    come before the next replay (one thread, in order: :func:`captured_sampler`); a replay
    on another stream waits for the last one and its copy. The graph's tensors stay
    allocated while it lives (about 120 MB for products-sized batches of 1,024 seeds with
    fan-outs 15, 10, 5, most of it the relabelling's hash table;
    ``DeviceGraph.captured_samplers.clear()`` lets them go)."""

    def __init__(self, graph: DeviceGraph, fanouts, plan: RoomPlan):
        """``plan``: the :meth:`replay_plan` of the graph, the fan-outs and the batch size."""
        self.graph, self.fanouts, self.plan = graph, list(fanouts), plan
        self.batch_size = plan.rows[0]
        device = graph.device
        # distinct seeds for the eager run below, as a batch's are
        self.seeds = torch.arange(self.batch_size, dtype=torch.int64, device=device)
        self.draws = torch.zeros(self.plan.num_draws, dtype=torch.float64, device=device)
        self.used = None  # an event after the last replay, or after its blocks' copy
        self.cuda_graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream(device)
        stream = torch.cuda.Stream(device)  # capture needs a stream other than the default
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            # once eagerly: the kernels compiled and loaded before capture
            queue_hops(graph, self.seeds, self.fanouts, self.plan, self.draws)
            # thread-local: other threads (a training step's) go on meanwhile
            self.cuda_graph.capture_begin(capture_error_mode="thread_local")
            try:
                self.hops = queue_hops(graph, self.seeds, self.fanouts, self.plan, self.draws)
                self.counts = torch.stack([hop.counts for hop in self.hops])
            finally:
                self.cuda_graph.capture_end()
        caller.wait_stream(stream)

    @staticmethod
    def replay_plan(graph: DeviceGraph, fanouts, batch_size: int) -> Optional[RoomPlan]:
        """The :func:`room_plan` of batches of this size, where they can be replayed (as
        many seeds as the graph has nodes at most, and kernels that sample each hop without
        reads); None where not."""
        plan = (room_plan(graph, batch_size, fanouts)
                if 0 < batch_size <= graph.num_nodes else None)
        backend = backends.for_tensor(graph.indptr)
        if plan is None or not all(map(backend.samples_without_reads, plan.picked)):
            return None
        return plan

    def start(self, seeds, generator=None) -> "PendingBatch":
        """:meth:`NeighborSampler.start` of ``batch_size`` seeds (distinct ids on the graph's
        device, not checked)."""
        if seeds.shape != self.seeds.shape:
            raise ValueError(f"this CapturedSampler takes {self.batch_size} seeds, got "
                             f"{tuple(seeds.shape)}")
        stream = torch.cuda.current_stream(self.seeds.device)
        if self.used is not None:
            stream.wait_event(self.used)
        self.seeds.copy_(seeds)
        torch.rand(self.draws.shape, dtype=torch.float64, device=self.draws.device,
                   generator=generator, out=self.draws)
        self.cuda_graph.replay()
        self.used = stream.record_event()
        return _pending(seeds, self.hops, self.counts, owner=self)


@contextlib.contextmanager
def captured_sampler(graph: DeviceGraph, fanouts, batch_size: int):
    """A function giving one pass in one thread its :class:`CapturedSampler` of ``graph``
    (None where :meth:`~CapturedSampler.replay_plan` has none), taken at its first call,
    for the pass's first full batch. Each is made once and kept on the graph for later
    passes (a pass of another loader included); passes at the same time take one each."""
    taken, key = [], (tuple(fanouts), batch_size)

    def take():
        if not taken:
            free = graph.captured_samplers.get(key)
            if free:
                taken.append(free.pop())
            else:
                plan = CapturedSampler.replay_plan(graph, fanouts, batch_size)
                taken.append(None if plan is None else CapturedSampler(graph, fanouts, plan))
        return taken[0]
    try:
        yield take
    finally:
        if taken and taken[0] is not None:
            graph.captured_samplers.setdefault(key, []).append(taken[0])


class PendingHop(NamedTuple):
    """A block whose kernels are queued (:func:`start_block`): tensors sized for the most
    the fan-out allows, valid up to ``counts``."""
    indptr: torch.Tensor  #: (destination rows + 1,): the rows past the real ones are empty
    src_nodes: torch.Tensor
    local: torch.Tensor
    edge_ids: Optional[torch.Tensor]
    counts: torch.Tensor  #: [edges, source nodes], int64 on the device
    fanout: int

    def block(self, num_dst: int, sizes, out_degrees=None, copy=False) -> SampledBlock:
        """The block of ``num_dst`` destination nodes and ``sizes`` = (edges, source nodes),
        its counts read back (``copy``: in tensors of its own); ``out_degrees`` (the
        graph's) gives its sources theirs."""
        num_edges, num_src = sizes
        take = torch.clone if copy else (lambda t: t)
        src_nodes = take(self.src_nodes[:num_src])
        return SampledBlock(take(self.indptr[:num_dst + 1]), take(self.local[:num_edges]),
                            src_nodes, num_dst,
                            max_in_degree=self.fanout if self.fanout > 0 else None,
                            edge_ids=None if self.edge_ids is None else
                            take(self.edge_ids[:num_edges]),
                            src_out_degrees=None if out_degrees is None else
                            out_degrees[src_nodes])


class PendingBatch(NamedTuple):
    """A batch whose kernels are queued (:meth:`NeighborSampler.start`)."""
    seeds: torch.Tensor
    hops: list  #: a PendingHop per layer, input layer first
    sizes: torch.Tensor  #: (layers, 2): each hop's counts, on the host once ``ready``
    ready: Optional[torch.cuda.Event]
    owner: Optional[CapturedSampler] = None  #: whose tensors the hops are: copied out

    def result(self):
        """(input_nodes, output_nodes, blocks), once the blocks' sizes are on the host."""
        if self.ready is not None:
            self.ready.synchronize()
        sizes = self.sizes.tolist()
        num_dst = [num_src for _, num_src in sizes[1:]] + [self.seeds.numel()]
        blocks = [hop.block(n, hop_sizes, copy=self.owner is not None)
                  for hop, n, hop_sizes in zip(self.hops, num_dst, sizes)]
        if self.owner is not None:  # the next replay waits for the copies
            self.owner.used = torch.cuda.current_stream(self.seeds.device).record_event()
        return blocks[0].src_nodes, self.seeds, blocks


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


def _block_rows(graph_indptr, dst, fanout: int, rows=None):
    """The row pointers of :func:`block_indptr`, on the device (nothing read back); with
    ``rows`` (a count on the device), the rows of ``dst`` past it are empty."""
    count = backends.for_tensor(dst).block_degrees(graph_indptr, dst, fanout, rows)
    indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(count, 0, out=indptr[1:])
    return indptr


def start_block(graph: DeviceGraph, dst: torch.Tensor, fanout: int, generator=None,
                rows: Optional[torch.Tensor] = None, draws: Optional[torch.Tensor] = None,
                capacity: Optional[int] = None) -> PendingHop:
    """Queue the kernels of the block of ``fanout`` in-neighbours (all for -1) of each node
    of ``dst``, or of its first ``rows`` (an int64 count on the device: the rest of ``dst``
    is room), with ``draws`` (a row's draws a row, for rows of more in-edges than the
    fan-out; drawn from ``generator`` if not given) and room for ``capacity`` edges (the
    most the fan-out allows if not given); nothing is read back to the host but, for -1,
    the block's edge count."""
    n = dst.numel()
    indptr = _block_rows(graph.indptr, dst, fanout, rows)
    picked, room = hop_room(graph, n, fanout)
    if draws is None and picked > 0:
        draws = torch.rand(n, picked, dtype=torch.float64, device=dst.device,
                           generator=generator)
    if capacity is None:
        capacity = int(indptr[-1]) if room is None else room
    src_nodes, local, edge_ids, counts = backends.for_tensor(dst).sample_block_edges(
        graph.indptr, graph.indices, graph.edge_ids, dst, indptr, capacity, picked, draws,
        rows)
    return PendingHop(indptr, src_nodes, local, edge_ids, counts, fanout)


def sample_block(graph: DeviceGraph, dst: torch.Tensor, fanout: int, generator=None,
                 graph_degrees: bool = False) -> SampledBlock:
    """The block of ``fanout`` in-neighbours (all for -1) of each node of ``dst``; with
    ``graph_degrees``, its sources keep their out-degrees in the graph
    (``SampledBlock(src_out_degrees=...)``)."""
    hop = start_block(graph, dst, fanout, generator)
    return hop.block(dst.numel(), hop.counts.tolist(),
                     graph.out_degrees if graph_degrees else None)
