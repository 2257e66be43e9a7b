"""Shared fixtures and helpers of the dgl_maxk test suite.

Randomness: every test runs with a fresh seed (torch, numpy, random), drawn from the OS. A
failing test reports its seed in a "dgl_maxk random seed" section; rerun it with
``DGL_MAXK_TEST_SEED=<seed> pytest <test id>`` to reproduce it.

Graphs: the ``graph_kind`` argument of a test is parametrised over :data:`GRAPH_KINDS` (random
graphs with empty rows, isolated nodes, self-loops, multi-edges, directed edges, no edges,
rectangular blocks and bipartite graphs); the ``graph_case`` fixture builds one of them. The
``h`` fixture gives the helper functions (graph builders, dense references, CBSR builders).
"""
from __future__ import annotations

import collections
import os
import random
import secrets
import tempfile

#: where DGL and matplotlib keep their files during a run of the suite (DGL: its config, written
#: where no backend is set, and the datasets' default folder; matplotlib: its config and
#: font cache), instead of the home directory. Set before either is imported (both read the
#: variables once); the first process of a run makes the folder, and pytest-xdist's workers
#: and every subprocess inherit the variables.
SCRATCH_VARIABLES = {"DGLDEFAULTDIR": "dgl", "DGL_DOWNLOAD_DIR": "dgl/downloads",
                     "MPLCONFIGDIR": "matplotlib"}
SCRATCH_ENV = "DGL_MAXK_TEST_SCRATCH"
if SCRATCH_ENV not in os.environ:
    _scratch = tempfile.TemporaryDirectory(prefix="dgl_maxk-tests-")  # removed at exit
    os.environ[SCRATCH_ENV] = _scratch.name
    os.environ.update({name: os.path.join(_scratch.name, folder)
                       for name, folder in SCRATCH_VARIABLES.items()})

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import dgl_maxk  # noqa: E402,F401  (imports DGL through the package's compatibility fix)
from dgl_maxk._dgl import dgl  # noqa: E402
from dgl_maxk.training import apply_overrides, validate_config  # noqa: E402

SEED_ENV = "DGL_MAXK_TEST_SEED"

# The graphs here are tiny: intra-op threads only add synchronisation, and on a loaded
# machine OpenMP barriers make each small sparse product take milliseconds.
torch.set_num_threads(int(os.environ.get("DGL_MAXK_TEST_THREADS", "1")))

GRAPH_KINDS = ("random", "empty_rows", "isolated", "self_loops", "multi_edges", "directed",
               "no_edges", "block", "block_zero_in", "bipartite")


def small_config(**overrides):
    """A validated config of a tiny planted-partition run, with dotted-key overrides."""
    cfg = {"name": "t", "dataset": {"name": "planted",
                                    "params": {"num_nodes": 300, "num_features": 12}},
           "model": {"name": "sage", "hidden": 16, "layers": 2, "k": 4, "dropout": 0.5,
                     "input_dropout": 0.2},
           "train": {"epochs": 6, "lr": 0.01, "seeds": [0], "checkpoint_every": 2}}
    return validate_config(apply_overrides(cfg, overrides))


# --------------------------------------------------------------------------- randomness

@pytest.fixture(autouse=True)
def _dgl_maxk_seed(request):
    """A fresh seed for every test (or DGL_MAXK_TEST_SEED), applied to torch/numpy/random."""
    value = int(os.environ.get(SEED_ENV) or secrets.randbits(31))
    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)
    request.node.dgl_maxk_seed = value
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    value = getattr(item, "dgl_maxk_seed", None)
    if report.failed and value is not None:
        report.sections.append((
            "dgl_maxk random seed",
            f"seed = {value}; reproduce with {SEED_ENV}={value} pytest '{item.nodeid}'"))


def pytest_generate_tests(metafunc):
    if "graph_kind" in metafunc.fixturenames:
        metafunc.parametrize("graph_kind", GRAPH_KINDS)


# --------------------------------------------------------------------------- graphs

def random_edges(num_src, num_dst, num_edges, src_pool=None, dst_pool=None):
    """Uniform random edges (duplicates and self-loops happen by chance)."""
    src_pool = torch.arange(num_src) if src_pool is None else torch.as_tensor(src_pool)
    dst_pool = torch.arange(num_dst) if dst_pool is None else torch.as_tensor(dst_pool)
    src = src_pool[torch.randint(len(src_pool), (num_edges,))]
    dst = dst_pool[torch.randint(len(dst_pool), (num_edges,))]
    return src, dst


def homograph(src, dst, num_nodes):
    return dgl.graph((src.long(), dst.long()), num_nodes=num_nodes)


def random_graph(n=40, num_edges=160):
    """A random directed multigraph on n nodes (self-loops and multi-edges possible)."""
    return homograph(*random_edges(n, n, num_edges), n)


def graph_with_zero_in_degree(n=40, num_edges=120, num_empty=8):
    """Random graph in which ``num_empty`` random nodes receive no edge (empty CSR rows)."""
    perm = torch.randperm(n)
    return homograph(*random_edges(n, n, num_edges, dst_pool=perm[num_empty:]), n), \
        perm[:num_empty]


def block_of(graph, seeds):
    """``dgl.to_block(dgl.in_subgraph(graph, seeds), seeds)`` with the maps back to ``graph``.

    Returns (block, src_nids, dst_nids, eids): the ids in ``graph`` of the block's source
    nodes, destination nodes and edges.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    sub = dgl.in_subgraph(graph, seeds)
    block = dgl.to_block(sub, seeds)
    eids = sub.edata[dgl.EID][block.edata[dgl.EID]]
    src_nids, dst_nids = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
    # The maps must be right, or every block comparison would be meaningless.
    bs, bd = block.edges()
    gs, gd = graph.edges()
    assert torch.equal(gs[eids], src_nids[bs]) and torch.equal(gd[eids], dst_nids[bd])
    assert torch.equal(dst_nids, seeds)
    return block, src_nids, dst_nids, eids


def random_seeds(n, count):
    return torch.randperm(n)[:count]


def make_graph(kind, n=40):
    """A small graph of the named kind (see GRAPH_KINDS) and a description of it."""
    if kind == "random":
        return random_graph(n, 4 * n)
    if kind == "empty_rows":
        return graph_with_zero_in_degree(n, 3 * n, n // 4)[0]
    if kind == "isolated":
        # The last 6 nodes have no edges at all; the others form a random graph.
        return homograph(*random_edges(n - 6, n - 6, 3 * n), n)
    if kind == "self_loops":
        return dgl.add_self_loop(random_graph(n, 2 * n))
    if kind == "multi_edges":
        src, dst = random_edges(n, n, 2 * n)
        reps = torch.randint(1, 4, (2 * n,))
        return homograph(src.repeat_interleave(reps), dst.repeat_interleave(reps), n)
    if kind == "directed":
        # Edges from lower to higher ids only: in- and out-degrees differ everywhere.
        src, dst = random_edges(n, n, 6 * n)
        keep = src < dst
        return homograph(src[keep], dst[keep], n)
    if kind == "no_edges":
        return homograph(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                         n)
    if kind == "block":
        graph = dgl.add_self_loop(random_graph(n, 3 * n))
        return block_of(graph, random_seeds(n, n // 3))[0]
    if kind == "block_zero_in":
        graph, empty = graph_with_zero_in_degree(n, 3 * n, n // 4)
        seeds = torch.cat([empty[:3], random_seeds(n, n // 3)]).unique()
        seeds = seeds[torch.randperm(len(seeds))]
        return block_of(graph, seeds)[0]
    if kind == "bipartite":
        num_src, num_dst = n, n // 2 + 3
        src, dst = random_edges(num_src, num_dst, 3 * n, dst_pool=torch.arange(num_dst - 2))
        return dgl.heterograph({("user", "rates", "item"): (src, dst)},
                               num_nodes_dict={"user": num_src, "item": num_dst})
    raise ValueError(kind)


def positive_edge_weight(graph, shape="flat", dtype=torch.float64):
    """Random positive edge weights of shape (E,) ('flat') or (E, 1) ('column')."""
    w = torch.rand(graph.num_edges(), dtype=dtype) + 0.25
    return w if shape == "flat" else w.unsqueeze(1)


def dense_adjacency(graph, norm="none", edge_weight=None, dtype=torch.float64):
    """The weighted adjacency A (num_dst x num_src) built edge by edge in Python.

    A[r, c] = sum over edges e = (c -> r) of w_e * s_src(c) * s_dst(r), with DGL GraphConv's
    scales: 'left' 1/outdeg(c), 'right' 1/indeg(r), 'both' both to the power -1/2, degrees
    counted here from the edge list and clamped to at least 1. For small graphs only.
    """
    src, dst = (t.tolist() for t in graph.edges())
    weights = [1.0] * len(src) if edge_weight is None else edge_weight.reshape(-1).tolist()
    out_deg = collections.Counter(src)
    in_deg = collections.Counter(dst)
    a = torch.zeros(graph.num_dst_nodes(), graph.num_src_nodes(), dtype=torch.float64)
    for c, r, w in zip(src, dst, weights):
        dc, dr = max(out_deg[c], 1), max(in_deg[r], 1)
        if norm == "left":
            w = w / dc
        elif norm == "right":
            w = w / dr
        elif norm == "both":
            w = w / (dc ** 0.5 * dr ** 0.5)
        else:
            assert norm == "none"
        a[r, c] += w
    return a.to(dtype)


# --------------------------------------------------------------------------- features

def expected_index_dtype(d):
    return torch.uint8 if d <= 256 else torch.int16


def random_pattern(n, d, k):
    """Indices (n x k, int64, ascending per row) of k distinct random columns per row."""
    return torch.rand(n, d).argsort(dim=1)[:, :k].sort(dim=1).values


def random_cbsr(n, d, k, dtype=torch.float64, requires_grad=False):
    """A random CBSR matrix (values standard normal) and its pattern as int64."""
    idx = random_pattern(n, d, k)
    values = torch.randn(n, k, dtype=dtype, requires_grad=requires_grad)
    return dgl_maxk.CBSR(values, idx.to(expected_index_dtype(d)), d), idx


def distinct_values(n, d, dtype=torch.float64, gap=0.01):
    """An n x d matrix of distinct values (a random permutation, spaced ``gap`` apart, of
    both signs): no ties, and no pair closer than ``gap``."""
    return ((torch.randperm(n * d).reshape(n, d) - n * d / 2) * gap).to(dtype)


def topk_mask_dense(h, k):
    """MaxK by its definition via torch.topk: h where h is among the k largest of its row."""
    idx = torch.topk(h, k, dim=1).indices
    mask = torch.zeros_like(h, dtype=torch.bool).scatter_(1, idx, True)
    return torch.where(mask, h, torch.zeros_like(h))


class Helpers:
    """The helper functions, as the ``h`` fixture."""
    GRAPH_KINDS = GRAPH_KINDS
    random_edges = staticmethod(random_edges)
    homograph = staticmethod(homograph)
    random_graph = staticmethod(random_graph)
    graph_with_zero_in_degree = staticmethod(graph_with_zero_in_degree)
    block_of = staticmethod(block_of)
    random_seeds = staticmethod(random_seeds)
    make_graph = staticmethod(make_graph)
    positive_edge_weight = staticmethod(positive_edge_weight)
    dense_adjacency = staticmethod(dense_adjacency)
    expected_index_dtype = staticmethod(expected_index_dtype)
    random_pattern = staticmethod(random_pattern)
    random_cbsr = staticmethod(random_cbsr)
    distinct_values = staticmethod(distinct_values)
    topk_mask_dense = staticmethod(topk_mask_dense)


@pytest.fixture
def h():
    return Helpers


@pytest.fixture
def graph_case(graph_kind):
    """(kind, graph) for the test's ``graph_kind``."""
    return graph_kind, make_graph(graph_kind)


def optimizer_state(opt) -> list:
    """Copies of an optimizer's state tensors (moments, step counts), parameter by parameter."""
    return [t.detach().clone() for group in opt.param_groups for p in group["params"]
            for t in opt.state[p].values() if torch.is_tensor(t)]


class ReadsOnTheHost(torch.nn.Module):
    """A model whose forward reads a tensor on the host (a step that cannot be captured in a
    CUDA graph), otherwise ``inner``."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, graph, x):
        out = self.inner(graph, x)
        return out * (1 + 0 * float(out.detach().sum()))  # a host synchronisation
