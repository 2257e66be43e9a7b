"""The device sampler (dgl_maxk.sampling) and what consumes its blocks.

- NeighborSampler's blocks checked edge by edge against random graphs (isolated and
  zero-in-degree nodes, a hub far above the fan-out, self-loops, multi-edges);
- the uniformity of its draws (single neighbours and pairs of neighbours on a star);
- dgl_maxk's layers on a SampledBlock against the same block in DGL (``to_dgl()``);
- the sync-free edge groups of plans with ``max_in_degree``;
- NeighborLoader: batch counts, ranks, shuffling, prefetch, its producer thread, errors;
- mini-batch training with the device sampler (loss, runs, resume);
- on a GPU: the same invariants and parities through the CUDA kernels, with no host sync.

Every test draws fresh random graphs and features (conftest seeds torch per test and prints
the seed when a test fails).
"""
from __future__ import annotations

import collections
import gc
import json
import math
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import dgl_maxk
from dgl_maxk import data as D
from dgl_maxk import training as T
from dgl_maxk._dgl import DGLError, dgl
from dgl_maxk.backends import cuda as cuda_backend
from dgl_maxk.models import build_model
from dgl_maxk.nn import GINConv, GraphConv, SAGEConv
from dgl_maxk.sampling import DeviceGraph, NeighborLoader, NeighborSampler
from dgl_maxk.sampling import loader as loader_module
from dgl_maxk.sampling import sampler as sampler_module
from dgl_maxk.sampling.sampler import sample_block
from dgl_maxk.sparse import GraphPlan, SampledBlock, graph_plan
from dgl_maxk.training import runner, sampling, step
from dgl_maxk.training import sampled_step
from dgl_maxk.training.sampled_step import SampledStep
from conftest import small_config

REPO = Path(__file__).resolve().parents[1]
THREAD_NAME = "dgl_maxk-sampler"
#: DGL's module of its own SAGEConv, whatever dgl_maxk.install may have put in dgl.nn (the
#: module, not the class, so that install has no module global of DGL's class to warn about)
stock_sageconv = dgl.nn.pytorch.conv.sageconv

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU (the device sampler's GPU path)")
needs_kernels = pytest.mark.skipif(not cuda_backend.available(),
                                   reason="no CUDA GPU with CuPy (dgl_maxk's CUDA kernels)")


# --------------------------------------------------------------------------- graphs

GRAPH_KINDS = ("rand_graph", "zero_in_degree", "hub", "self_loops", "multi_edges")
EMPTY = torch.zeros(0, dtype=torch.int64)


def make_graph(kind, n=60):
    """(graph, nodes a test's seeds should include) for a graph of the named kind."""
    if kind == "rand_graph":
        return dgl.rand_graph(n, 5 * n), EMPTY
    if kind == "zero_in_degree":
        # 6 isolated nodes (no edge at all) and 6 that only send edges
        perm = torch.randperm(n)
        isolated, senders, rest = perm[:6], perm[6:12], perm[12:]
        pool = torch.cat([senders, rest])
        src = pool[torch.randint(len(pool), (4 * n,))]
        dst = rest[torch.randint(len(rest), (4 * n,))]
        return dgl.graph((src, dst), num_nodes=n), torch.cat([isolated, senders])
    if kind == "hub":
        # one node receives from every other node: in-degree n - 1, far above the fan-outs
        hub = int(torch.randint(n, ()))
        g = dgl.rand_graph(n, 3 * n)
        others = torch.tensor([v for v in range(n) if v != hub])
        g = dgl.add_edges(g, others, torch.full_like(others, hub))
        return dgl.to_simple(g), torch.tensor([hub])
    if kind == "self_loops":
        return dgl.add_self_loop(dgl.remove_self_loop(dgl.rand_graph(n, 3 * n))), EMPTY
    if kind == "multi_edges":
        src, dst = torch.randint(n, (2 * n,)), torch.randint(n, (2 * n,))
        reps = torch.randint(1, 4, (2 * n,))
        return dgl.graph((src.repeat_interleave(reps), dst.repeat_interleave(reps)),
                         num_nodes=n), EMPTY
    raise ValueError(kind)


def mixed_graph(n=80, hub_degree=None):
    """A random graph with a hub (in-degree ``hub_degree``, default n - 1), 8 nodes without
    in-edges and self-loops by chance; returns (graph, seeds that include the hub and 3 of
    the nodes without in-edges, in random order)."""
    perm = torch.randperm(n)
    hub, no_in, rest = perm[0], perm[1:9], perm[9:]
    src = torch.randint(n, (4 * n,))
    dst = rest[torch.randint(len(rest), (4 * n,))]
    pool = perm[perm != hub]
    hub_src = pool[torch.randperm(len(pool))[:hub_degree or n - 1]]
    g = dgl.to_simple(dgl.graph((torch.cat([src, hub_src]),
                                 torch.cat([dst, torch.full_like(hub_src, int(hub))])),
                                num_nodes=n))
    return g, pick_seeds(n, 30, torch.cat([hub.view(1), no_in[:3]]))


def pick_seeds(n, count, include=EMPTY):
    """``count`` random distinct nodes plus ``include``, in random order."""
    seeds = torch.cat([include, torch.randperm(n)[:count]]).unique()
    return seeds[torch.randperm(len(seeds))]


def in_neighbours(graph):
    """{node: Counter of the sources of its in-edges} (multi-edges counted)."""
    src, dst = graph.edges()
    out = collections.defaultdict(collections.Counter)
    for s, d in zip(src.tolist(), dst.tolist()):
        out[d][s] += 1
    return out


def generator(device="cpu"):
    """A generator with a fresh seed (drawn from torch's seeded global stream)."""
    return torch.Generator(device=device).manual_seed(int(torch.randint(2 ** 62, ())))


# --------------------------------------------------------------------------- block checks

def check_block(block, neighbours, dst, fanout):
    """Assert that ``block`` is a valid sample of the in-edges of ``dst`` at ``fanout``."""
    assert isinstance(block, SampledBlock) and block.is_block
    plan = block.plan
    dst, src_nodes = dst.cpu(), block.src_nodes.cpu()
    indptr, indices = plan.indptr.cpu(), plan.indices.cpu()
    n, num_src = dst.numel(), src_nodes.numel()
    counts = indptr.diff()
    # shapes and the CSR itself
    assert block.num_dst_nodes() == n and block.num_src_nodes() == num_src
    assert indptr.numel() == n + 1 and int(indptr[0]) == 0
    assert int(indptr[-1]) == block.num_edges() == indices.numel() == plan.num_edges
    assert (counts >= 0).all()
    assert torch.equal(plan.in_degrees.cpu(), counts)
    assert torch.equal(block.in_degrees().cpu(), counts)
    assert torch.equal(plan.dst_of_edge.cpu(), torch.repeat_interleave(torch.arange(n), counts))
    assert indices.numel() == 0 or (int(indices.min()) >= 0 and int(indices.max()) < num_src)
    assert torch.equal(plan.out_degrees.cpu(), torch.bincount(indices, minlength=num_src))
    assert plan.max_in_degree == (fanout if fanout > 0 else None)
    # node ids: destinations first, sources unique
    assert torch.equal(block.dst_nodes.cpu(), dst)
    assert torch.equal(src_nodes[:n], dst)
    assert src_nodes.unique().numel() == num_src, "repeated source nodes"
    # the edges, in global ids, against the graph
    sampled_src = src_nodes[indices]
    for row, v in enumerate(dst.tolist()):
        kept = collections.Counter(sampled_src[indptr[row]:indptr[row + 1]].tolist())
        real = neighbours[v]
        degree = sum(real.values())
        want = degree if fanout == -1 else min(degree, fanout)
        assert sum(kept.values()) == want, (v, degree, fanout, kept)
        extra = {u: c for u, c in kept.items() if c > real[u]}
        assert not extra, f"node {v}: edges not in the graph or sampled twice: {extra}"
        if degree == want:
            assert kept == real, (v, kept, real)
    # the sources after the destinations are exactly the other sampled neighbours
    others = set(sampled_src.tolist()) - set(dst.tolist())
    assert set(src_nodes[n:].tolist()) == others and num_src == n + len(others)
    # the same block in DGL: edge i is CSR entry i, global ids in NID
    as_dgl = block.to_dgl()
    s, d = as_dgl.edges()
    assert as_dgl.is_block and as_dgl.num_src_nodes() == num_src and as_dgl.num_dst_nodes() == n
    assert torch.equal(s, indices) and torch.equal(d, plan.dst_of_edge.cpu())
    assert torch.equal(as_dgl.srcdata[dgl.NID], src_nodes)
    assert torch.equal(as_dgl.dstdata[dgl.NID], dst)


def check_sample(result, neighbours, seeds, fanouts):
    """Assert that ``sampler.sample``'s result for ``seeds`` is a valid chain of blocks:
    blocks[0] is the input layer's, each block's destinations are the next one's sources,
    the last block's destinations are the seeds."""
    input_nodes, output_nodes, blocks = result
    assert len(blocks) == len(fanouts)
    assert torch.equal(output_nodes.cpu(), seeds.cpu())
    assert torch.equal(input_nodes.cpu(), blocks[0].src_nodes.cpu())
    assert torch.equal(blocks[-1].dst_nodes.cpu(), seeds.cpu())
    for lower, upper in zip(blocks, blocks[1:]):
        assert torch.equal(lower.dst_nodes.cpu(), upper.src_nodes.cpu())
    dst = seeds
    for block, fanout in zip(reversed(blocks), reversed(fanouts)):
        check_block(block, neighbours, dst, fanout)
        dst = block.src_nodes


def block_tensors(block):
    plan = block.plan
    return (block.src_nodes, plan.indptr, plan.indices)


def assert_same_batches(a, b):
    """Two lists of (input_nodes, output_nodes, blocks) are equal edge for edge."""
    assert len(a) == len(b)
    for (in_a, out_a, blocks_a), (in_b, out_b, blocks_b) in zip(a, b):
        assert torch.equal(in_a, in_b) and torch.equal(out_a, out_b)
        assert len(blocks_a) == len(blocks_b)
        for x, y in zip(blocks_a, blocks_b):
            assert x.num_dst_nodes() == y.num_dst_nodes()
            for s, t in zip(block_tensors(x), block_tensors(y)):
                assert torch.equal(s, t)


def batches_differ(a, b):
    try:
        assert_same_batches(a, b)
    except AssertionError:
        return True
    return False


def sampler_threads():
    return {t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()}


# --------------------------------------------------------------------------- 1. the sampler

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("fanouts", [[3, 2], [-1, 4], [1, 1], [5, -1, 2]],
                         ids=lambda f: "_".join(map(str, f)))
@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_sampled_blocks_are_subgraphs_of_the_graph(kind, fanouts, device):
    g, include = make_graph(kind)
    seeds = pick_seeds(g.num_nodes(), 12, include)
    graph = DeviceGraph.from_dgl(g, device)
    assert graph.device.type == device
    result = NeighborSampler(fanouts).sample(graph, seeds.to(device), generator(device))
    assert all(b.device.type == device and b.src_nodes.device.type == device
               for b in result[2])
    # rows in pick order: the backward never walks them by source slice, nor syncs to check
    assert all(b.plan.rows_sorted_by_source() is False for b in result[2])
    check_sample(result, in_neighbours(g), seeds, fanouts)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_new_sources_are_numbered_by_their_first_edge(device):
    """A block's source nodes are its destination nodes, then the other neighbours in the
    order of their first edge (DGL's to_block numbering), on either backend."""
    g = dgl.rand_graph(300, 4000)
    graph = DeviceGraph.from_dgl(g, device)
    seeds = torch.randperm(300)[:25].to(device)
    _, _, blocks = NeighborSampler([6, 4]).sample(graph, seeds, generator(device))
    for block in blocks:
        n = block.num_dst_nodes()
        sources = block.src_nodes[block.plan.indices].tolist()
        dst = block.src_nodes[:n].tolist()
        expected = dst + [v for v in dict.fromkeys(sources) if v not in set(dst)]
        assert block.src_nodes.tolist() == expected


def test_hub_keeps_exactly_the_fanout():
    g, seeds = mixed_graph(80, hub_degree=70)
    neighbours = in_neighbours(g)
    hub = max(neighbours, key=lambda v: sum(neighbours[v].values()))
    assert sum(neighbours[hub].values()) >= 70
    graph = DeviceGraph.from_dgl(g, "cpu")
    for fanout in (1, 2, 7, 69):
        block = sample_block(graph, torch.tensor([hub]), fanout, generator())
        check_block(block, neighbours, torch.tensor([hub]), fanout)
        assert block.num_edges() == fanout


def test_device_graph_holds_the_in_edges():
    g, _ = make_graph("multi_edges")
    graph = DeviceGraph.from_dgl(g, "cpu")
    neighbours = in_neighbours(g)
    assert graph.num_nodes == g.num_nodes() and graph.device == torch.device("cpu")
    assert graph.indptr.numel() == g.num_nodes() + 1
    assert torch.equal(graph.indptr.diff(), g.in_degrees())
    for v in range(g.num_nodes()):
        row = graph.indices[graph.indptr[v]:graph.indptr[v + 1]].tolist()
        assert collections.Counter(row) == neighbours[v]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("fanouts", [[3, 2], [-1, 4]], ids=lambda f: "_".join(map(str, f)))
@pytest.mark.parametrize("kind", ["multi_edges", "hub", "self_loops"])
def test_sampled_edges_carry_their_ids_in_the_graph(kind, fanouts, device):
    """Each sampled edge's id is an edge of the graph from its source to its destination
    (multi-edges: each id once), in the block and in to_dgl()'s edata[dgl.EID]; weights
    gathered by those ids aggregate as DGL's block with the same weights does."""
    g, include = make_graph(kind)
    seeds = pick_seeds(g.num_nodes(), 12, include)
    graph = DeviceGraph.from_dgl(g, device)
    _, _, blocks = NeighborSampler(fanouts).sample(graph, seeds.to(device), generator(device))
    src_all, dst_all = g.edges()
    for block in blocks:
        eids = block.edge_ids.cpu()
        assert eids.dtype == torch.int64 and eids.numel() == block.num_edges()
        assert eids.unique().numel() == eids.numel()
        plan = block.plan
        assert torch.equal(src_all[eids], block.src_nodes.cpu()[plan.indices.cpu()])
        assert torch.equal(dst_all[eids], block.dst_nodes.cpu()[plan.dst_of_edge.cpu()])
        assert torch.equal(block.to_dgl().edata[dgl.EID], eids)
    weight = torch.rand(g.num_edges())
    block = blocks[-1]
    x = torch.randn(block.num_src_nodes(), 6)
    conv = SAGEConv(6, 4, "mean")
    got = conv.to(device)(block, x.to(device), edge_weight=weight.to(device)[block.edge_ids])
    dgl_block = block.to_dgl()
    want = conv.cpu()(dgl_block, x, edge_weight=weight[dgl_block.edata[dgl.EID]])
    assert torch.allclose(got.cpu(), want, atol=1e-5)


def test_a_device_graph_without_edge_ids_gives_blocks_without():
    g = dgl.rand_graph(50, 300)
    full = DeviceGraph.from_dgl(g, "cpu")
    bare = DeviceGraph(full.indptr, full.indices, full.num_nodes)
    _, _, (block,) = NeighborSampler([3]).sample(bare, torch.arange(10), generator())
    assert block.edge_ids is None and dgl.EID not in block.to_dgl().edata
    with pytest.raises(ValueError, match="edge_ids"):
        DeviceGraph(full.indptr, full.indices, full.num_nodes, full.edge_ids[:-1])
    with pytest.raises(ValueError, match="edge_ids"):
        DeviceGraph(full.indptr, full.indices, full.num_nodes, full.edge_ids.float())


def test_empty_seeds_give_empty_blocks():
    g, _ = make_graph("rand_graph")
    graph = DeviceGraph.from_dgl(g, "cpu")
    input_nodes, output_nodes, blocks = NeighborSampler([4, -1, 2]).sample(graph, EMPTY)
    assert input_nodes.numel() == 0 and output_nodes.numel() == 0 and len(blocks) == 3
    for block in blocks:
        assert block.num_src_nodes() == block.num_dst_nodes() == block.num_edges() == 0
        assert block.plan.indptr.tolist() == [0]
        assert block.to_dgl().num_edges() == 0


def test_sampling_is_a_function_of_the_generator():
    g, seeds = mixed_graph()
    graph = DeviceGraph.from_dgl(g, "cpu")
    sampler = NeighborSampler([3, 2])
    value = int(torch.randint(2 ** 62, ()))
    first = sampler.sample(graph, seeds, torch.Generator().manual_seed(value))
    again = sampler.sample(graph, seeds, torch.Generator().manual_seed(value))
    other = sampler.sample(graph, seeds, torch.Generator().manual_seed(value + 1))
    assert_same_batches([first], [again])
    assert batches_differ([first], [other])  # the hub alone has C(79, 2) choices


@pytest.mark.parametrize("fanouts", [[], [0], [2, -2], [3, 0]])
def test_bad_fanouts_are_refused(fanouts):
    with pytest.raises(ValueError, match="fan-outs"):
        NeighborSampler(fanouts)


def test_device_graph_refuses_blocks_heterographs_and_bad_csr():
    g = dgl.rand_graph(20, 60)
    with pytest.raises(ValueError, match="takes a graph, not a block"):
        DeviceGraph.from_dgl(dgl.to_block(g, torch.arange(5)), "cpu")
    hetero = dgl.heterograph({("a", "x", "b"): ([0, 1], [1, 0]), ("b", "y", "a"): ([0], [1])})
    with pytest.raises(ValueError, match=r"one node type and one edge type, got node types "
                                         r"\['a', 'b'\]"):
        DeviceGraph.from_dgl(hetero, "cpu")
    with pytest.raises(ValueError, match="num_nodes"):
        DeviceGraph(torch.zeros(5, dtype=torch.int64), torch.zeros(0, dtype=torch.int32), 5)


# --------------------------------------------------------------------------- 2. uniformity

def assert_binomial(counts, trials, p, sigmas=6.0, what="count"):
    """Each count is Binomial(trials, p) to within ``sigmas`` standard deviations (a false
    failure has probability below 1e-8 per count)."""
    sd = math.sqrt(trials * p * (1 - p))
    z = (counts.double() - trials * p).abs() / sd
    worst = int(z.argmax())
    assert float(z.max()) < sigmas, (f"{what} {worst}: {int(counts.reshape(-1)[worst])} of "
                                     f"{trials}, expected {trials * p:.1f} +- {sd:.1f}")


def test_each_neighbour_subset_is_equally_likely():
    """On a star of in-degree 20 with fan-out 5: every neighbour is kept with probability
    5/20 and every pair together with C(18, 3) / C(20, 5) (uniform subsets, not only
    uniform marginals). Many destinations share the same 20 neighbours, listed in the same
    random order (so that a bias by position in the CSR row shows), and are sampled several
    times with one generator."""
    degree, fanout, copies, draws = 20, 5, 10_000, 4
    targets = degree + torch.arange(copies)
    src = torch.randperm(degree).repeat(copies)
    g = dgl.graph((src, targets.repeat_interleave(degree)), num_nodes=degree + copies)
    graph = DeviceGraph.from_dgl(g, "cpu")
    gen = generator()
    chosen = []
    for _ in range(draws):
        block = sample_block(graph, targets, fanout, gen)
        assert torch.equal(block.plan.in_degrees, torch.full((copies,), fanout))
        chosen.append(block.src_nodes[block.plan.indices].reshape(copies, fanout))
    assert not torch.equal(chosen[0], chosen[1])  # the generator moves on between calls
    chosen = torch.cat(chosen)
    trials = chosen.shape[0]
    member = torch.zeros(trials, degree, dtype=torch.bool).scatter_(1, chosen, True)
    assert torch.equal(member.sum(1), torch.full((trials,), fanout))  # distinct neighbours
    assert_binomial(member.sum(0), trials, fanout / degree, what="neighbour")
    together = member.T.double() @ member.double()
    pairs = together[~torch.eye(degree, dtype=torch.bool)]
    p_pair = math.comb(degree - 2, fanout - 2) / math.comb(degree, fanout)
    assert_binomial(pairs, trials, p_pair, what="pair")


# --------------------------------------------------------------------------- 3. layers

IN_FEATS = 12


def sampled_pair(fanout):
    """A SampledBlock (hub, zero-in-degree destinations) and the same block from to_dgl()."""
    g, seeds = mixed_graph()
    block = sample_block(DeviceGraph.from_dgl(g, "cpu"), seeds, fanout, generator())
    assert bool((block.plan.in_degrees == 0).any()) and block.num_edges() > 0
    return block, block.to_dgl()


def outputs_and_grads(layer, graph, x, edge_weight, upstream):
    """(output, {name: gradient}) of ``(layer(graph, x) * upstream).sum()`` with respect to
    the input, the edge weights and every parameter of ``layer``."""
    x = x.detach().clone().requires_grad_()
    inputs = {"input": x}
    if edge_weight is not None:
        inputs["edge_weight"] = edge_weight = edge_weight.detach().clone().requires_grad_()
    out = layer(graph, x, edge_weight=edge_weight)
    inputs.update(layer.named_parameters())
    grads = torch.autograd.grad((out * upstream).sum(), list(inputs.values()),
                                allow_unused=True)
    return out.detach(), dict(zip(inputs, grads))


def assert_same_layer(layer_a, graph_a, layer_b, graph_b, num_src, num_dst, num_edges,
                      weighted, device="cpu", dtype=torch.float64, tol=1e-12):
    x = torch.randn(num_src, IN_FEATS, dtype=dtype, device=device)
    w = (torch.rand(num_edges, dtype=dtype, device=device) + 0.25) if weighted else None
    probe = layer_a(graph_a, x, edge_weight=w)
    upstream = torch.randn_like(probe)
    out_a, grads_a = outputs_and_grads(layer_a, graph_a, x, w, upstream)
    out_b, grads_b = outputs_and_grads(layer_b, graph_b, x, w, upstream)
    assert out_a.shape[0] == num_dst
    torch.testing.assert_close(out_a, out_b, rtol=tol, atol=tol)
    assert grads_a.keys() == grads_b.keys()
    assert float(grads_a["input"].abs().sum()) > 0  # a comparison of something
    for name in grads_a:
        if grads_a[name] is None or grads_b[name] is None:
            assert grads_a[name] is None and grads_b[name] is None, name
            continue
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=tol, atol=tol,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


LAYERS = {
    "sage_mean": lambda k, out: SAGEConv(IN_FEATS, out, "mean", k=k),
    "sage_gcn": lambda k, out: SAGEConv(IN_FEATS, out, "gcn", k=k),
    "gin_sum": lambda k, out: GINConv(torch.nn.Linear(IN_FEATS, out), "sum", init_eps=0.3,
                                      learn_eps=True, k=k),
    "gin_mean": lambda k, out: GINConv(torch.nn.Linear(IN_FEATS, out), "mean", init_eps=0.3,
                                       learn_eps=True, k=k),
    **{f"graphconv_{norm}": (lambda k, out, norm=norm: GraphConv(
        IN_FEATS, out, norm=norm, allow_zero_in_degree=True, k=k))
       for norm in ("both", "right", "none", "left")},
}


@pytest.mark.parametrize("fanout", [3, -1])
@pytest.mark.parametrize("out_feats", [5, 20])  # 5: DGL's project-first order when dense
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "edge_weight"])
@pytest.mark.parametrize("k", [4, None], ids=["k4", "dense"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_on_a_sampled_block_match_its_dgl_block(layer, k, weighted, out_feats, fanout):
    block, as_dgl = sampled_pair(fanout)
    conv = LAYERS[layer](k, out_feats).double()
    with torch.no_grad():  # a bias and eps that matter
        for p in conv.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert_same_layer(conv, block, conv, as_dgl, block.num_src_nodes(), block.num_dst_nodes(),
                      block.num_edges(), weighted)


@pytest.mark.parametrize("out_feats", [5, 20])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "edge_weight"])
@pytest.mark.parametrize("aggregator", ["mean", "gcn"])
def test_stock_dgl_sageconv_on_to_dgl_equals_dgl_maxk_on_the_sampled_block(aggregator,
                                                                          weighted, out_feats):
    assert stock_sageconv.SAGEConv is not SAGEConv
    block, as_dgl = sampled_pair(4)
    ours = SAGEConv(IN_FEATS, out_feats, aggregator, k=None).double()
    stock = stock_sageconv.SAGEConv(IN_FEATS, out_feats, aggregator).double()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    stock.load_state_dict(ours.state_dict())
    assert_same_layer(ours, block, stock, as_dgl, block.num_src_nodes(), block.num_dst_nodes(),
                      block.num_edges(), weighted, tol=1e-10)


@pytest.mark.parametrize("make", [lambda: SAGEConv(IN_FEATS, 6, "pool", k=None),
                                  lambda: SAGEConv(IN_FEATS, 6, "lstm", k=None),
                                  lambda: GINConv(torch.nn.Linear(IN_FEATS, 6), "max", k=None)],
                         ids=["sage_pool", "sage_lstm", "gin_max"])
def test_dgl_code_aggregators_refuse_a_sampled_block_naming_to_dgl(make):
    block, as_dgl = sampled_pair(3)
    conv = make()
    x = torch.randn(block.num_src_nodes(), IN_FEATS)
    with pytest.raises(DGLError, match=r"to_dgl\(\)"):
        conv(block, x)
    assert conv(as_dgl, x).shape == (block.num_dst_nodes(), 6)  # fine on the DGL block


def test_graphconv_zero_in_degree_error_is_the_same_on_both():
    block, as_dgl = sampled_pair(3)
    conv = GraphConv(IN_FEATS, 4, k=None)
    x = torch.randn(block.num_src_nodes(), IN_FEATS)
    messages = []
    for graph in (block, as_dgl):
        with pytest.raises(DGLError, match="0-in-degree") as err:
            conv(graph, x)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


# --------------------------------------------------------------------------- 4. plans

def random_csr(num_dst, num_src, max_degree):
    """(indptr, indices) of a random CSR whose rows have 0 to ``max_degree`` entries."""
    degrees = torch.randint(0, max_degree + 1, (num_dst,))
    degrees[torch.randperm(num_dst)[:2]] = torch.tensor([0, max_degree])  # both extremes
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    indices = torch.randint(num_src, (int(indptr[-1]),))
    return indptr, indices


def expand_groups(groups):
    """[(row, first entry, end entry, several groups in the row)] of ``edge_groups``."""
    group_row, group_start, _, _ = (t.cpu() if torch.is_tensor(t) else t for t in groups)
    row = group_row.long()
    several = row < 0
    row = row & 0x7FFFFFFF
    start = group_start.tolist()
    return [(int(r), start[i], start[i + 1], bool(s))
            for i, (r, s) in enumerate(zip(row.tolist(), several.tolist()))]


def check_groups(groups, indptr, group_size):
    """Each row r is cut into max(1, ceil(deg / g)) groups of at most g consecutive entries
    that tile [indptr[r], indptr[r + 1]), in row order; bit 31 marks rows of several, and
    the fourth element lists exactly those rows, ascending."""
    expanded = expand_groups(groups)
    indptr = indptr.cpu().tolist()
    by_row = collections.defaultdict(list)
    for r, a, b, several in expanded:
        by_row[r].append((a, b, several))
    assert [r for r, *_ in expanded] == sorted(r for r, *_ in expanded)
    assert sorted(by_row) == list(range(len(indptr) - 1))
    for r, parts in by_row.items():
        lo, hi = indptr[r], indptr[r + 1]
        assert len(parts) == max(1, -(-(hi - lo) // group_size)), (r, parts)
        assert parts[0][0] == lo and parts[-1][1] == hi
        assert all(a < b <= a + group_size for a, b, _ in parts) or hi == lo
        assert all(parts[i][1] == parts[i + 1][0] for i in range(len(parts) - 1))
        assert all(several == (len(parts) > 1) for _, _, several in parts)
    several = [r for r, parts in sorted(by_row.items()) if len(parts) > 1]
    assert groups[3].dtype == torch.int64 and groups[3].cpu().tolist() == several


@pytest.mark.parametrize("slack", [0, 3, 250])
def test_bounded_plan_edge_groups_are_the_unbounded_plans(slack):
    """max_in_degree <= group size: the groups are the rows (no host read), and they are the
    groups the general path computes for the same CSR."""
    max_degree = int(torch.randint(1, 40, ()))
    group_size = max_degree + slack
    num_dst, num_src = 50, 70
    indptr, indices = random_csr(num_dst, num_src, max_degree)
    bounded = GraphPlan(indptr, indices, None, num_src, num_dst, max_in_degree=max_degree)
    general = GraphPlan(indptr, indices, None, num_src, num_dst)
    fast, slow = bounded.edge_groups(group_size), general.edge_groups(group_size)
    assert expand_groups(fast) == expand_groups(slow)
    assert torch.equal(fast[2], slow[2]) and torch.equal(fast[2].long(), indices)
    assert fast[3].numel() == 0 and slow[3].numel() == 0
    check_groups(fast, indptr, group_size)
    assert bounded.edge_groups(group_size) is fast  # built once


@pytest.mark.parametrize("bound", [None, "max_degree"])
def test_edge_groups_split_long_rows(bound):
    """Group size below the largest in-degree (with or without a bound above it): rows are
    split into groups of at most the group size, flagged as such."""
    max_degree = int(torch.randint(10, 60, ()))
    group_size = int(torch.randint(2, max_degree, ()))
    indptr, indices = random_csr(40, 55, max_degree)
    plan = GraphPlan(indptr, indices, None, 55, 40,
                     max_in_degree=max_degree if bound else None)
    groups = plan.edge_groups(group_size)
    check_groups(groups, indptr, group_size)
    assert groups[3].numel() > 0


@pytest.mark.parametrize("fanout", [4, 9, -1])
def test_sampled_block_groups_equal_its_dgl_blocks_groups(fanout):
    g, seeds = mixed_graph(80)
    block = sample_block(DeviceGraph.from_dgl(g, "cpu"), seeds, fanout, generator())
    dgl_plan = graph_plan(block.to_dgl(), "cpu")
    assert graph_plan(block, "cpu") is block.plan
    for group_size in (4, 9, 256):
        ours = block.plan.edge_groups(group_size)
        theirs = dgl_plan.edge_groups(group_size)
        assert expand_groups(ours) == expand_groups(theirs)
        assert torch.equal(ours[3], theirs[3])
        check_groups(ours, block.plan.indptr, group_size)


@needs_cuda
def test_plan_on_the_wrong_device_is_refused():
    g, seeds = mixed_graph()
    on_gpu = sample_block(DeviceGraph.from_dgl(g, "cuda"), seeds.cuda(), 3, generator("cuda"))
    on_cpu = sample_block(DeviceGraph.from_dgl(g, "cpu"), seeds, 3, generator())
    with pytest.raises(DGLError, match="sampled block is on cuda"):
        graph_plan(on_gpu, "cpu")
    with pytest.raises(DGLError, match="sampled block is on cpu"):
        graph_plan(on_cpu, "cuda")
    conv = SAGEConv(IN_FEATS, 4, "mean", k=4)
    with pytest.raises(DGLError, match="features are on cpu"):
        conv(on_gpu, torch.randn(on_gpu.num_src_nodes(), IN_FEATS))
    with pytest.raises(DGLError, match="features are on cuda"):
        conv.cuda()(on_cpu, torch.randn(on_cpu.num_src_nodes(), IN_FEATS, device="cuda"))


# --------------------------------------------------------------------------- 5. the loader

def make_loader(num_nodes=120, num_seeds=None, fanouts=(3, 2), batch_size=16, **kwargs):
    g = dgl.rand_graph(num_nodes, 6 * num_nodes)
    seeds = torch.randperm(num_nodes)[:num_seeds or num_nodes]
    return NeighborLoader(DeviceGraph.from_dgl(g, "cpu"), seeds, NeighborSampler(list(fanouts)),
                          batch_size, **kwargs), g, seeds


@pytest.mark.parametrize("num_seeds, batch_size", [(100, 16), (96, 16), (7, 50), (1, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_number_of_batches_is_len(num_seeds, batch_size, drop_last):
    loader, g, seeds = make_loader(num_seeds=num_seeds, batch_size=batch_size,
                                   drop_last=drop_last, prefetch=0)
    batches = list(loader)
    assert len(batches) == len(loader) == (num_seeds // batch_size if drop_last
                                           else -(-num_seeds // batch_size))
    sizes = [len(out) for _, out, _ in batches]
    assert all(s == batch_size for s in sizes[:-1]) and all(0 < s <= batch_size for s in sizes)
    outputs = torch.cat([out for _, out, _ in batches]) if batches else EMPTY
    assert outputs.unique().numel() == outputs.numel()
    assert set(outputs.tolist()) <= set(seeds.tolist())
    if not drop_last:
        assert sorted(outputs.tolist()) == sorted(seeds.tolist())


@pytest.mark.parametrize("num_seeds, world_size", [(100, 3), (97, 4), (3, 5), (64, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_run_the_same_steps_and_cover_every_seed(num_seeds, world_size, drop_last):
    g = dgl.rand_graph(150, 900)
    graph = DeviceGraph.from_dgl(g, "cpu")
    seeds = torch.randperm(150)[:num_seeds]
    seed = int(torch.randint(1000, ()))
    per_rank, steps, covered = -(-num_seeds // world_size), set(), set()
    for rank in range(world_size):
        loader = NeighborLoader(graph, seeds, NeighborSampler([2, 2]), 8, seed=seed,
                                rank=rank, world_size=world_size, drop_last=drop_last,
                                prefetch=1)
        batches = list(loader)
        steps.add((len(loader), len(batches)))
        outputs = torch.cat([out for _, out, _ in batches]) if batches else EMPTY
        assert outputs.unique().numel() == outputs.numel()  # no seed twice within a rank
        assert outputs.numel() == (per_rank // 8 * 8 if drop_last else per_rank)
        covered |= set(outputs.tolist())
    assert len(steps) == 1, steps  # every rank the same number of steps
    assert covered <= set(seeds.tolist())
    if not drop_last:
        assert covered == set(seeds.tolist())


def pass_order(loader):
    return torch.cat([out for _, out, _ in loader])


def test_shuffle_depends_on_seed_and_pass():
    g = dgl.rand_graph(200, 1200)
    graph = DeviceGraph.from_dgl(g, "cpu")
    seeds = torch.randperm(200)
    seed = int(torch.randint(1000, ()))

    def loader(s, **kwargs):
        return NeighborLoader(graph, seeds, NeighborSampler([2]), 32, seed=s, prefetch=0,
                              **kwargs)
    a = loader(seed)
    first, second = pass_order(a), pass_order(a)
    assert sorted(first.tolist()) == sorted(second.tolist()) == sorted(seeds.tolist())
    assert not torch.equal(first, second)  # a new order each pass
    b = loader(seed)
    assert torch.equal(pass_order(b), first) and torch.equal(pass_order(b), second)
    assert not torch.equal(pass_order(loader(seed + 1)), first)
    assert not torch.equal(first, seeds)
    unshuffled = loader(seed, shuffle=False)
    assert torch.equal(pass_order(unshuffled), seeds) and torch.equal(pass_order(unshuffled),
                                                                      seeds)


def test_batch_seeds_differ_across_passes_ranks_and_batches():
    """Each batch's random stream is seeded from (pass, rank, batch); a linear mix gave rank
    r's batch i + 1,000,003 the seed of rank r + 1's batch i."""
    from dgl_maxk.sampling.loader import _mixed_seed
    pass_seed = int(torch.randint(0, 2 ** 40, ()))
    grid = [_mixed_seed(pass_seed + p, r, i) for p in range(3) for r in range(4)
            for i in range(500)]
    assert len(set(grid)) == len(grid) and all(0 <= x < 2 ** 64 for x in grid)
    assert _mixed_seed(pass_seed, 0, 1_000_003) != _mixed_seed(pass_seed, 1, 0)
    assert _mixed_seed(pass_seed, 0, 5) == _mixed_seed(pass_seed, 0, 5)


def test_prefetch_defaults_to_the_callers_thread_but_for_host_rows_on_a_gpu():
    """No producer threads (the caller's thread samples, on a GPU a batch ahead), but two
    on a GPU whose features are in host memory (the CPU gathers them)."""
    g = dgl.rand_graph(50, 200)
    features = torch.randn(50, 4)
    loader = NeighborLoader(DeviceGraph.from_dgl(g, "cpu"), torch.arange(50),
                            NeighborSampler([2]), 8, features=features)
    assert loader.prefetch == 0 and len(list(loader)) == 7
    if torch.cuda.is_available():
        graph = DeviceGraph.from_dgl(g, "cuda")
        for rows, threads in ((None, 0), (features.cuda(), 0), (features, 2)):
            loader = NeighborLoader(graph, torch.arange(50), NeighborSampler([2]), 8,
                                    features=rows)
            assert loader.prefetch == threads and len(list(loader)) == 7


def test_prefetch_does_not_change_the_batches():
    g, seeds = mixed_graph(150)
    graph = DeviceGraph.from_dgl(g, "cpu")
    neighbours = in_neighbours(g)
    seed = int(torch.randint(1000, ()))
    passes = {}
    for prefetch in (0, 1, 3):
        loader = NeighborLoader(graph, torch.arange(150), NeighborSampler([4, 3]), 20,
                                seed=seed, prefetch=prefetch)
        passes[prefetch] = [list(loader), list(loader)]
    for p in (1, 3):
        for got, want in zip(passes[p], passes[0]):
            assert_same_batches(got, want)
    assert batches_differ(passes[0][0], passes[0][1])
    for input_nodes, output_nodes, blocks in passes[3][0]:
        check_sample((input_nodes, output_nodes, blocks), neighbours, output_nodes, [4, 3])


def tensors_reachable(batch):
    """Every tensor a batch holds, found by walking its objects' attributes."""
    found, stack, seen = [], [batch], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif hasattr(x, "__dict__"):
            stack.extend(vars(x).values())
    return found


def test_the_consumer_keeps_every_tensor_of_a_fresh_batch_alive():
    """On GPUs ``_prefetched`` marks each tensor of a batch used on the step's stream; one it
    missed (made on the sampler's stream) could be reused by the sampler while the step
    still reads it."""
    g, seeds = mixed_graph(150)
    graph = DeviceGraph.from_dgl(g, "cpu")
    assert graph.edge_ids is not None
    batch = next(iter(NeighborLoader(graph, seeds, NeighborSampler([4, 3]), 20, prefetch=0)))
    marked = {id(t) for t in loader_module._tensors(batch)}
    missed = [tuple(t.shape) for t in tensors_reachable(batch) if id(t) not in marked]
    assert not missed


def test_each_pass_samples_the_same_whenever_it_is_started():
    """A pass's batches depend only on the seed, the rank and the pass number (the
    docstring's "not on prefetch or timing"): starting a second pass before consuming the
    first must not change the first."""
    g, _ = mixed_graph(150)
    graph = DeviceGraph.from_dgl(g, "cpu")
    seed = int(torch.randint(1000, ()))

    def loader():
        return NeighborLoader(graph, torch.arange(150), NeighborSampler([3]), 40, seed=seed,
                              prefetch=0)
    sequential = loader()
    first, second = list(sequential), list(sequential)
    interleaved = loader()
    it_first, it_second = iter(interleaved), iter(interleaved)
    assert_same_batches(list(it_first), first)
    assert_same_batches(list(it_second), second)


@pytest.mark.parametrize("how", ["close", "del", "for_break"])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_breaking_out_early_stops_the_sampler_thread(how, prefetch):
    before = sampler_threads()
    loader, _, _ = make_loader(num_nodes=400, batch_size=4, prefetch=prefetch)
    if how == "for_break":
        for i, _batch in enumerate(loader):
            if i == 0:
                assert sampler_threads() - before, "no producer thread while iterating"
            if i == 2:
                break
    else:
        it = iter(loader)
        next(it)
        assert sampler_threads() - before, "no producer thread while iterating"
        if how == "close":
            it.close()
        else:
            del it
    gc.collect()
    assert not sampler_threads() - before


def test_a_finished_pass_leaves_no_thread():
    before = sampler_threads()
    loader, _, _ = make_loader(prefetch=2)
    assert len(list(loader)) == len(loader)
    gc.collect()
    assert not sampler_threads() - before


class FailingSampler(NeighborSampler):
    """A sampler that raises for the batch whose first seed is ``fail_seed`` (batches are
    sampled out of order by several producers)."""

    def __init__(self, fanouts, fail_seed):
        super().__init__(fanouts)
        self.fail_seed, self.error = fail_seed, None

    def sample(self, graph, seeds, generator=None):
        if int(seeds[0]) == self.fail_seed:
            self.error = RuntimeError(f"sampling failed at seed {self.fail_seed}")
            raise self.error
        return super().sample(graph, seeds, generator)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_sampling_errors_reach_the_consumer(prefetch):
    """The batches before the failing one come, then its error, whichever thread raised."""
    before = sampler_threads()
    g = dgl.rand_graph(100, 500)
    sampler = FailingSampler([2], fail_seed=20)
    loader = NeighborLoader(DeviceGraph.from_dgl(g, "cpu"), torch.arange(100), sampler, 10,
                            shuffle=False, prefetch=prefetch)
    got = []
    with pytest.raises(RuntimeError, match="sampling failed at seed 20") as err:
        for batch in loader:
            got.append(batch)
    assert err.value is sampler.error
    assert len(got) == 2
    gc.collect()
    assert not sampler_threads() - before


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("hook", ["sample", "start"])
def test_the_loader_runs_a_subclass_s_own_sample_or_start(hook, prefetch):
    """A NeighborSampler subclass that overrides ``sample`` (DGL users' way) or ``start``
    has its own method run for every batch, never a captured replay."""
    calls = []

    class Counting(NeighborSampler):
        pass

    def counted(self, graph, seeds, generator=None):
        calls.append(seeds.numel())
        return getattr(NeighborSampler, hook)(self, graph, seeds, generator)
    setattr(Counting, hook, counted)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    graph = DeviceGraph.from_dgl(dgl.rand_graph(60, 300), device)
    loader = NeighborLoader(graph, torch.arange(60), Counting([3, 2]), 8, prefetch=prefetch)
    assert len(list(loader)) == 8 and sorted(calls) == [4] + [8] * 7
    assert not graph.captured_samplers


@pytest.mark.parametrize("seeds, kwargs, match", [
    ([1, 2, 2], {}, "must not repeat: 1 repeated"),
    ([1.0, 2.5], {}, "integer node ids"),
    ([[1, 2], [3, 4]], {}, "1-d"),
    ([0, 5, 100], {}, r"in \[0, 100\)"),
    ([-1, 3], {}, r"in \[0, 100\)"),
    ([1, 2, 3], {"batch_size": 0}, "batch_size >= 1"),
    ([1, 2, 3], {"prefetch": -1}, "prefetch >= 0"),
    ([1, 2, 3], {"rank": 2, "world_size": 2}, "rank < world_size"),
    ([1, 2, 3], {"rank": -1, "world_size": 2}, "rank < world_size"),
], ids=["repeated", "float", "2d", "too_large", "negative", "batch_size_0", "prefetch", "rank_high",
        "rank_negative"])
def test_bad_loader_arguments_are_refused(seeds, kwargs, match):
    graph = DeviceGraph.from_dgl(dgl.rand_graph(100, 300), "cpu")
    kwargs = {"batch_size": 4, **kwargs}
    batch_size = kwargs.pop("batch_size")
    with pytest.raises(ValueError, match=match):
        NeighborLoader(graph, torch.tensor(seeds), NeighborSampler([2]), batch_size, **kwargs)


def test_loader_and_sampler_arguments_of_the_wrong_type_say_what_they_take():
    g = dgl.rand_graph(100, 300)
    graph, seeds = DeviceGraph.from_dgl(g, "cpu"), torch.arange(10)
    with pytest.raises(TypeError, match=r"takes a DeviceGraph, got DGLGraph: make one with "
                                        r"dgl_maxk.sampling.DeviceGraph.of\(g, device\)"):
        NeighborSampler([2]).sample(g, seeds)
    with pytest.raises(TypeError, match="takes a DeviceGraph, got DGLGraph"):
        NeighborLoader(g, seeds, NeighborSampler([2]), 4)
    with pytest.raises(TypeError, match="sampler must be a dgl_maxk.sampling.NeighborSampler, "
                                        "got list"):
        NeighborLoader(graph, seeds, [2], 4)
    with pytest.raises(TypeError, match=r"batch_size=2.5: must be an integer"):
        NeighborLoader(graph, seeds, NeighborSampler([2]), 2.5)
    with pytest.raises(TypeError, match=r"prefetch=1.5, rank=1.0: must be integers"):
        NeighborLoader(graph, seeds, NeighborSampler([2]), 2, prefetch=1.5, rank=1.0,
                       world_size=2)


def test_a_fanout_above_every_in_degree_draws_nothing_and_takes_all_in_edges():
    """Its draws would cost memory in proportion to the fan-out (10^7: gigabytes)."""
    graph = DeviceGraph.from_dgl(dgl.rand_graph(300, 1500), "cpu")
    seeds = torch.randperm(300)[:40]
    gen = torch.Generator().manual_seed(1)
    before = gen.get_state()
    _, _, (huge,) = NeighborSampler([10**7]).sample(graph, seeds, gen)
    assert torch.equal(gen.get_state(), before)
    _, _, (every,) = NeighborSampler([-1]).sample(graph, seeds, gen)
    assert torch.equal(huge.edge_ids, every.edge_ids)
    assert torch.equal(huge.plan.indptr, every.plan.indptr)
    assert huge.plan.max_in_degree == 10**7
    NeighborSampler([graph.max_in_degree]).sample(graph, seeds, gen)
    assert not torch.equal(gen.get_state(), before)  # at the largest in-degree: drawn for


def test_a_sampled_block_in_a_dgl_training_loop():
    """``[b.to(device) for b in blocks]`` keeps working; what the block lacks of DGL's API
    says to call to_dgl() (also from inside a stock DGL layer)."""
    _, _, (block,) = NeighborSampler([3]).sample(
        DeviceGraph.from_dgl(dgl.rand_graph(50, 200), "cpu"), torch.arange(6))
    assert block.to("cpu") is block and block.to(torch.device("cpu")) is block
    assert block.to("cpu", non_blocking=True) is block
    with pytest.raises(ValueError, match=r"stays on the device it was sampled on \(cpu\)"):
        block.to("meta")
    assert not hasattr(block, "srcdata")
    with pytest.raises(AttributeError, match=r"no attribute 'local_scope': .*block.to_dgl\(\)"):
        dgl.nn.SAGEConv(4, 2, "mean")(block, torch.randn(block.num_src_nodes(), 4))


@pytest.mark.parametrize("seeds, match", [
    ([1, 2, 2], "repeat"), (torch.tensor([0.0, 1.5]), "integer node ids"),
    ([0, 100], r"in \[0, 100\), got ids from 0 to 100"), ([-1, 3], r"from -1 to 3"),
    ([[1, 2]], "1-d")])
def test_sampling_bad_seeds_directly_is_a_clear_error(seeds, match):
    graph = DeviceGraph.from_dgl(dgl.rand_graph(100, 400), "cpu")
    with pytest.raises(ValueError, match=match):
        NeighborSampler([3]).sample(graph, seeds)
    assert NeighborSampler([3]).sample(graph, [])[1].dtype == torch.int64


# --------------------------------------------------------------------------- 6. training

@pytest.fixture(scope="module")
def planted():
    return D.load_dataset("planted", num_nodes=300, num_features=12)


def test_train_epoch_over_the_device_loader_reduces_the_loss():
    g = dgl.add_self_loop(dgl.rand_graph(200, 1000))
    x = torch.randn(200, 8)
    y = (x[:, 0] > 0).long()  # learnable from the features
    model = build_model("sage", 8, 16, 2, 2, k=4, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    step = SampledStep(model, opt, [5, 5], 50, 200)
    loader = sampling.device_loader(DeviceGraph.from_dgl(g, "cpu"), torch.arange(200), [5, 5],
                                    batch_size=50, seed=int(torch.randint(1000, ())),
                                    prefetch=1)
    assert isinstance(loader, NeighborLoader)
    first = sampling.train_epoch(step, loader, x, y, torch.device("cpu"),
                                 timed=True)
    for _ in range(15):
        last = sampling.train_epoch(step, loader, x, y, torch.device("cpu"))
    assert first["seeds"] == 200 and first["steps"] == 4 == last["steps"]
    assert first["sample_s"] > 0 and first["compute_s"] > 0
    assert last["loss"] < 0.7 * first["loss"], (first["loss"], last["loss"])


@pytest.mark.parametrize("max_steps", [None, 1])
def test_train_epoch_stops_the_sampler_thread_when_it_ends_or_fails(max_steps):
    """Also while the failed step's traceback (which holds the epoch's frame) is kept, as a
    notebook keeps the last one."""
    before = sampler_threads()
    loader, _, _ = make_loader(num_nodes=400, batch_size=4, prefetch=2)
    x, y = torch.randn(400, 4), torch.zeros(400, dtype=torch.long)

    def failing_step(blocks, x_batch, y_batch):
        assert sampler_threads() - before, "no producer thread while iterating"
        if max_steps is None:
            raise ValueError("NaN in the step")
        return torch.zeros(())
    try:
        sampling.train_epoch(failing_step, loader, x, y, torch.device("cpu"), max_steps)
        kept = None
    except ValueError as err:
        kept = err.__traceback__
    assert (kept is None) == (max_steps == 1)
    assert not sampler_threads() - before


def test_epoch_loader_builds_the_configured_sampler_seeded_by_run_and_epoch(planted):
    train_idx = planted.train_mask.nonzero().squeeze(1)
    graph = DeviceGraph.from_dgl(planted.graph, "cpu")
    cfg = small_config(**{"mode": "minibatch", "sampling.fanouts": [3, 3],
                          "sampling.batch_size": 32, "sampling.prefetch": 2})
    run_seed = int(torch.randint(1000, ()))

    def epoch(e, sampler="device"):
        section = {**cfg["sampling"], "sampler": sampler}
        return sampling.epoch_loader(planted.graph, train_idx, section, run_seed, e, graph)
    loader = epoch(3)
    assert isinstance(loader, NeighborLoader) and loader.prefetch == 2
    assert loader.batch_size == 32 and loader.sampler.fanouts == [3, 3]
    assert_same_batches(list(loader), list(epoch(3)))
    assert batches_differ(list(epoch(3)), list(epoch(4)))
    assert not isinstance(epoch(3, "dgl"), NeighborLoader)


def test_dgl_epoch_loader_depends_on_run_and_epoch_only(planted):
    """DGL's loader shuffles with NumPy's global generator: draws made elsewhere between two
    epochs (or a different history on another process) must not change an epoch's batches."""
    train_idx = planted.train_mask.nonzero().squeeze(1)
    section = {**small_config(**{"mode": "minibatch", "sampling.fanouts": [3, 3],
                                 "sampling.batch_size": 32})["sampling"], "sampler": "dgl"}
    run_seed = int(torch.randint(1000, ()))

    def batches(e):
        loader = sampling.epoch_loader(planted.graph, train_idx, section, run_seed, e)
        return [(i.clone(), o.clone(), [b.edges() for b in blocks]) for i, o, blocks in loader]
    first = batches(2)
    np.random.rand(int(torch.randint(1, 50, ())))
    torch.rand(3)
    again = batches(2)
    assert len(first) == len(again)
    for (i, o, edges), (i2, o2, edges2) in zip(first, again):
        assert torch.equal(i, i2) and torch.equal(o, o2)
        assert all(torch.equal(a, b) for e, e2 in zip(edges, edges2) for a, b in zip(e, e2))
    assert not torch.equal(torch.cat([o for _, o, _ in batches(3)]),
                           torch.cat([o for _, o, _ in first]))


@pytest.mark.parametrize("sampler", ["device", "dgl"])
def test_runner_trains_on_the_configured_sampler(sampler, planted, tmp_path, monkeypatch):
    graphs = []

    def spy(model, blocks, *args, **kwargs):
        graphs.append(blocks)
        return step.train_step(model, blocks, *args, **kwargs)
    monkeypatch.setattr(sampled_step, "train_step", spy)  # what SampledStep runs off the GPU
    cfg = small_config(**{"train.epochs": 2, "mode": "minibatch", "sampling.fanouts": [4, 4],
                          "sampling.batch_size": 32, "sampling.sampler": sampler})
    res = T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False)
    assert [r["epoch"] for r in res["history"]] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in res["history"])
    assert len(graphs) == 2 * -(-int(planted.train_mask.sum()) // 32)
    kind = SampledBlock if sampler == "device" else dgl.DGLGraph
    assert all(len(b) == 2 and all(isinstance(x, kind) for x in b) for b in graphs)


@pytest.mark.parametrize("sampler", ["device", "dgl"])
def test_a_cuda_graph_that_cannot_apply_says_so(sampler, planted, tmp_path, caplog):
    """Asked for on the CPU (or with DGL's sampler), sampling.cuda_graph runs eagerly: the
    run says so rather than ignore the setting silently."""
    cfg = small_config(**{"train.epochs": 1, "mode": "minibatch", "sampling.fanouts": [4, 4],
                          "sampling.batch_size": 64, "sampling.sampler": sampler,
                          "sampling.cuda_graph": True})
    with caplog.at_level("WARNING"):
        T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False)
    assert "sampling.cuda_graph applies to the device sampler on a GPU" in caplog.text


@needs_cuda
def test_a_cuda_graph_with_a_full_fanout_says_it_runs_eagerly(planted, tmp_path, caplog):
    """A fan-out of -1 leaves nothing to pad to: sampling.cuda_graph: true runs eagerly on
    the GPU too, and the run says so."""
    cfg = small_config(**{"train.epochs": 1, "mode": "minibatch", "sampling.fanouts": [4, -1],
                          "sampling.batch_size": 64, "sampling.sampler": "device",
                          "sampling.cuda_graph": True})
    with caplog.at_level("WARNING"):
        T.run_seed(cfg, planted, 0, "cuda", tmp_path, progress=False)
    assert "with fan-outs above 0; this run's steps are eager" in caplog.text


def test_sampling_cuda_graph_auto_graphs_in_one_process_on_a_gpu():
    from dgl_maxk.training.sampled_step import resolve_cuda_graph
    on = dict(device="cuda", sampler="device", world=1, fanouts=[4, 4])
    assert resolve_cuda_graph("auto", **on)
    for change in ({"device": "cpu"}, {"sampler": "dgl"}, {"world": 2}, {"fanouts": [-1, 4]}):
        assert not resolve_cuda_graph("auto", **{**on, **change}), change
    for setting in (True, False):  # as set, where a graphed step applies
        assert resolve_cuda_graph(setting, **on) is setting
        assert resolve_cuda_graph(setting, **{**on, "world": 2}) is setting
        for change in ({"device": "cpu"}, {"sampler": "dgl"}, {"fanouts": [-1, 4]}):
            assert resolve_cuda_graph(setting, **{**on, **change}) is False, change


def test_sampling_cuda_graph_takes_auto_true_or_false():
    minibatch = {"mode": "minibatch", "sampling.fanouts": [4, 4]}
    assert small_config(**minibatch)["sampling"]["cuda_graph"] == "auto"
    for setting in ("auto", True, False):
        cfg = small_config(**minibatch, **{"sampling.cuda_graph": setting})
        assert cfg["sampling"]["cuda_graph"] == setting
    with pytest.raises(T.ConfigError, match=r"sampling.cuda_graph' must be one of "
                                            r"\['auto', true, false\], got 'sometimes'"):
        small_config(**minibatch, **{"sampling.cuda_graph": "sometimes"})


def test_the_run_log_says_how_mini_batch_steps_run():
    from dgl_maxk.training import runner
    maxk = small_config(**{"mode": "minibatch", "sampling.fanouts": [4, 4]})
    relu = small_config(**{"mode": "minibatch", "sampling.fanouts": [4, 4],
                           "model.nonlinearity": "relu"})
    line = runner._minibatch_steps_line({"maxk": maxk, "relu": relu}, torch.device("cuda"), 1)
    assert line.startswith("mini-batch steps (sampling.cuda_graph: auto): maxk graphed, "
                           "relu graphed (graphed: replayed from a CUDA graph")
    assert runner._minibatch_steps_line({"maxk": maxk}, torch.device("cuda"), 2) == (
        "mini-batch steps (sampling.cuda_graph: auto): maxk eager")
    every = small_config(**{"mode": "minibatch", "sampling.fanouts": [-1, 4]})
    assert runner._minibatch_steps_line({"maxk": every}, torch.device("cuda"), 1).endswith(
        "maxk eager")  # a fan-out of -1 bounds no block: nothing to pad to


def test_auto_says_nothing_where_it_does_not_apply(planted, tmp_path, caplog):
    cfg = small_config(**{"train.epochs": 1, "mode": "minibatch", "sampling.fanouts": [4, 4],
                          "sampling.batch_size": 64})
    with caplog.at_level("WARNING"):
        T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False)
    assert "cuda_graph" not in caplog.text


@needs_kernels
@pytest.mark.parametrize("nonlinearity", ["maxk", "relu"])
def test_the_trainer_graphs_minibatch_steps_by_default(nonlinearity, planted, tmp_path,
                                                       monkeypatch):
    """sampling.cuda_graph: auto on a GPU, one process: MaxK's and ReLU's mini-batch steps
    replay a CUDA graph."""
    from dgl_maxk.training import seed as seed_module
    made = []

    class Recorded(seed_module.SampledStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(seed_module, "SampledStep", Recorded)
    cfg = small_config(**{"train.epochs": 2, "mode": "minibatch", "sampling.fanouts": [4, 4],
                          "sampling.batch_size": 8, "model.nonlinearity": nonlinearity})
    res = T.run_seed(cfg, planted, 0, "cuda", tmp_path, progress=False)
    assert all(math.isfinite(r["loss"]) for r in res["history"])
    (step,) = made
    full_batches = 2 * (int(planted.train_mask.sum()) // 8)
    # every full batch runs over the padding: eagerly after each sizing of it (batches of
    # 8 vary: it may grow), then captured, then replayed
    assert step.padded_steps + step.captures + step.replays == full_batches
    assert step.captures >= 1 and step.replays >= 1


@pytest.mark.parametrize("sampler", ["device", "dgl"])
def test_cli_minibatch_run_finishes_with_either_sampler(sampler, tmp_path):
    out = tmp_path / "runs"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "dgl_maxk", "train", "--config",
                        "configs/quickstart_minibatch.yaml", "--device", "cpu", "--seeds", "1",
                        "--set", "train.epochs=2", "dataset.params.num_nodes=300",
                        f"sampling.sampler={sampler}", "sampling.prefetch=2", "--out", str(out),
                        "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["complete"] and res["config"]["sampling"]["sampler"] == sampler
    for variant in ("maxk", "relu"):
        (seed,) = res["variants"][variant]["seeds"]
        assert [h["epoch"] for h in seed["history"]] == [1, 2]
        assert 0.0 <= seed["test_at_best_val"] <= 1.0


def minibatch_config(**overrides):
    return small_config(**{"mode": "minibatch", "sampling.sampler": "device",
                           "sampling.fanouts": [4, 3], "sampling.batch_size": 24,
                           "train.schedule": "cosine", **overrides})


@pytest.mark.parametrize("prefetch", [0, 2])
def test_device_sampler_resume_gives_the_uninterrupted_result(prefetch, planted, tmp_path):
    cfg = minibatch_config(**{"sampling.prefetch": prefetch})
    straight = T.run_seed(cfg, planted, 0, "cpu", tmp_path / "a", progress=False)
    final_a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)

    torch.manual_seed(12345)  # the resumed run must not depend on the caller's RNG
    assert T.run_seed(cfg, planted, 0, "cpu", tmp_path / "b", progress=False,
                      budget=runner.Budget(epochs=3)) is None
    ckpt = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert ckpt["state"]["epoch"] == 3 and not ckpt["state"]["finished"]
    torch.manual_seed(999)
    resumed = T.run_seed(cfg, planted, 0, "cpu", tmp_path / "b", progress=False)
    final_b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)

    assert len(straight["history"]) == cfg["train"]["epochs"]
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]
    for key in ("best_epoch", "best_val", "test_at_best_val", "final"):
        assert resumed[key] == straight[key]
    for name, value in final_a["model"].items():
        assert torch.equal(value, final_b["model"][name]), name


def test_device_sampler_runs_do_not_depend_on_prefetch(planted, tmp_path):
    runs = [T.run_seed(minibatch_config(**{"sampling.prefetch": p, "train.epochs": 3}),
                       planted, 0, "cpu", tmp_path / str(p), progress=False) for p in (0, 3)]
    assert [r["loss"] for r in runs[0]["history"]] == [r["loss"] for r in runs[1]["history"]]
    assert runs[0]["final"] == runs[1]["final"]


@pytest.mark.parametrize("key, value", [("sampling.sampler", "cpu"),
                                        ("sampling.prefetch", -1)])
def test_bad_sampling_config_is_refused(key, value):
    with pytest.raises(T.ConfigError, match=key.replace(".", r"\.")):
        small_config(**{key: value})


# --------------------------------------------------------------------------- 7. GPU

@needs_cuda
def test_cuda_loader_prefetch_does_not_change_the_batches():
    g, _ = mixed_graph(300, hub_degree=290)
    graph = DeviceGraph.from_dgl(g, "cuda")
    seed = int(torch.randint(1000, ()))
    runs = []
    for prefetch in (0, 1, 3):
        loader = NeighborLoader(graph, torch.arange(300), NeighborSampler([5, 4]), 32,
                                seed=seed, prefetch=prefetch)
        runs.append(list(loader))
    torch.cuda.synchronize()
    assert_same_batches(runs[1], runs[0])
    assert_same_batches(runs[2], runs[0])


@needs_kernels
@pytest.mark.parametrize("fanout", [8, -1])  # -1: a hub of 300 > one edge group of 256
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "edge_weight"])
@pytest.mark.parametrize("k", [4, None], ids=["k4", "dense"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_on_a_cuda_sampled_block_match_its_dgl_block(layer, k, weighted, fanout):
    g, seeds = mixed_graph(400, hub_degree=300)
    block = sample_block(DeviceGraph.from_dgl(g, "cuda"), seeds.cuda(), fanout,
                         generator("cuda"))
    as_dgl = block.to_dgl()  # on the CPU: its plan is built on the GPU from its edges
    conv = LAYERS[layer](k, 16).cuda()
    with torch.no_grad():
        for p in conv.parameters():
            p.add_(0.1 * torch.randn_like(p))
    # full fp32 matmuls: TF32 rounding would magnify the kernels' atomic-order differences
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        assert_same_layer(conv, block, conv, as_dgl, block.num_src_nodes(),
                          block.num_dst_nodes(), block.num_edges(), weighted, device="cuda",
                          dtype=torch.float32, tol=2e-5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@needs_kernels
@pytest.mark.parametrize("fanouts", [[15, 10, 5], [3, 2, 2, 2]])
def test_a_batch_is_queued_without_a_host_sync_then_read_once(fanouts):
    """NeighborSampler.start queues every hop's kernels without waiting for the GPU (each
    hop takes its destination count from the hop before on the device); its result reads
    the sizes once, and is the batch sample() gives from the same generator seed."""
    g, _ = mixed_graph(400, hub_degree=300)
    graph = DeviceGraph.from_dgl(g, "cuda")
    seeds = torch.randperm(400, device="cuda")[:64]
    sampler = NeighborSampler(fanouts)
    seed = int(torch.randint(1000, ()))
    want = sampler.sample(graph, seeds, torch.Generator("cuda").manual_seed(seed))  # warm up
    torch.cuda.synchronize()
    generator = torch.Generator("cuda").manual_seed(seed)
    try:
        torch.cuda.set_sync_debug_mode("error")
        with dgl_maxk.input_checks(False):  # the seeds' check is a documented read
            pending = sampler.start(graph, seeds, generator)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    got = pending.result()
    assert_same_batches([got], [want])
    check_sample(got, in_neighbours(g), seeds.cpu(), fanouts)


@needs_kernels
@pytest.mark.parametrize("fanouts", [[6, 4, 3], [500, 2]])  # 500: above every in-degree
def test_a_captured_sampler_replays_the_eager_batches(fanouts):
    """Replays of a CapturedSampler give NeighborSampler.start's batches for the same
    generator seeds, one replay after another, and the batches already read stay as they
    were (copied out of the graph's tensors)."""
    g, _ = mixed_graph(400, hub_degree=300)
    graph = DeviceGraph.from_dgl(g, "cuda")
    sampler = NeighborSampler(fanouts)
    with sampler_module.captured_sampler(graph, fanouts, 48) as take:
        captured = take()
        assert isinstance(captured, sampler_module.CapturedSampler) and take() is captured
        got, want, seeds = [], [], []
        for _ in range(4):
            seeds.append(torch.randperm(400, device="cuda")[:48])
            seed = int(torch.randint(2 ** 62, ()))
            want.append(sampler.start(graph, seeds[-1],
                                      torch.Generator("cuda").manual_seed(seed)).result())
            got.append(captured.start(seeds[-1],
                                      torch.Generator("cuda").manual_seed(seed)).result())
    assert_same_batches(got, want)
    neighbours = in_neighbours(g)
    for batch, batch_seeds in zip(got, seeds):
        check_sample(batch, neighbours, batch_seeds.cpu(), fanouts)
    assert graph.captured_samplers[(tuple(fanouts), 48)] == [captured]  # kept for later
    # fan-outs the kernels take to the reference (which reads), or all in-edges: eager
    replay_plan = sampler_module.CapturedSampler.replay_plan
    assert replay_plan(graph, [100], 48) is None
    assert replay_plan(graph, [-1, 4], 48) is None
    assert replay_plan(graph, [4], 401) is None  # past the nodes
    with pytest.raises(ValueError, match="takes 48 seeds"):
        captured.start(seeds[0][:1])


@needs_kernels
def test_a_captured_sampler_taken_up_on_another_stream_waits_for_its_last_replay():
    """A pass broken off leaves a replay queued on its stream; the next pass, on another
    stream, takes the same sampler: its replay and copy wait for that one (here held
    back on the GPU), so its batch is still its own."""
    g, _ = mixed_graph(400, hub_degree=300)
    graph = DeviceGraph.from_dgl(g, "cuda")
    sampler = NeighborSampler([6, 4])
    captured = sampler_module.CapturedSampler(
        graph, [6, 4], sampler_module.CapturedSampler.replay_plan(graph, [6, 4], 48))
    first, second = (torch.randperm(400, device="cuda")[:48] for _ in range(2))
    want = sampler.start(graph, second, torch.Generator("cuda").manual_seed(7)).result()
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(200_000_000)  # about 0.1 s: the abandoned replay runs late
        captured.start(first, torch.Generator("cuda").manual_seed(3))
    with torch.cuda.stream(torch.cuda.Stream()):
        got = captured.start(second, torch.Generator("cuda").manual_seed(7)).result()
    assert_same_batches([got], [want])


@needs_kernels
@pytest.mark.parametrize("batch_size", [100, 128])
def test_batches_of_every_node_or_more_sample_on_a_gpu(batch_size):
    """Batches of as many seeds as the graph has nodes (room past the nodes: the next
    hop's rows are cut to them), and a batch size above it (no capture; one batch)."""
    g, _ = mixed_graph(100)
    graph = DeviceGraph.from_dgl(g, "cuda")
    loader = NeighborLoader(graph, torch.arange(100), NeighborSampler([5, 5]), batch_size,
                            prefetch=0)
    batches = list(loader)
    torch.cuda.synchronize()
    assert len(batches) == 1
    check_sample(batches[0], in_neighbours(g), batches[0][1].cpu(), [5, 5])


def test_no_captured_sampler_on_a_cpu():
    graph = DeviceGraph.from_dgl(dgl.rand_graph(50, 200), "cpu")
    with sampler_module.captured_sampler(graph, [3, 2], 8) as take:
        assert take() is None


@needs_kernels
def test_passes_at_the_same_time_on_a_gpu_sample_as_one_after_another():
    """Two passes of one loader interleaved each replay a captured sampler of their own."""
    g, _ = mixed_graph(300, hub_degree=290)
    graph = DeviceGraph.from_dgl(g, "cuda")
    loader = NeighborLoader(graph, torch.arange(300), NeighborSampler([5, 4]), 32,
                            seed=int(torch.randint(1000, ())), prefetch=0)
    first, second = list(loader), list(loader)
    loader.passes = 0
    it_first, it_second = iter(loader), iter(loader)
    both = list(zip(it_first, it_second))
    assert next(it_second, None) is None  # zip leaves the second pass before its end
    assert_same_batches([a for a, _ in both], first)
    assert_same_batches([b for _, b in both], second)
    assert len(graph.captured_samplers[((5, 4), 32)]) == 2


@needs_kernels
def test_hops_past_the_room_limit_count_their_rows_first(monkeypatch):
    """A hop whose room would pass ROOM_WITHOUT_READ reads its destination count and is
    sized exactly: still a valid chain of blocks."""
    monkeypatch.setattr(sampler_module, "ROOM_WITHOUT_READ", 0)
    g, _ = mixed_graph(400, hub_degree=300)
    seeds = torch.randperm(400, device="cuda")[:64]
    result = NeighborSampler([4, 3, 2]).sample(DeviceGraph.from_dgl(g, "cuda"), seeds,
                                               generator("cuda"))
    check_sample(result, in_neighbours(g), seeds.cpu(), [4, 3, 2])


@needs_kernels
def test_sampled_block_plan_and_layer_need_no_host_sync():
    device = torch.device("cuda")
    g, seeds = mixed_graph(400, hub_degree=300)
    sampled = sample_block(DeviceGraph.from_dgl(g, device), seeds.to(device), 8,
                           generator("cuda"))
    plan = sampled.plan
    indptr, indices = plan.indptr.clone(), plan.indices.clone()
    src_nodes = sampled.src_nodes.clone()
    num_dst = sampled.num_dst_nodes()
    conv = SAGEConv(32, 16, "mean", k=8).to(device)
    x = torch.randn(src_nodes.numel(), 32, device=device, requires_grad=True)
    upstream = torch.randn(num_dst, 16, device=device)
    group_size = cuda_backend.launch.group_size()
    # warm up: compile and load the kernels outside the checked region
    warm = SampledBlock(indptr, indices, src_nodes, num_dst, max_in_degree=8)
    expected = conv(warm, x)
    expected.backward(upstream)
    expected_grad = x.grad.clone()
    x.grad = None
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        with dgl_maxk.input_checks(False):  # the NaN scan is a documented sync
            block = SampledBlock(indptr, indices, src_nodes, num_dst, max_in_degree=8)
            groups = block.plan.edge_groups(group_size)
            out = conv(block, x)
            out.backward(upstream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert groups[3].numel() == 0 and torch.equal(groups[1], indptr)
    torch.testing.assert_close(out, expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, expected_grad, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- review findings

@pytest.mark.parametrize("run_seed", [42424, 20240101, 2 ** 32 - 1])
@pytest.mark.parametrize("sampler, prefetch", [("device", 0), ("device", 1), ("dgl", None)])
def test_large_run_seeds_sample(run_seed, sampler, prefetch, planted):
    """Any seed the config accepts (seed_everything takes up to 2^32 - 1) must sample: the
    loader's derived seeds (run seed x 100003^2 x 1009) must stay in a generator's range,
    and dgl.seed takes only int32 (run seed x 100003 + epoch)."""
    train_idx = planted.train_mask.nonzero().squeeze(1)
    graph = DeviceGraph.from_dgl(planted.graph, "cpu")
    section = {"fanouts": [3, 3], "batch_size": 32, "sampler": sampler, "prefetch": prefetch}
    loader = sampling.epoch_loader(planted.graph, train_idx, section, run_seed, 1, graph)
    assert len(list(loader)) == len(loader)


def test_resume_with_another_prefetch(planted, tmp_path):
    """sampling.prefetch does not change a run's result (the loader's docstring), so a run
    stopped with one prefetch must resume with another (e.g. stopped on a GPU, where the
    user set prefetch: 2, resumed with the default)."""
    cfg = minibatch_config(**{"sampling.prefetch": 0})
    assert T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False,
                      budget=runner.Budget(epochs=2)) is None
    resumed = T.run_seed(minibatch_config(**{"sampling.prefetch": 2}), planted, 0, "cpu",
                         tmp_path, progress=False)
    assert len(resumed["history"]) == cfg["train"]["epochs"]


def test_resume_a_minibatch_checkpoint_from_before_the_sampler_key(planted, tmp_path):
    """A minibatch checkpoint written before sampling.sampler/prefetch existed sampled with
    DGL's sampler: it must resume under sampling.sampler=dgl."""
    cfg = minibatch_config(**{"sampling.sampler": "dgl"})
    assert T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False,
                      budget=runner.Budget(epochs=2)) is None
    path = tmp_path / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=False)
    for key in ("sampler", "prefetch"):  # the checkpoint as the previous version wrote it
        ckpt["config"]["sampling"].pop(key, None)
    torch.save(ckpt, path)
    resumed = T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False)
    assert len(resumed["history"]) == cfg["train"]["epochs"]


_CLOSED_ON_PRODUCER = r"""
import queue, sys, threading, time, types, torch
from dgl_maxk._dgl import dgl  # DGL through the package's compatibility fix, as users import it
from dgl_maxk.sampling import DeviceGraph, NeighborLoader, NeighborSampler
from dgl_maxk.sampling import loader as loader_module

prefetch, where = int(sys.argv[1]), sys.argv[2]
# closes the consumer's iterator from a producer thread, as a garbage collection run in that
# thread does when the iterator is only reachable through a reference cycle (an exception
# raised in the loop body and kept, e.g. ``except ... as err: errors.append(err)``): while
# sampling, or inside a queue's put, which holds that queue's lock. The iterator is garbage
# there, so not running: the producers' batches after their first wait until the consumer
# is out of next(), and the first of them closes it.
state = {"iterator": None, "calls": 0, "closed": False, "lock": threading.Lock(),
         "idle": threading.Event()}

def close_once():
    with state["lock"]:
        closing, state["closed"] = not state["closed"], True
    if closing:
        state["iterator"].close()

class ClosingSampler(NeighborSampler):
    def sample(self, graph, seeds, generator=None):
        with state["lock"]:
            state["calls"] += 1
            first = state["calls"] <= prefetch  # each thread's first batch
        if not first:
            state["idle"].wait(10)
            if where == "sample":
                close_once()
        return super().sample(graph, seeds, generator)

class ClosingQueue(queue.Queue):
    def _put(self, item):
        super()._put(item)
        if where == "put" and state["idle"].is_set():
            close_once()

loader_module.queue = types.SimpleNamespace(Queue=ClosingQueue, Empty=queue.Empty,
                                            Full=queue.Full)
loader = NeighborLoader(DeviceGraph.from_dgl(dgl.rand_graph(100, 400), "cpu"),
                        torch.arange(100), ClosingSampler([2]), 4, prefetch=prefetch)
state["iterator"] = iter(loader)
next(state["iterator"])
state["idle"].set()
deadline = time.monotonic() + 10
while time.monotonic() < deadline and any(
        t.name == "dgl_maxk-sampler" for t in threading.enumerate()):
    time.sleep(0.05)
print("closed", state["closed"])
print("alive", any(t.name == "dgl_maxk-sampler" for t in threading.enumerate()))
"""


@pytest.mark.parametrize("where", ["sample", "put"])
@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_iterator_finalized_on_a_producer_thread_lets_them_end(prefetch, where):
    """The loader's cleanup (stop, drain, join) may run on a producer thread itself when
    the cyclic garbage collector finalizes the consumer's iterator there, even inside a put
    holding that queue's lock: it must not wait for itself (it spun forever in
    ``while thread.is_alive()``) nor drain its own queue (it blocked on the lock)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _CLOSED_ON_PRODUCER, str(prefetch), where],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["closed", "True", "alive", "False"], r.stdout + r.stderr[-2000:]


def test_restore_keeps_the_optimizer_this_device_uses(planted, tmp_path):
    """A checkpoint of a GPU run holds fused Adam's param groups ('fused': True);
    load_state_dict copies them, so a CPU resume ran fused Adam (not supported on the CPU
    before torch 2.4, and not the update an uninterrupted CPU run makes)."""
    cfg = minibatch_config()
    assert T.run_seed(cfg, planted, 0, "cpu", tmp_path, progress=False,
                      budget=runner.Budget(epochs=2)) is None
    path = tmp_path / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=False)
    for group in ckpt["optimizer"]["param_groups"]:  # as a GPU run writes it
        group["fused"] = True
    from dgl_maxk.training.seed import _SeedRun
    run = _SeedRun(cfg, planted, 0, torch.device("cpu"))
    fresh = [g["fused"] for g in run.optimizer.param_groups]
    run.restore(ckpt)
    assert [g["fused"] for g in run.optimizer.param_groups] == fresh


# --------------------------------------------------------------------------- input handling

def test_device_graph_checks_its_tensors():
    with pytest.raises(ValueError, match="int64"):
        DeviceGraph(torch.zeros(6, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 5)
    with pytest.raises(ValueError, match="int32 or int64"):
        DeviceGraph(torch.zeros(6, dtype=torch.int64), torch.zeros(0), 5)


def test_device_graph_of_more_than_2_31_nodes_needs_int64_indices():
    """int32 holds node ids below 2^31: a larger graph's sources need int64 (the sampler
    also sorts its seeds' ids in the indices' dtype)."""
    n = 2 ** 31 + 1
    indptr = torch.zeros(1, dtype=torch.int64).expand(n + 1)  # no memory
    with pytest.raises(ValueError, match="int64 for a graph of 2147483649 nodes"):
        DeviceGraph(indptr, torch.zeros(0, dtype=torch.int32), n)
    assert DeviceGraph(indptr, torch.zeros(0, dtype=torch.int64), n).num_nodes == n
    assert DeviceGraph(indptr[:n], torch.zeros(0, dtype=torch.int32), n - 1).num_nodes == n - 1


@pytest.mark.parametrize("fanouts", [[2.5], [True, 2], [], [0], [-2]])
def test_fanouts_must_be_positive_integers_or_minus_one(fanouts):
    with pytest.raises(ValueError, match="positive integers"):
        NeighborSampler(fanouts)


def test_sample_takes_any_integer_seeds_and_returns_them_as_int64():
    g = dgl.rand_graph(50, 300)
    graph = DeviceGraph.from_dgl(g, "cpu")
    picks = random.sample(range(50), 7)
    for seeds in (picks, torch.tensor(picks, dtype=torch.int32)):
        input_nodes, output_nodes, blocks = NeighborSampler([3]).sample(graph, seeds)
        assert output_nodes.dtype == torch.int64 and output_nodes.tolist() == picks
        assert torch.equal(blocks[0].dst_nodes, output_nodes)


def test_device_graph_of_is_cached_until_the_graph_changes():
    g = dgl.rand_graph(30, 100)
    first = DeviceGraph.of(g, "cpu")
    assert DeviceGraph.of(g, "cpu") is first
    g.add_edges(torch.tensor([0]), torch.tensor([1]))
    changed = DeviceGraph.of(g, "cpu")
    assert changed is not first and changed.indices.numel() == first.indices.numel() + 1


def test_the_callers_context_reaches_the_producer_thread():
    """Context variables (input checks) hold while the producer samples."""
    seen = []

    class Recording(NeighborSampler):
        def sample(self, graph, seeds, generator=None):
            seen.append((threading.current_thread().name, dgl_maxk.sparse.checks_enabled()))
            return super().sample(graph, seeds, generator)

    graph = DeviceGraph.from_dgl(dgl.rand_graph(40, 200), "cpu")
    loader = NeighborLoader(graph, torch.arange(40), Recording([2]), 10, prefetch=1)
    with dgl_maxk.input_checks(False):
        batches = list(loader)
    assert len(batches) == 4 and seen and all(name == THREAD_NAME and not enabled
                                              for name, enabled in seen)


# --------------------------------------------------------------------------- the reference picks

def floyd_picks_one_step_at_a_time(graph_indptr, dst, block_indptr, num_edges, fanout, draws):
    """The oracle: the reference sampler as it was written first, Floyd's steps one by one
    over every row (O(fanout^2) comparisons a row)."""
    n = dst.numel()
    start = graph_indptr[dst]
    degree = graph_indptr[dst + 1] - start
    row = torch.repeat_interleave(torch.arange(n, device=dst.device),
                                  block_indptr[1:] - block_indptr[:-1], output_size=num_edges)
    offset = torch.arange(num_edges, device=dst.device) - block_indptr[row]
    if fanout > 0:
        top = degree.clamp(min=fanout)[:, None] - fanout + torch.arange(fanout,
                                                                        device=dst.device)
        picks = torch.minimum((draws * (top + 1)).long(), top)
        chosen = torch.empty_like(picks)
        for j in range(fanout):
            seen = (chosen[:, :j] == picks[:, j:j + 1]).any(1)
            chosen[:, j] = torch.where(seen, top[:, j], picks[:, j])
        offset = torch.where(degree[row] > fanout, chosen[row, offset], offset)
    return start[row] + offset


def awkward_degrees(fanout, n=400):
    """In-degrees of ``n`` nodes: 0, just below, at and just above the fan-out, small random
    ones, and hubs far above it, shuffled."""
    f = max(fanout, 1)
    special = torch.tensor([0, 0, f - 1, f, f, f + 1, f + 1, f + 2, 2 * f, 3 * f + 7])
    hubs = torch.randint(4 * f, 4 * f + 3000, (4,))
    small = torch.randint(0, f + 3, (n - special.numel() - hubs.numel(),))
    degrees = torch.cat([special, hubs, small])
    return degrees[torch.randperm(n)]


def draws_for(n, fanout, device):
    """Fresh draws, some of them the largest double below 1 (where u * (top + 1) rounds up
    to top + 1 for large tops)."""
    draws = torch.rand(n, fanout, dtype=torch.float64, device=device)
    draws[torch.rand(n, fanout, device=device) < 0.02] = 1 - 2.0 ** -53
    return draws


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("fanout", [-1, 1, 2, 3, 7, 64, 65, 300])
def test_reference_sampler_picks_what_floyd_one_step_at_a_time_picks(fanout, device):
    """The vectorised reference returns the positions, in order, of Floyd's steps run one at
    a time on the same draws (the CUDA kernel's algorithm), on rows of degree 0, at, just
    above and far above the fan-out; dst repeats some nodes and leaves others out."""
    degrees = awkward_degrees(fanout)
    graph_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), degrees.cumsum(0)]).to(device)
    dst = torch.cat([torch.randperm(400)[:300], torch.randint(400, (20,))]).to(device)
    indptr, num_edges = dgl_maxk.sampling.sampler.block_indptr(graph_indptr, dst, fanout)
    draws = draws_for(dst.numel(), fanout, device) if fanout > 0 else None
    args = (graph_indptr, dst, indptr, num_edges, fanout, draws)
    got = dgl_maxk.backends.reference.sample_neighbors(*args)
    assert got.dtype == torch.int64 and torch.equal(got, floyd_picks_one_step_at_a_time(*args))


@pytest.mark.parametrize("fanout", [1, 2, 5, 40])
def test_reference_sampler_on_rows_just_above_the_fanout_with_colliding_draws(fanout):
    """Rows of degree fanout + 1 or + 2 with draws from a handful of values: nearly every
    step collides, so the chains of collisions are long."""
    degrees = fanout + torch.randint(1, 3, (200,))
    graph_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), degrees.cumsum(0)])
    dst = torch.randperm(200)
    indptr, num_edges = dgl_maxk.sampling.sampler.block_indptr(graph_indptr, dst, fanout)
    draws = torch.randint(0, 4, (200, fanout)).double() / 4
    args = (graph_indptr, dst, indptr, num_edges, fanout, draws)
    got = dgl_maxk.backends.reference.sample_neighbors(*args)
    assert torch.equal(got, floyd_picks_one_step_at_a_time(*args))
    row = torch.repeat_interleave(torch.arange(200), indptr.diff())
    assert ((got >= graph_indptr[dst][row]) & (got < graph_indptr[dst + 1][row])).all()
    assert got.unique().numel() == got.numel()


@pytest.mark.parametrize("fanout", [2, 3, 40, 300, 1000])
def test_reference_sampler_on_the_longest_chain_of_collisions(fanout):
    """Steps 0 and 1 draw 0, each later step j draws top_(j - 1): step 1 repeats step 0,
    and each later step collides because the one before did (a chain through every step),
    on rows of random degrees above the fan-out."""
    degrees = fanout + torch.randint(1, 3 * fanout, (50,))
    graph_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), degrees.cumsum(0)])
    dst = torch.randperm(50)
    indptr, num_edges = dgl_maxk.sampling.sampler.block_indptr(graph_indptr, dst, fanout)
    top = (degrees[dst] - fanout)[:, None] + torch.arange(fanout)
    draws = ((top - 0.5) / (top + 1)).double()
    draws[:, :2] = 0
    args = (graph_indptr, dst, indptr, num_edges, fanout, draws)
    got = dgl_maxk.backends.reference.sample_neighbors(*args)
    assert torch.equal(got, floyd_picks_one_step_at_a_time(*args))


def test_reference_sampler_is_fast_when_the_fanout_is_far_above_every_degree():
    """A fan-out of 10,000 over in-degrees near 8 takes every in-edge without drawing: the
    first reference took O(fanout^2) a batch (seconds here)."""
    import time

    n, fanout = 2000, 10_000
    g = dgl.rand_graph(n, 8 * n)
    graph = DeviceGraph.from_dgl(g, "cpu")
    dst = torch.randperm(n)[:64]
    indptr, num_edges = dgl_maxk.sampling.sampler.block_indptr(graph.indptr, dst, fanout)
    draws = torch.rand(dst.numel(), fanout, dtype=torch.float64)
    began = time.perf_counter()
    got = dgl_maxk.backends.reference.sample_neighbors(graph.indptr, dst, indptr, num_edges,
                                                       fanout, draws)
    elapsed = time.perf_counter() - began
    starts = graph.indptr[dst]
    row = torch.repeat_interleave(torch.arange(dst.numel()), indptr.diff())
    assert torch.equal(got, starts[row] + torch.arange(num_edges) - indptr[row])
    assert elapsed < 1.0, f"{elapsed:.2f} s"
