"""Bad input gets a ValueError or DGLError whose message names the problem."""
import contextlib
import re
from unittest import mock

import pytest
import torch
from torch import nn

import dgl_maxk
from dgl_maxk import CBSR, cbsr_spgemm, graph_plan, maxk, spmm
from dgl_maxk._dgl import DGLError, dgl
from dgl_maxk.nn import GINConv, GraphConv, SAGEConv

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (torch.cuda.is_available() is "
                                          "False)")

BAD_ERRORS = (ValueError, DGLError)


def layers(width=6, k=None):
    """One layer of each kind (and aggregator) taking ``width``-wide input."""
    out = {
        "sage_mean": SAGEConv(width, 4, "mean", k=k),
        "sage_gcn": SAGEConv(width, 4, "gcn", k=k),
        "graphconv": GraphConv(width, 4, allow_zero_in_degree=True, k=k),
        "gin_sum": GINConv(nn.Linear(width, 4), "sum", k=k),
        "gin_mean": GINConv(nn.Linear(width, 4), "mean", k=k),
    }
    if k is None:  # the aggregators that run DGL's own code
        out.update({
            "sage_pool": SAGEConv(width, 4, "pool"),
            "sage_lstm": SAGEConv(width, 4, "lstm"),
            "gin_max": GINConv(nn.Linear(width, 4), "max"),
        })
    return out


LAYER_NAMES = tuple(layers()) + tuple(f"{n}+k" for n in layers(k=2))


def layer(name, width=6):
    if name.endswith("+k"):
        return layers(width, k=2)[name[:-2]]
    return layers(width)[name]


def raises(exc, match, fn):
    with pytest.raises(exc) as info:
        fn()
    assert re.search(match, str(info.value)), f"message {str(info.value)!r} misses {match!r}"
    return info.value


# --------------------------------------------------------------------------- k

@pytest.mark.parametrize("k", (0, -1, 7, 2.0, 2.5, "3", True, None))
def test_maxk_bad_k(k):
    raises(ValueError, r"\bk\b", lambda: maxk(torch.randn(4, 6), k))


@pytest.mark.parametrize("k", (0, -3, 2.0, "2", True, False))
def test_layer_bad_k_at_construction(k):
    for build in (lambda: SAGEConv(6, 4, "mean", k=k), lambda: SAGEConv(6, 4, "gcn", k=k),
                  lambda: GraphConv(6, 4, k=k), lambda: GINConv(None, "sum", k=k)):
        raises(ValueError, r"\bk\b", build)


def test_layer_k_above_width():
    raises(ValueError, r"k = 7.*in_feats = 6", lambda: SAGEConv(6, 4, "mean", k=7))
    raises(ValueError, r"k = 7.*in_feats = 6", lambda: GraphConv(6, 4, k=7))
    # GINConv knows its input width before forward only from a Linear apply_func; else k is
    # checked against the data
    raises(ValueError, r"k = 7.*apply_func\.in_features = 6",
           lambda: GINConv(torch.nn.Linear(6, 4), "sum", k=7))
    GINConv(torch.nn.Linear(6, 4), "sum", k=6)
    g = dgl.add_self_loop(dgl.rand_graph(5, 10))
    raises(ValueError, r"k.*\[1, d = 6\]", lambda: GINConv(None, "sum", k=7)(g, torch.randn(5, 6)))


@pytest.mark.parametrize("agg", ("pool", "lstm"))
def test_sage_pool_lstm_reject_k(agg):
    raises(ValueError, agg, lambda: SAGEConv(6, 4, agg, k=2))
    assert SAGEConv(6, 4, agg, k=None).k is None


def test_gin_max_rejects_k():
    raises(ValueError, "'max'", lambda: GINConv(None, "max", k=2))
    assert GINConv(None, "max", k=None).k is None


# --------------------------------------------------------------------------- rows

@pytest.mark.parametrize("name", LAYER_NAMES)
def test_feature_rows_mismatch(name, h):
    g = h.make_graph("self_loops", 10)
    conv = layer(name)
    with pytest.raises(DGLError, match="11 rows"):  # what DGL's layers raise there
        conv(g, torch.randn(11, 6))
    raises(ValueError, r"11 rows.*10 source nodes", lambda: conv(g, torch.randn(11, 6)))
    raises(ValueError, r"9 rows.*10 source nodes", lambda: conv(g, torch.randn(9, 6)))
    raises(ValueError, r"source features have 8 rows.*10 source nodes",
           lambda: conv(g, (torch.randn(8, 6), torch.randn(10, 6))))
    raises(ValueError, r"destination features have 7 rows.*10 destination nodes",
           lambda: conv(g, (torch.randn(10, 6), torch.randn(7, 6))))


def test_sage_gcn_pair_of_different_widths_is_dgls_error(h):
    g = h.make_graph("bipartite")
    conv = SAGEConv((4, 6), 2, "gcn")
    with pytest.raises(DGLError, match="same width"):
        conv(g, (torch.randn(g.num_src_nodes(), 4), torch.randn(g.num_dst_nodes(), 6)))


# (not the aggregators that run DGL's own code: it must not run on blocks in this environment)
@pytest.mark.parametrize("name", [n for n in LAYER_NAMES
                                  if n not in ("sage_pool", "sage_lstm", "gin_max")])
def test_feature_rows_mismatch_on_blocks(name, h):
    block = h.make_graph("block", 30)
    ns, nd = block.num_src_nodes(), block.num_dst_nodes()
    conv = layer(name)
    raises(ValueError, rf"{nd} rows.*{ns} source nodes", lambda: conv(block, torch.randn(nd, 6)))
    raises(ValueError, rf"destination features have {ns} rows.*{nd} destination nodes",
           lambda: conv(block, (torch.randn(ns, 6), torch.randn(ns, 6))))


def test_operator_rows_mismatch(h):
    g = h.make_graph("block", 30)
    ns = g.num_src_nodes()
    x, _ = h.random_cbsr(ns + 1, 8, 2)
    raises(ValueError, rf"{ns + 1} rows.*{ns} source nodes", lambda: cbsr_spgemm(g, x))
    raises(ValueError, rf"{ns - 1} rows.*{ns} source nodes",
           lambda: spmm(g, torch.randn(ns - 1, 3)))


# (GINConv has no input width of its own: its apply_func decides)
@pytest.mark.parametrize("name", [n for n in LAYER_NAMES if not n.startswith("gin")])
def test_feature_width_mismatch(name, h):
    g = h.make_graph("self_loops", 10)
    conv = layer(name)
    raises(ValueError, r"width 5.*expects 6", lambda: conv(g, torch.randn(10, 5)))


# --------------------------------------------------------------------------- dtype, NaN

@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.bool, torch.uint8))
def test_non_float_features(dtype, h):
    g = h.make_graph("self_loops", 10)
    x = torch.ones(10, 6, dtype=dtype)
    for name in LAYER_NAMES:
        raises(ValueError, rf"floating point.*{dtype}", lambda: layer(name)(g, x))
    raises(ValueError, "floating point", lambda: maxk(x, 2))
    raises(ValueError, "floating point", lambda: spmm(g, x))


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_nan_in_features_says_where(name, h):
    g = h.make_graph("self_loops", 10)
    x = torch.randn(10, 6)
    r, c = int(torch.randint(10, ())), int(torch.randint(6, ()))
    x[r, c] = float("nan")
    raises(ValueError, rf"NaN.*first at index \({r}, {c}\)", lambda: layer(name)(g, x))
    if r < 9:
        x[9, 0] = float("nan")  # the first NaN is still reported first, and the count is 2
        raises(ValueError, rf"2 NaN.*\({r}, {c}\)", lambda: layer(name)(g, x))
    if not name.startswith("graphconv"):  # GraphConv never reads destination features
        pair = (torch.randn(10, 6), x)
        raises(ValueError, r"destination features.*NaN", lambda: layer(name)(g, pair))


def test_nan_in_operator_inputs(h):
    g = h.make_graph("random", 10)
    x = torch.randn(10, 6)
    x[3, 4] = float("nan")
    raises(ValueError, r"maxk input.*NaN.*\(3, 4\)", lambda: maxk(x, 2))
    raises(ValueError, r"NaN.*\(3, 4\)", lambda: spmm(g, x))
    c, _ = h.random_cbsr(10, 6, 2)
    values = c.values.clone()
    values[7, 1] = float("nan")
    raises(ValueError, r"CBSR values.*NaN.*\(7, 1\)",
           lambda: cbsr_spgemm(g, c.with_values(values)))
    w = torch.rand(g.num_edges())
    w[5] = float("nan")
    raises(ValueError, r"edge_weight.*NaN.*\(5,\)", lambda: spmm(g, torch.randn(10, 6), w))


@requires_cuda
@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("name", [n for n in LAYER_NAMES if n.endswith("+k")] + ["maxk"])
def test_nan_found_by_the_topk_kernel_says_where(name, deferred, h):
    """On a GPU the top-k kernel finds the NaN of a MaxK layer's input as it reads it: the
    same count and first position as the CPU's scan, immediately or when the block ends."""
    g = h.make_graph("self_loops", 40)
    x = torch.randn(40, 6, device="cuda")
    r, c = int(torch.randint(39, ())), int(torch.randint(6, ()))
    x[r, c] = x[39, 0] = float("nan")
    if name == "maxk":
        call, label = (lambda: maxk(x, 2)), "maxk input"
    else:
        conv = layer(name).to("cuda")
        call, label = (lambda: conv(g, x)), "features"
    with pytest.raises(ValueError, match=rf"{label} contains 2 NaN.*first at index "
                                         rf"\({r}, {c}\)"):
        with dgl_maxk.deferred_checks() if deferred else contextlib.nullcontext():
            call()
    with dgl_maxk.deferred_checks():
        x[r, c] = x[39, 0] = 0.0
        call()  # clean input passes


def test_nan_check_can_be_turned_off(h, monkeypatch):
    g = h.make_graph("self_loops", 10)
    x = torch.randn(10, 6)
    x[0, 0] = float("nan")
    with dgl_maxk.input_checks(False):
        assert spmm(g, x).isnan().any()
    with pytest.raises(ValueError, match="NaN"):  # on again outside the block
        spmm(g, x)


@pytest.mark.parametrize("where", [(0, 0), (9, 5), (4, 2)])
def test_deferred_checks_report_the_first_nan_when_the_block_ends(h, where):
    g = h.make_graph("self_loops", 10)
    x = torch.randn(10, 6)
    x[where] = float("nan")
    x[9, 5] = float("nan")
    conv = SAGEConv(6, 3, "mean", k=2)
    reached_end = False
    with pytest.raises(ValueError, match=rf"features contains \d NaN.*first at index "
                                         rf"\({where[0]}, {where[1]}\)"):
        with dgl_maxk.deferred_checks():
            conv(g, torch.randn(10, 6)).sum().backward()  # clean input: nothing recorded
            conv(g, x).sum().backward()
            reached_end = True
    assert reached_end  # no sync, no raise inside the block


def test_deferred_checks_pass_clean_input_and_keep_other_errors(h):
    g = h.make_graph("self_loops", 10)
    with dgl_maxk.deferred_checks():
        spmm(g, torch.randn(10, 4))
        spmm(g, torch.randn(10, 0))
    x = torch.randn(10, 4)
    x[1, 1] = float("nan")
    with pytest.raises(KeyError):  # an error inside the block is not replaced by the scan's
        with dgl_maxk.deferred_checks():
            spmm(g, x)
            raise KeyError("mine")
    with dgl_maxk.deferred_checks(), dgl_maxk.input_checks(False):
        assert spmm(g, x).isnan().any()  # checks off: nothing recorded, nothing raised


# --------------------------------------------------------------------------- graphs

def two_edge_type_graph():
    return dgl.heterograph({
        ("user", "follows", "user"): (torch.tensor([0, 1]), torch.tensor([1, 2])),
        ("user", "likes", "item"): (torch.tensor([0, 2]), torch.tensor([0, 1])),
    })


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_heterogeneous_graph(name):
    g = two_edge_type_graph()
    raises(DGLError, r"one edge type.*has 2", lambda: layer(name)(g, torch.randn(3, 6)))


def test_heterogeneous_graph_operators(h):
    g = two_edge_type_graph()
    raises(DGLError, "one edge type", lambda: spmm(g, torch.randn(3, 6)))
    raises(DGLError, "one edge type", lambda: cbsr_spgemm(g, h.random_cbsr(3, 6, 2)[0]))
    raises(DGLError, "one edge type", lambda: graph_plan(g, "cpu"))


def test_not_a_graph():
    raises(DGLError, "DGLGraph", lambda: spmm("graph", torch.randn(3, 2)))
    raises(DGLError, "DGLGraph", lambda: SAGEConv(2, 2, "mean")(None, torch.randn(3, 2)))


# --------------------------------------------------------------------------- edge weights

@pytest.mark.parametrize("name", LAYER_NAMES)
@pytest.mark.parametrize("shape", ("short", "long", "two_columns", "matrix3d"))
def test_edge_weight_wrong_length(name, shape, h):
    g = h.make_graph("self_loops", 10)
    e = g.num_edges()
    w = {"short": torch.rand(e - 1), "long": torch.rand(e + 1),
         "two_columns": torch.rand(e, 2), "matrix3d": torch.rand(e, 1, 1)}[shape]
    raises(DGLError, rf"edge_weight.*one value per edge \({e}\).*{tuple(w.shape)}",
           lambda: layer(name)(g, torch.randn(10, 6), edge_weight=w))


def test_edge_weight_wrong_type_and_values(h):
    g = h.make_graph("self_loops", 10)
    x = torch.randn(10, 6)
    raises(ValueError, "edge_weight.*floating point",
           lambda: spmm(g, x, torch.ones(g.num_edges(), dtype=torch.int64)))
    raises(ValueError, "edge_weight.*torch.Tensor", lambda: spmm(g, x, [1.0] * g.num_edges()))
    raises(DGLError, "edge_weight", lambda: cbsr_spgemm(g, maxk(x, 2), torch.rand(3)))


def test_operator_bad_norm_and_dense_input(h):
    g = h.make_graph("self_loops", 10)
    raises(ValueError, "norm", lambda: spmm(g, torch.randn(10, 3), norm="mean"))
    for weight in (None, torch.rand(g.num_edges())):  # the unweighted one reads node scales
        raises(ValueError, "norm must be one of", lambda: cbsr_spgemm(
            g, maxk(torch.randn(10, 3), 2), weight, norm="mean"))
    raises(ValueError, "CBSR", lambda: cbsr_spgemm(g, torch.randn(10, 3)))
    raises(ValueError, r"N x d", lambda: maxk(torch.randn(10), 1))
    raises(ValueError, r"N x d", lambda: maxk(torch.randn(2, 3, 4), 1))


def test_bad_feature_containers(h):
    g = h.make_graph("self_loops", 10)
    conv = SAGEConv(6, 4, "mean")
    raises(ValueError, "torch.Tensor or CBSR", lambda: conv(g, [[0.0] * 6] * 10))
    raises(ValueError, "2 tensors", lambda: conv(g, (torch.randn(10, 6),) * 3))
    raises(ValueError, r"shape", lambda: conv(g, torch.randn(10)))


# --------------------------------------------------------------------------- devices

def test_graph_on_another_device_than_features(h):
    """A graph on a GPU with features elsewhere: DGL's CUDA builds make such graphs; this
    environment cannot, so the graph's device is mocked."""
    g = h.make_graph("self_loops", 10)
    conv = GraphConv(6, 4)
    with mock.patch.object(type(g), "device", new_callable=mock.PropertyMock,
                           return_value=torch.device("cuda", 1)):
        raises(DGLError, r"graph is on cuda:1 but the features are on cpu",
               lambda: conv(g, torch.randn(10, 6)))
        raises(DGLError, r"cuda:1.*cpu", lambda: spmm(g, torch.randn(10, 6)))


def test_meta_device_stands_in_for_a_second_device(h):
    """The meta device emulates features, edge weights and CBSR parts on unrelated devices."""
    g = h.make_graph("self_loops", 10)
    x = torch.randn(10, 6)
    w_meta = torch.rand(g.num_edges(), device="meta")
    raises(DGLError, r"edge_weight is on meta but the features are on cpu",
           lambda: spmm(g, x, w_meta))
    raises(DGLError, r"edge_weight is on meta",
           lambda: SAGEConv(6, 4, "mean")(g, x, edge_weight=w_meta))
    raises(DGLError, r"edge_weight is on meta",
           lambda: SAGEConv(6, 4, "pool")(g, x, edge_weight=w_meta))
    for name in LAYER_NAMES:
        raises(DGLError, r"source features on cpu but destination features on meta",
               lambda: layer(name)(g, (x, torch.randn(10, 6, device="meta"))))
    raises(ValueError, r"values on cpu but indices on meta",
           lambda: CBSR(torch.randn(10, 2), torch.zeros(10, 2, dtype=torch.uint8,
                                                        device="meta"), 6))


@requires_cuda
def test_unrelated_devices_on_a_gpu(h):
    g = h.make_graph("self_loops", 10)
    x = torch.randn(10, 6)
    w = torch.rand(g.num_edges())
    raises(DGLError, "edge_weight is on cuda", lambda: spmm(g, x, w.cuda()))
    for name in LAYER_NAMES:
        raises(DGLError, "source features on cpu but destination features on cuda",
               lambda: layer(name)(g, (x, x.cuda())))
    raises(ValueError, "values on cpu but indices on cuda",
           lambda: CBSR(torch.randn(10, 2), torch.zeros(10, 2, dtype=torch.uint8).cuda(), 6))
    # a graph on the CPU with features (and edge weights on either side) on the GPU is fine
    conv = SAGEConv(6, 4, "mean").cuda()
    assert conv(g, x.cuda(), edge_weight=w).is_cuda
    assert conv(g, x.cuda(), edge_weight=w.cuda()).is_cuda


def test_spmm_of_a_0d_tensor_is_a_clear_error(h):
    with pytest.raises(ValueError, match="0-d tensor"):
        spmm(h.make_graph("self_loops", 10), torch.tensor(1.0))


def test_plan_on_another_device_than_the_features(h):
    plan = graph_plan(h.make_graph("self_loops", 10), "cpu")
    features = torch.empty(10, 4, device="meta")  # any device other than the plan's
    with pytest.raises(DGLError, match="graph plan is on cpu but the features are on meta"):
        spmm(plan, features, check_nan=False)

