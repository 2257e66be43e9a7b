"""Evaluation by layer-wise inference, as DGL's examples do it for large graphs.

A whole-graph forward holds every layer's activations for every node at once (a
papers100M-sized SAGE 3 x 256: 114 GB a layer in fp32). Here the model's eval-mode forward
runs one aggregation layer at a time (``MaxKGNN.layer_input`` / ``layer_output``): for
batches of destination nodes (consecutive ids, a bounded number of edges each) with all their
in-neighbours, layer i's output rows go through the next layer's row-wise input step and are
stored for every node; only that stored input lives between layers (CBSR under MaxK: k values
and k one-byte columns a row, 18 GB for papers100M at k = 32). It is kept in GPU memory where
it fits beside a batch's work, else in pinned host memory, which the GPU reads row by row
directly (:func:`~dgl_maxk.sampling.gather_rows`). The last layer computes only the nodes
asked for. The logits are the whole-graph forward's, up to the order of the aggregation's
sums; GraphConv's degree norms use the graph's degrees, as on the whole graph.
"""
from __future__ import annotations

import torch

from ..models import MaxKGNN
from ..nn import GraphConv
from ..sampling import DeviceGraph, gather_rows
from ..sampling.rows import check_table
from ..sampling.sampler import check_device_graph, row_ranges, sample_block
from ..sparse import CBSR, input_checks

#: Per batch: at most this many edges and destination nodes.
BATCH_EDGES = 1 << 22
BATCH_NODES = 1 << 18
#: GPU memory left free beside a layer's stored inputs and outputs, besides two batches'
#: gathered rows.
HEADROOM_BYTES = 2 << 30
STORAGE = ("auto", "device", "host")


@torch.no_grad()
def layerwise_logits(model, graph: DeviceGraph, features, nodes, *, batch_edges=BATCH_EDGES,
                     batch_nodes=BATCH_NODES, storage="auto"):
    """The logits of ``nodes`` (node ids, in any order, repeats allowed) of a dgl_maxk model
    in eval mode on ``graph``, layer by layer (see the module's description).

    ``features``: every node's input rows, on the graph's device or in host memory (pinned,
    for a GPU: read by it directly). ``storage``: where each layer's stored input goes:
    'auto' (the GPU where it fits, else pinned host memory), 'device' or 'host'. The
    caller's autocast applies; stored rows keep the dtype the layers produce.
    """
    if not isinstance(model, MaxKGNN):
        raise TypeError(f"layer-wise inference takes a model of dgl_maxk.models, got "
                        f"{type(model).__name__}")
    check_device_graph(graph)
    check_table("features", features, graph.num_nodes, graph.device)
    if model.training:
        raise ValueError("layer-wise inference computes the eval-mode forward: call "
                         "model.eval() first")
    if storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {storage!r}")
    device, last = graph.device, model.num_layers - 1
    nodes, order = torch.unique(torch.as_tensor(nodes).to(device, torch.int64),
                                return_inverse=True)
    if nodes.numel() and not 0 <= int(nodes[0]) <= int(nodes[-1]) < graph.num_nodes:
        raise ValueError(f"node ids must be in [0, {graph.num_nodes}), got ids from "
                         f"{int(nodes[0])} to {int(nodes[-1])}")
    degrees = any(isinstance(m, GraphConv) and m._norm in ("left", "both")
                  for m in model.modules())
    ranges = row_ranges(graph.indptr, batch_edges, batch_nodes)
    where = (graph.num_nodes, device, storage, batch_edges)
    stored = _store(((r0, r1, model.layer_input(0, features[r0:r1].to(device,
                                                                     non_blocking=True)))
                     for r0, r1, _, _ in ranges), *where)
    for i in range(last):
        inputs = stored
        stored = _store(((r0, r1, model.layer_input(i + 1, _layer(
            model, i, graph, inputs, torch.arange(r0, r1, device=device), degrees)))
            for r0, r1, _, _ in ranges), *where)
        inputs.release()
    degree = graph.indptr[nodes + 1] - graph.indptr[nodes]
    offsets = torch.zeros(nodes.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(degree, 0, out=offsets[1:])
    logits = [model.lin_out(_layer(model, last, graph, stored, nodes[a:b], degrees))
              for a, b, _, _ in row_ranges(offsets, batch_edges, batch_nodes)]
    stored.release()
    if not logits:
        return torch.zeros((0, model.lin_out.out_features), device=device)
    return torch.cat(logits)[order]


def _layer(model, i, graph, stored, dst, degrees):
    """Layer ``i``'s output rows for the nodes ``dst``, from all their in-neighbours."""
    block = sample_block(graph, dst, -1, graph_degrees=degrees)
    return model.layer_output(i, block, stored.read(block.src_nodes))


class _Rows:
    """One layer's input for every node: a dense tensor or CBSR (values, indices), on the
    device or in pinned host memory."""

    def __init__(self, parts, d, device):
        self.parts, self.d, self.device = parts, d, device

    def read(self, index):
        with input_checks(False):  # a block's sources: ids of the graph, a row each here
            parts = [gather_rows(part, index) for part in self.parts]
        return parts[0] if self.d is None else CBSR(*parts, self.d, _pattern_checked=True)

    def release(self):
        """Wait, where the rows are pinned host memory, for the GPU's reads of them: torch's
        host allocator, which does not see those reads, may hand the memory out again."""
        if self.parts[0].is_pinned():
            torch.cuda.synchronize(self.device)
        self.parts = None


def _store(batches, n, device, storage, batch_edges) -> _Rows:
    """The rows of ``batches`` ((r0, r1, rows of nodes r0 to r1) covering every node),
    stored where :func:`layerwise_logits`' ``storage`` says."""
    out = None
    for r0, r1, rows in batches:
        parts = (rows.values, rows.indices) if isinstance(rows, CBSR) else (rows,)
        if out is None:
            out = _Rows(_allocate(parts, n, device, storage, batch_edges),
                        rows.d if isinstance(rows, CBSR) else None, device)
        for part, new in zip(out.parts, parts):
            part[r0:r1].copy_(new, non_blocking=True)
    return out


def _allocate(parts, n, device, storage, batch_edges):
    """Empty tensors of ``n`` rows like ``parts``, where :func:`layerwise_logits`'s
    ``storage`` puts them."""
    row_bytes = sum(p[0].numel() * p.element_size() for p in parts)
    on_device = device.type != "cuda" or storage == "device" or (
        storage == "auto" and _fits(n * row_bytes + 2 * batch_edges * row_bytes, device))
    return [torch.empty((n,) + p.shape[1:], dtype=p.dtype,
                        device=device if on_device else "cpu", pin_memory=not on_device)
            for p in parts]


def _fits(nbytes: int, device) -> bool:
    """Whether ``nbytes`` fit in the GPU's free memory (torch's cached blocks included) with
    :data:`HEADROOM_BYTES` to spare."""
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return nbytes + HEADROOM_BYTES <= free + cached
