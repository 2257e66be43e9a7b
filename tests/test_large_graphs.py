"""Graphs of ogbn-papers100M's size on one GPU, tested on the CPU at small sizes: 64-bit edge
positions in the sampler, the chunked CSR builders, the papers100m-sized generator and the
ogbn-papers100M files' loader (DeviceGraphs, no DGL graph), features in host memory,
evaluation by layer-wise inference, and the trainer, config and benchmark that use them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dgl_maxk import ops
from dgl_maxk._dgl import dgl
from dgl_maxk.backends import reference
from dgl_maxk.cli import main as cli_main
from dgl_maxk.data import load_dataset, power_law_csr
from dgl_maxk.data import device_graphs
from dgl_maxk.data.device_graphs import canonical_rows, csr_from_edges
from dgl_maxk.data.papers import RULE_WIDTH, planted_labels
from dgl_maxk.models import build_model
from dgl_maxk.sampling import (DeviceGraph, NeighborLoader, NeighborSampler, gather_rows,
                               pinned, staged_rows)
from dgl_maxk.sampling import sampler as sampler_module
from dgl_maxk.sampling.sampler import block_indptr, sample_block
from dgl_maxk.training import ConfigError, validate_config
from dgl_maxk.training.inference import layerwise_logits
from dgl_maxk.training.seed import run_seed

from conftest import small_config
from test_data import papers_files
from test_scripts import load_script

REPO = Path(__file__).resolve().parents[1]
TINY = {"num_nodes": 1500, "num_edges": 12000, "num_features": 8, "num_classes": 5,
        "num_train": 200, "num_valid": 60, "num_test": 90}


@pytest.fixture(scope="module")
def planted():
    return load_dataset("planted", num_nodes=300, num_features=12)


def csr_of(degrees):
    degrees = torch.as_tensor(degrees, dtype=torch.int64)
    indptr = torch.zeros(degrees.numel() + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    return indptr


def sorted_pairs(graph: DeviceGraph) -> torch.Tensor:
    """The graph's (destination, source) pairs as sorted keys (a multiset)."""
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.indptr.diff())
    return torch.sort(dst * graph.num_nodes + graph.indices.long()).values


# --------------------------------------------------------------------------- 2^31 edges


def test_sampler_picks_edge_positions_past_2_to_31_in_int64():
    """Rows whose in-edges start past 2^31 (node 0 holds the first 2^31 + 12345; the sources
    are a stride-0 view, so nothing that size is allocated): the picks are the positions of
    the same rows without node 0's edges, shifted by its in-degree, in int64, and the full
    sampler reads the sources at them, as on a 3.2B-edge graph."""
    big = 2 ** 31 + 12345
    rest = [0, 7, 20, 3, 40]
    indptr, small = csr_of([big] + rest), csr_of([0] + rest)
    indices = torch.full((1,), 4, dtype=torch.int32).expand(int(indptr[-1]))
    graph = DeviceGraph(indptr, indices, len(rest) + 1)
    dst = torch.tensor([2, 3, 5, 1, 4])
    b_indptr, num_edges = block_indptr(indptr, dst, 5)
    draws = torch.rand(dst.numel(), 5, dtype=torch.float64)
    got = reference.sample_neighbors(indptr, dst, b_indptr, num_edges, 5, draws)
    want = reference.sample_neighbors(small, dst, b_indptr, num_edges, 5, draws)
    assert got.dtype == torch.int64 and torch.equal(got, want + big)
    assert int(got.min()) > 2 ** 31
    _, _, (block,) = NeighborSampler([5]).sample(graph, dst)
    assert block.num_edges() == num_edges
    assert torch.equal(block.src_nodes[block.plan.indices].unique(), torch.tensor([4]))


def test_the_cuda_kernels_hold_edge_positions_and_row_offsets_in_64_bits():
    """The GPU side of the above, read from the kernels' source (no GPU here): every pointer
    and variable that holds an edge position, a row offset or a count is a long long."""
    kernels = REPO / "kernels"
    sample = (kernels / "sample_neighbors.cu").read_text()
    for declared in ("const long long* __restrict__ graph_indptr",
                     "const long long* __restrict__ block_indptr",
                     "long long* __restrict__ out, long long n", "long long r = ",
                     "long long* __restrict__ out_eid, long long n", "long long slot",
                     "long long pos", "long long start = ", "long long degree = ",
                     "long long row_start = ", "long long picked[MAX_FANOUT]",
                     "long long top = ", "long long t = ",
                     "for (long long i = 0; i < degree; ++i)"):
        assert declared in sample, declared
    gather = (kernels / "gather_rows.cu").read_text()
    for declared in ("const long long* __restrict__ index", "long long n, long long row_words",
                     "const long long i = (long long)blockIdx.x",
                     "for (long long c = threadIdx.x & 31; c < row_words; c += 32)"):
        assert declared in gather, declared
    assert not re.search(r"\bint\s+\w+\s*=\s*\w*(indptr|index)\[", sample + gather)


def test_device_graph_out_degrees_count_every_source_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(sampler_module, "_OUT_DEGREE_CHUNK", 64)
    g = dgl.rand_graph(100, 1000)
    assert torch.equal(DeviceGraph.from_dgl(g, "cpu").out_degrees, g.out_degrees())


def test_a_block_scaled_by_its_sources_graph_degrees_keeps_its_own_transpose():
    """GraphConv's 'both' norm on a block whose sources keep their out-degrees in the graph
    (layer-wise inference's blocks) scales by those, forward and backward; the backward's
    transposed CSR still counts the block's own edges."""
    g = dgl.rand_graph(200, 1500)
    graph = DeviceGraph.from_dgl(g, "cpu")
    block = sample_block(graph, torch.randperm(200)[:40], 5, graph_degrees=True)
    plan = block.plan
    x = torch.randn(plan.num_src, 6, dtype=torch.float64, requires_grad=True)
    y = ops.spmm(plan, x, norm="both")
    grad = torch.randn_like(y)
    y.backward(grad)
    rows, cols = plan.dst_of_edge, plan.indices
    scale = (plan.in_degrees[rows].clamp(min=1)
             * graph.out_degrees[block.src_nodes][cols].clamp(min=1)).double().rsqrt()
    dense = torch.zeros(plan.num_dst, plan.num_src, dtype=torch.float64).index_put_(
        (rows, cols), scale, accumulate=True)
    torch.testing.assert_close(y, dense @ x.detach())
    torch.testing.assert_close(x.grad, dense.T @ grad)


# --------------------------------------------------------------------------- builders


def test_power_law_csr_in_chunks_keeps_the_degrees_and_sorted_rows():
    seed = int(torch.randint(0, 2 ** 31, ()))
    indptr, indices = power_law_csr(3000, 40000, seed=seed)
    ip, ix = power_law_csr(3000, 40000, seed=seed, index_dtype=torch.int32, chunk_edges=1500)
    assert torch.equal(ip, indptr) and ix.dtype == torch.int32 and ix.numel() == 40000
    assert int(ix.min()) >= 0 and int(ix.max()) < 3000
    row = torch.repeat_interleave(torch.arange(3000), ip.diff())
    later = torch.ones(40000, dtype=torch.bool)
    later[ip[:-1][ip.diff() > 0]] = False  # each row's first entry
    assert bool((ix[1:] >= ix[:-1])[later[1:]].all()) and torch.equal(row, row.sort().values)
    again = power_law_csr(3000, 40000, seed=seed, index_dtype=torch.int32, chunk_edges=1500)
    assert torch.equal(again[1], ix)


@pytest.mark.parametrize("dedupe, self_loops", [(False, False), (True, False), (False, True),
                                                (True, True)])
def test_streamed_edges_make_the_in_edge_csr_and_its_canonical_rows(dedupe, self_loops,
                                                                   monkeypatch):
    n = 200
    src = torch.randint(0, n, (3000,))
    dst = torch.randint(0, n, (3000,))
    src[:40], dst[:40] = dst[40:80], src[40:80]  # some pairs both ways
    src[80:100] = dst[80:100]  # self-loops
    graph = csr_from_edges(lambda: zip(src.split(37), dst.split(37)), n, "cpu")
    order = torch.argsort(dst, stable=True)
    assert graph.indices.dtype == torch.int32
    assert torch.equal(graph.indptr, csr_of(torch.bincount(dst, minlength=n)))
    assert torch.equal(graph.indices.long(), src[order])  # each row in stream order
    monkeypatch.setattr(device_graphs, "CHUNK_EDGES", 64)  # many chunks of rows
    out = canonical_rows(graph, dedupe, self_loops)
    key = dst * n + src
    if self_loops:
        key = torch.cat([key[src != dst], torch.arange(n) * (n + 1)])
    key = key.unique() if dedupe else key.sort().values
    assert torch.equal(out.indptr, csr_of(torch.bincount(key // n, minlength=n)))
    assert torch.equal(out.indices.long(), key % n)  # sorted within rows


# --------------------------------------------------------------------------- datasets


def test_papers100m_sized_is_a_device_graph_with_papers_splits_and_a_seed():
    seed = int(torch.randint(0, 2 ** 31, ()))
    data = load_dataset("papers100m-sized", self_loops=False, device="cpu", seed=seed, **TINY)
    graph = data.graph
    assert isinstance(graph, DeviceGraph) and graph.num_edges == TINY["num_edges"]
    assert graph.indices.dtype == torch.int32 and data.features.shape == (1500, 8)
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert masks.sum(1).tolist() == [200, 60, 90] and int(masks.sum(0).max()) == 1
    labelled = masks.any(0)
    assert bool((data.labels[~labelled] == -1).all())
    assert 0 <= int(data.labels[labelled].min()) and int(data.labels.max()) < 5
    assert data.labels[labelled].unique().numel() > 1
    again = load_dataset("papers100m-sized", self_loops=False, device="cpu", seed=seed, **TINY)
    for a, b in ((graph.indices, again.graph.indices), (data.features, again.features),
                 (data.labels, again.labels), (data.train_mask, again.train_mask)):
        assert torch.equal(a, b)
    other = load_dataset("papers100m-sized", self_loops=False, device="cpu", seed=seed + 1,
                         **TINY)
    assert not torch.equal(other.features, data.features)
    looped = load_dataset("papers100m-sized", self_loops=True, device="cpu", seed=seed, **TINY)
    assert torch.equal(sorted_pairs(looped.graph), sorted_pairs(canonical_rows(
        graph, dedupe=False, self_loops=True)))


def test_planted_labels_follow_the_rule_over_in_neighbours():
    """argmax_c (z_v + mean of z_u over in-neighbours u) . V_c, V's columns unit vectors
    drawn from the generator; here against DGL's mean aggregation."""
    g = dgl.rand_graph(400, 3000)
    g.add_nodes(10)  # without in-neighbours: their own z alone
    graph = DeviceGraph.from_dgl(g, "cpu")
    z = torch.randn(410, RULE_WIDTH)
    nodes = torch.cat([torch.randperm(400)[:150], torch.arange(400, 410)])
    seed = int(torch.randint(0, 2 ** 31, ()))
    got = planted_labels(graph, z, nodes, 7, torch.Generator().manual_seed(seed))
    classes = torch.randn(RULE_WIDTH, 7, generator=torch.Generator().manual_seed(seed),
                          dtype=torch.float64)
    classes /= classes.norm(dim=0, keepdim=True)
    g.ndata["z"] = z.double()
    g.update_all(dgl.function.copy_u("z", "m"), dgl.function.mean("m", "mean"))
    want = ((z.double() + g.ndata["mean"]) @ classes).argmax(1)[nodes]
    assert torch.equal(got, want)


@pytest.mark.parametrize("to_bidirected, self_loops, fortran", [
    (True, False, False), (False, False, True), (True, True, False), (False, True, False)])
def test_ogbn_papers100m_files_load_as_a_device_graph(to_bidirected, self_loops, fortran,
                                                      tmp_path):
    src, dst, feat, label, splits = papers_files(tmp_path, fortran=fortran)
    data = load_dataset("ogbn-papers100M", root=tmp_path, self_loops=self_loops,
                        device="cpu", to_bidirected=to_bidirected)
    g = dgl.graph((src, dst), num_nodes=300)
    if to_bidirected:
        g = dgl.to_simple(dgl.to_bidirected(dgl.to_simple(g)))
    if self_loops:
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    assert isinstance(data.graph, DeviceGraph)
    assert torch.equal(sorted_pairs(data.graph), sorted_pairs(DeviceGraph.from_dgl(g, "cpu")))
    assert data.features.dtype == torch.float32 and torch.equal(data.features, feat.float())
    assert torch.equal(data.labels, torch.where(label.isnan(), -1, label).long())
    for mask, name in ((data.train_mask, "train"), (data.val_mask, "valid"),
                       (data.test_mask, "test")):
        assert torch.equal(mask.nonzero()[:, 0], splits[name].sort().values)
    assert data.num_classes == 172 and data.evaluator == "ogbn-papers100M"


# --------------------------------------------------------------------------- features


def test_gather_rows_is_index_select_on_the_index_device():
    table = torch.randn(500, 7)
    index = torch.randint(0, 500, (300,))
    assert torch.equal(gather_rows(table, index), table[index])
    assert torch.equal(gather_rows(table[:, 0].contiguous(), index), table[index, 0])


def test_gather_rows_refuses_ids_and_tables_it_cannot_read():
    table = torch.randn(50, 4)
    low, high = int(torch.randint(-9, 0, ())), int(torch.randint(50, 60, ()))
    for ids, first, last in (([7, low], low, 7), ([high, 3], 3, high)):
        with pytest.raises(ValueError, match=rf"row ids must be in \[0, 50\), got ids from "
                                             rf"{first} to {last}"):
            gather_rows(table, torch.tensor(ids))
    for index in (torch.tensor([[1]]), torch.tensor([1.0]), torch.tensor([True])):
        with pytest.raises(ValueError, match="index must be a 1-d tensor of integer row ids"):
            gather_rows(table, index)
    with pytest.raises(ValueError, match="table must have a row per node, got shape"):
        gather_rows(torch.tensor(1.0), torch.tensor([0]))
    with pytest.raises(ValueError, match="table is on meta, but its rows go to cpu"):
        gather_rows(table.to("meta"), torch.tensor([1]))
    with pytest.raises(TypeError, match="table must be a tensor, got list"):
        gather_rows([[1.0]], torch.tensor([0]))


def test_a_loader_refuses_features_without_a_row_per_node():
    graph = DeviceGraph.from_dgl(dgl.rand_graph(40, 100), "cpu")
    with pytest.raises(ValueError, match=r"features must have a row per node \(40\), got "
                                         r"shape \(39, 3\)"):
        NeighborLoader(graph, torch.arange(5), NeighborSampler([2]), 4,
                       features=torch.randn(39, 3))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_loader_given_features_hands_each_batch_its_rows(prefetch):
    graph = DeviceGraph.from_dgl(dgl.rand_graph(400, 3000), "cpu")
    features = torch.randn(400, 5)
    plain = NeighborLoader(graph, torch.arange(150), NeighborSampler([4, 3]), 32, seed=3,
                           prefetch=prefetch)
    with_rows = NeighborLoader(graph, torch.arange(150), NeighborSampler([4, 3]), 32, seed=3,
                               prefetch=prefetch, features=features)
    for (nodes, seeds, _), (nodes_, seeds_, _, rows) in zip(plain, with_rows, strict=True):
        assert torch.equal(nodes, nodes_) and torch.equal(seeds, seeds_)
        assert torch.equal(rows, features[nodes])


def test_staged_rows_are_index_select_and_refuse_what_they_cannot_read():
    table = torch.randn(int(torch.randint(50, 90, ())), 6)
    index = torch.randint(0, table.shape[0], (int(torch.randint(0, 200, ())),))
    assert torch.equal(staged_rows(table, index), table[index])
    assert staged_rows(table, index[:0]).shape == (0, 6)
    weights = table.clone().requires_grad_()
    assert torch.equal(staged_rows(weights, index), table[index])  # rows, no gradient
    with pytest.raises(ValueError, match=rf"row ids must be in \[0, {table.shape[0]}\), got "
                                         rf"ids from -1 to {table.shape[0]}"):
        staged_rows(table, torch.tensor([0, table.shape[0], -1]))
    with pytest.raises(ValueError, match="index must be a 1-d tensor of integer row ids"):
        staged_rows(table, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="table is on meta, but its rows go to cpu"):
        staged_rows(table.to("meta"), torch.tensor([1]))


# --------------------------------------------------------------------------- inference


def source_sorted_graph(num_nodes, num_edges, isolated=20):
    """A random graph whose edges are ordered by destination, then source, with isolated
    nodes: its DeviceGraph's rows then sum in the order of the whole graph's plan (the
    layers' outputs are bit for bit alike, and MaxK keeps the same entries)."""
    src, dst = dgl.rand_graph(num_nodes, num_edges).edges()
    order = torch.argsort(dst * num_nodes + src)
    return dgl.graph((src[order], dst[order]), num_nodes=num_nodes + isolated)


@pytest.mark.parametrize("nonlinearity", ["maxk", "relu"])
@pytest.mark.parametrize("name", ["sage", "gcn", "gin"])
def test_layerwise_inference_gives_the_whole_graph_forwards_logits(name, nonlinearity):
    """In batches of a few destination nodes (many batches a layer), for nodes in any order
    with repeats; isolated and zero-in-degree nodes included. GCN's 'both' norm scales the
    sources by their degrees in the graph, not in the batch's block."""
    g = source_sorted_graph(300, 2400)
    x = torch.randn(320, 12)
    model = build_model(name, 12, 16, 5, 3, k=4, nonlinearity=nonlinearity).eval()
    with torch.no_grad():
        want = model(g, x)
    nodes = torch.cat([torch.randperm(320)[:150], torch.tensor([310, 3, 3])])
    got = layerwise_logits(model, DeviceGraph.from_dgl(g, "cpu"), x, nodes, batch_edges=150,
                           batch_nodes=40)
    torch.testing.assert_close(got, want[nodes])


def test_layerwise_inference_refuses_what_it_cannot_evaluate():
    graph = DeviceGraph.from_dgl(dgl.rand_graph(30, 90), "cpu")
    model = build_model("sage", 4, 8, 3, 2, k=2)
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        layerwise_logits(model, graph, torch.randn(30, 4), torch.arange(5))
    with pytest.raises(ValueError, match="storage must be one of"):
        layerwise_logits(model.eval(), graph, torch.randn(30, 4), torch.arange(5),
                         storage="disk")
    with pytest.raises(ValueError, match=r"node ids must be in \[0, 30\), got ids from 2 to 30"):
        layerwise_logits(model, graph, torch.randn(30, 4), torch.tensor([2, 30]))
    with pytest.raises(ValueError, match=r"features must have a row per node \(30\)"):
        layerwise_logits(model, graph, torch.randn(29, 4), torch.arange(5))
    with pytest.raises(TypeError, match="takes a model of dgl_maxk.models, got Linear"):
        layerwise_logits(torch.nn.Linear(4, 3).eval(), graph, torch.randn(30, 4),
                         torch.arange(5))


# --------------------------------------------------------------------------- training


def test_datasets_built_on_the_device_need_the_device_sampler_and_layerwise_inference():
    base = {"name": "t", "mode": "minibatch",
            "dataset": {"name": "papers100m-sized", "params": TINY},
            "model": {"name": "sage", "hidden": 16, "layers": 2, "k": 4},
            "sampling": {"fanouts": [4, 3]}}
    validate_config(base)
    for key, value in (("mode", "full"), ("sampler", "dgl"), ("inference", "graph")):
        cfg = json.loads(json.dumps(base))
        (cfg if key == "mode" else cfg["sampling"])[key] = value
        with pytest.raises(ConfigError, match="papers100m-sized.*sampling.sampler: device"):
            validate_config(cfg)
    with pytest.raises(ConfigError, match="num_train.*exceeds num_nodes"):
        validate_config({**base, "dataset": {"name": "papers100m-sized",
                                             "params": {**TINY, "num_train": 1500}}})


def test_the_trainer_evaluates_layer_by_layer_and_reads_host_features(planted, tmp_path):
    """sampling.features: host and sampling.inference: layerwise train the same steps (the
    same losses) and score what the whole-graph evaluation scores, but for rounding."""
    cfg = small_config(**{"mode": "minibatch", "sampling.fanouts": [4, 3],
                          "sampling.batch_size": 32, "train.epochs": 2})
    whole = run_seed(cfg, planted, 0, "cpu", tmp_path / "graph", progress=False)
    cfg = small_config(**{"mode": "minibatch", "sampling.fanouts": [4, 3],
                          "sampling.batch_size": 32, "train.epochs": 2,
                          "sampling.features": "host", "sampling.inference": "layerwise"})
    layerwise = run_seed(cfg, planted, 0, "cpu", tmp_path / "layerwise", progress=False)
    for a, b in zip(whole["history"], layerwise["history"]):
        assert a["loss"] == b["loss"]
        for split, count in (("train", planted.train_mask), ("val", planted.val_mask),
                             ("test", planted.test_mask)):
            assert abs(a[split] - b[split]) <= 1 / int(count.sum()) + 1e-12


def test_the_papers100m_sized_config_trains_and_evaluates_through_the_cli(tmp_path):
    """configs/papers100m_sized_minibatch.yaml at tiny sizes, features in host memory: two
    epochs, evaluated layer by layer."""
    sizes = [f"dataset.params.{key}={value}" for key, value in TINY.items()]
    status = cli_main(["train", "--config", "configs/papers100m_sized_minibatch.yaml",
                       "--device", "cpu", "--out", str(tmp_path), "--no-progress", "--set",
                       *sizes, "model.hidden=16", "model.k=4", "sampling.batch_size=64",
                       "sampling.features=host"])
    assert status == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["complete"]
    (seed,) = res["variants"]["maxk4"]["seeds"]
    assert [h["epoch"] for h in seed["history"]] == [1, 2]
    assert 0 <= seed["history"][-1]["test"] <= 1


def test_bench_minibatch_papers100m_sized_has_papers_sizes_and_the_device_sampler(tmp_path,
                                                                                capsys):
    bench = load_script("bench_minibatch")
    common = ["--graph", "papers100m-sized", "--device", "cpu", "--out", str(tmp_path / "o")]
    args = bench.parse_args(common)
    assert args.samplers == ["device"] and args.feature_memory == ["device"]
    assert bench.dataset_params(args) == {
        "num_nodes": 111_059_956, "num_edges": 1_615_685_872, "num_features": 128,
        "num_classes": 172, "num_train": 1_207_179, "num_valid": 125_265, "num_test": 214_338,
        "seed": 0}
    with pytest.raises(SystemExit):
        bench.parse_args(common + ["--samplers", "device", "dgl"])
    assert "error: argument --samplers: the papers100m-sized graph" in capsys.readouterr().err


# --------------------------------------------------------------------------- on a GPU

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA GPU (device graphs, pinned host features)")


@CUDA
@pytest.mark.parametrize("storage", ["device", "host"])
@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_layerwise_inference_on_the_gpu_from_either_memory(name, storage):
    """Features and stored layers in GPU memory, or in pinned host memory read by the GPU
    (gather_rows' kernel): the whole graph's logits. k is the hidden width: the GPU sums in
    another order batch by batch, and a top-k of fewer would flip between near-equal values
    (a row's logits then differ by far more than rounding); the selection of fewer is
    tested on the CPU above and against the reference in test_cuda_kernels.py."""
    g = source_sorted_graph(3000, 30000)
    x = torch.randn(3020, 12)
    model = build_model(name, 12, 32, 5, 3, k=32).to("cuda").eval()
    with torch.no_grad():
        want = model(g, x.cuda())
    nodes = torch.randperm(3020)[:500]
    features = pinned(x) if storage == "host" else x.cuda()
    got = layerwise_logits(model, DeviceGraph.from_dgl(g, "cuda"), features, nodes,
                           batch_edges=4000, storage=storage)
    torch.testing.assert_close(got, want[nodes.cuda()], rtol=1e-4, atol=1e-4)


@CUDA
@pytest.mark.parametrize("storage", ["device", "host"])
def test_gather_rows_on_the_gpu_reads_every_row_from_either_memory(storage):
    """Rows of 1 to 130 4-byte words and of an odd byte count, ids with repeats: the rows of
    index_select."""
    count = int(torch.randint(20_000, 40_000, ()))
    for shape, dtype in (((5000, 1), torch.float32), ((5000, 130), torch.float32),
                         ((5000, 3), torch.float16), ((5000, 7), torch.uint8)):
        table = (torch.randint(0, 100, shape).to(dtype) if dtype == torch.uint8
                 else torch.randn(shape).to(dtype))
        stored = pinned(table) if storage == "host" else table.cuda()
        index = torch.randint(0, shape[0], (count,), device="cuda")
        assert torch.equal(gather_rows(stored, index).cpu(), table[index.cpu()])


@CUDA
@pytest.mark.parametrize("pin", [True, False])
def test_staged_rows_bring_host_rows_to_the_gpu_bit_for_bit(pin):
    """Rows of 1 to 130 4-byte words and of an odd byte count, ids with repeats and none, from
    pinned or pageable host memory: the rows of index_select, on the index's GPU."""
    count = int(torch.randint(20_000, 40_000, ()))
    for shape, dtype in (((5000, 1), torch.float32), ((5000, 130), torch.float32),
                         ((5000, 3), torch.float16), ((5000, 7), torch.uint8)):
        table = (torch.randint(0, 100, shape).to(dtype) if dtype == torch.uint8
                 else torch.randn(shape).to(dtype))
        stored = pinned(table) if pin else table
        for n in (count, 0):
            index = torch.randint(0, shape[0], (n,), device="cuda")
            rows = staged_rows(stored, index)
            assert rows.device == index.device
            assert torch.equal(rows.cpu(), table[index.cpu()])


@CUDA
@pytest.mark.parametrize("pin", [True, False])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_gpu_loader_given_host_features_hands_each_batch_its_rows(prefetch, pin,
                                                                     monkeypatch):
    """Features in host memory, pinned or not, reach each batch by staged_rows (a copy
    engine), one call a batch: the rows of the batch's input nodes, whichever thread
    sampled it."""
    from dgl_maxk.sampling import loader as loader_module
    calls = []
    monkeypatch.setattr(loader_module, "staged_rows",
                        lambda *args: calls.append(1) or staged_rows(*args))
    graph = DeviceGraph.from_dgl(dgl.rand_graph(4000, 40000), "cuda")
    table = torch.randn(4000, 9)
    features = pinned(table) if pin else table
    loader = NeighborLoader(graph, torch.arange(1500), NeighborSampler([5, 4]), 128, seed=5,
                            prefetch=prefetch, features=features)
    batches = 0
    for nodes, _, _, rows in loader:
        assert rows.device.type == "cuda"
        assert torch.equal(rows.cpu(), table[nodes.cpu()])
        batches += 1
    assert batches == len(loader) == len(calls) == 12


@CUDA
def test_papers100m_sized_on_the_gpu_keeps_its_features_pinned_and_its_seed():
    seed = int(torch.randint(0, 2 ** 31, ()))
    data = load_dataset("papers100m-sized", self_loops=False, device="cuda", seed=seed, **TINY)
    again = load_dataset("papers100m-sized", self_loops=False, device="cuda", seed=seed, **TINY)
    assert data.graph.device.type == "cuda" and data.features.is_pinned()
    for a, b in ((data.graph.indices, again.graph.indices), (data.features, again.features),
                 (data.labels, again.labels), (data.test_mask, again.test_mask)):
        assert torch.equal(a, b)
    labelled = data.train_mask | data.val_mask | data.test_mask
    assert bool((data.labels[~labelled] == -1).all()) and bool((data.labels[labelled] >= 0).all())


@CUDA
@pytest.mark.parametrize("features", ["device", "host"])
def test_the_papers100m_sized_config_trains_and_evaluates_on_the_gpu(features, tmp_path):
    sizes = [f"dataset.params.{key}={value}" for key, value in TINY.items()]
    status = cli_main(["train", "--config", "configs/papers100m_sized_minibatch.yaml",
                       "--device", "cuda", "--out", str(tmp_path), "--no-progress", "--set",
                       *sizes, "sampling.batch_size=64", f"sampling.features={features}"])
    assert status == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (seed,) = json.loads((run_dir / "results.json").read_text())["variants"]["maxk32"]["seeds"]
    assert [h["epoch"] for h in seed["history"]] == [1, 2]
    assert 0 <= seed["history"][-1]["test"] <= 1
