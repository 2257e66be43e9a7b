"""What a user hits in the first week: inference mode before training, empty graphs and
blocks, half-precision models, construction-time errors, and infinite edge weights.

The layer tests run on the CPU (pure-torch path) and, where a GPU with CuPy is present, on
the GPU kernels too.
"""
import pytest
import torch

import dgl_maxk
from dgl_maxk import CBSR, maxk, spmm
from dgl_maxk._dgl import DGLError, dgl
from dgl_maxk.backends import cuda
from dgl_maxk.nn import GINConv, GraphConv, SAGEConv

DEVICES = ["cpu"] + (["cuda"] if cuda.available() else [])
LAYER_NAMES = ("SAGEConv", "GraphConv", "GINConv")


def make_layer(name, in_feats, out_feats, k):
    if name == "SAGEConv":
        return SAGEConv(in_feats, out_feats, "mean", k=k)
    if name == "GraphConv":
        return GraphConv(in_feats, out_feats, k=k, allow_zero_in_degree=True)
    return GINConv(torch.nn.Linear(in_feats, out_feats), "sum", learn_eps=True, k=k)


def stock_layer(name, in_feats, out_feats):
    if name == "SAGEConv":
        return dgl.nn.SAGEConv(in_feats, out_feats, "mean")
    if name == "GraphConv":
        return dgl.nn.GraphConv(in_feats, out_feats, allow_zero_in_degree=True)
    return dgl.nn.GINConv(torch.nn.Linear(in_feats, out_feats), "sum", learn_eps=True)


# --------------------------------------------------------------------------- inference mode

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [None, 8])
@pytest.mark.parametrize("name", LAYER_NAMES)
def test_graph_first_used_under_inference_mode_trains_afterwards(name, k, device):
    g = dgl.add_self_loop(dgl.rand_graph(30, 90))
    x = torch.randn(30, 16, device=device)
    c1 = make_layer(name, 16, 32, k).to(device)
    c2 = make_layer(name, 32, 3, k).to(device)

    def forward(edge_weight=None):
        return c2(g, torch.relu(c1(g, x)), edge_weight=edge_weight)

    with torch.inference_mode():
        expected = forward()
    out = forward()
    out.sum().backward()
    torch.testing.assert_close(out.detach(), expected.clone())
    assert all(p.grad is not None for p in c1.parameters())
    # an edge weight that requires grad, on a plan built under inference mode
    w = torch.rand(g.num_edges(), device=device, requires_grad=True)
    forward(w).sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


# --------------------------------------------------------------------------- empty graphs

def empty_cases():
    g0 = dgl.graph(([], []), num_nodes=0)
    g = dgl.add_self_loop(dgl.rand_graph(12, 30))
    block0 = dgl.to_block(g, torch.tensor([], dtype=torch.int64))  # 0 destination nodes
    return {"0-node graph": (g0, 0), "0-destination block": (block0, block0.num_src_nodes())}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [None, 4])
@pytest.mark.parametrize("name", LAYER_NAMES)
@pytest.mark.parametrize("case", ["0-node graph", "0-destination block"])
def test_empty_graphs_give_empty_outputs(case, name, k, device):
    graph, num_src = empty_cases()[case]
    layer = make_layer(name, 16, 5, k).to(device)
    x = torch.randn(num_src, 16, device=device, requires_grad=True)
    out = layer(graph, x)
    assert out.shape == (0, 5) and out.dtype == x.dtype
    out.sum().backward()  # the backward of an empty output works too
    if case == "0-node graph" and device == "cpu":  # stock DGL agrees (it runs on the CPU)
        assert stock_layer(name, 16, 5)(graph, x).shape == (0, 5)


@pytest.mark.parametrize("device", DEVICES)
def test_spmm_of_empty_graphs(device):
    for case, (graph, num_src) in empty_cases().items():
        for width in [(7,), (3, 2)]:
            x = torch.randn((num_src,) + width, device=device)
            assert spmm(graph, x).shape == (0,) + width, case


# --------------------------------------------------------------------------- half precision

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("k", [None, 4])
@pytest.mark.parametrize("name", LAYER_NAMES)
def test_half_precision_model_returns_its_dtype(name, k, dtype, device):
    """A model cast to half precision takes and returns half precision (as DGL's layers do),
    computing what the same model computes in fp32 up to half-precision rounding."""
    g = dgl.add_self_loop(dgl.rand_graph(40, 160))
    x = torch.randn(40, 16, device=device)
    layer = make_layer(name, 16, 8, k).to(device)
    with torch.no_grad():
        expected = layer(g, x.to(dtype).float())  # the same rounded input, in fp32
    half = make_layer(name, 16, 8, k).to(device)
    half.load_state_dict(layer.state_dict())
    half = half.to(dtype)
    xh = x.to(dtype).requires_grad_()
    out = half(g, xh)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert xh.grad.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dense_aggregation_returns_the_dtype_it_was_given(dtype):
    g = dgl.add_self_loop(dgl.rand_graph(20, 60))
    x = torch.randn(20, 6)
    y = spmm(g, x.to(dtype), norm="right")
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), spmm(g, x.to(dtype).float(), norm="right"),
                               rtol=1e-2, atol=1e-2)
    c = maxk(x.to(dtype), 3)
    assert dgl_maxk.cbsr_spgemm(g, c).dtype == dtype


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_half_features_into_fp32_layer_behave_as_in_dgl(name):
    """Half-precision features into an fp32 layer, outside autocast, as DGL's layers do:
    SAGEConv and GraphConv stop at the dtype mismatch of their linear map (no silent
    upcast); GINConv's (1 + eps) x, with eps an fp32 parameter, upcasts to fp32."""
    g = dgl.add_self_loop(dgl.rand_graph(20, 60))
    x = torch.randn(20, 16).to(torch.bfloat16)

    def outcome(layer):
        try:
            return layer(g, x).dtype
        except RuntimeError as err:
            assert "dtype" in str(err) or "type" in str(err), err
            return RuntimeError

    expected = {"SAGEConv": RuntimeError, "GraphConv": RuntimeError, "GINConv": torch.float32}
    assert outcome(make_layer(name, 16, 4, None)) == expected[name]
    assert outcome(stock_layer(name, 16, 4)) == expected[name]


# --------------------------------------------------------------------------- construction

def test_maxk_too_wide_for_a_destination_side_fails_at_construction():
    with pytest.raises(ValueError, match=r"k = 4 exceeds .*in_feats\[1\] = 3"):
        SAGEConv(in_feats=(16, 3), out_feats=8, aggregator_type="mean", k=4)
    SAGEConv(in_feats=(16, 4), out_feats=8, aggregator_type="mean", k=4)  # fits


@pytest.mark.parametrize("make", [lambda: SAGEConv(40000, 8, "mean", k=4),
                                  lambda: GraphConv(40000, 8, k=4)])
def test_width_beyond_cbsr_fails_at_construction(make):
    with pytest.raises(ValueError, match="32768"):
        make()


@pytest.mark.parametrize("d", ["8", 8.0, True, None])
def test_cbsr_width_must_be_an_integer(d):
    with pytest.raises(ValueError, match="width d must be an integer"):
        CBSR(torch.randn(3, 2), torch.zeros(3, 2, dtype=torch.uint8), d)


def test_install_takes_a_single_layer_name():
    try:
        dgl_maxk.install(k=4, layers="SAGEConv")
        assert dgl.nn.SAGEConv is SAGEConv
        assert dgl.nn.GraphConv is not GraphConv
    finally:
        dgl_maxk.uninstall()
    with pytest.raises(ValueError, match="no replacement for \\['SAGE'\\]"):
        dgl_maxk.install(k=4, layers="SAGE")


def test_maxk_keeps_minus_infinity_rows_as_documented():
    h = torch.randn(3, 6)
    h[1] = float("-inf")
    c = maxk(h, 2)
    assert torch.isinf(c.values[1]).all() and (c.values[1] < 0).all()


def test_installed_k_leaves_narrow_gin_inputs_and_model_convs_alone():
    """Under install(k): a GINConv whose input is at most k wide stays dense (as the other
    layers do at construction), and the paper's GCN/GIN keep their convolutions dense
    (the model applies MaxK or ReLU itself)."""
    from dgl_maxk.models import build_model
    g = dgl.add_self_loop(dgl.rand_graph(20, 60))
    x = torch.randn(20, 8)
    with dgl_maxk.installed(k=32):
        narrow = dgl.nn.GINConv(torch.nn.Linear(8, 4), "sum")
        dense_twin = GINConv(torch.nn.Linear(8, 4), "sum", k=None)
        dense_twin.load_state_dict(narrow.state_dict())
        torch.testing.assert_close(narrow(g, x), dense_twin(g, x))
        for name in ("gcn", "gin"):
            model = build_model(name, 8, 16, 3, 2, k=4, nonlinearity="relu")
            assert all(conv.k is None for conv in model.convs), name



# --------------------------------------------------------------------------- edge weights

EDGE_WEIGHT_LAYERS = {
    "SAGEConv mean": lambda k: SAGEConv(12, 4, "mean", k=k),
    "SAGEConv gcn": lambda k: SAGEConv(12, 4, "gcn", k=k),
    "SAGEConv pool": lambda k: SAGEConv(12, 4, "pool"),
    "SAGEConv lstm": lambda k: SAGEConv(12, 4, "lstm"),
    "GraphConv in>out": lambda k: GraphConv(12, 4, k=k),
    "GraphConv in<out": lambda k: GraphConv(12, 20, k=k),
    "GINConv sum": lambda k: GINConv(torch.nn.Linear(12, 4), "sum", k=k),
    "GINConv mean": lambda k: GINConv(torch.nn.Linear(12, 4), "mean", k=k),
    "GINConv max": lambda k: GINConv(torch.nn.Linear(12, 4), "max"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "deferred"])
@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("name", EDGE_WEIGHT_LAYERS)
def test_infinite_edge_weight_is_refused_with_its_position(name, k, deferred, device):
    """Aggregating before projecting would turn an infinite edge weight into NaN where DGL
    gives +-inf: every layer refuses it (k set or not), naming the first position, in the
    NaN scan of the edge weights (so deferred_checks defers it)."""
    if k is not None and name.endswith(("pool", "lstm", "max")):
        pytest.skip("MaxK does not apply to this aggregator")
    g = dgl.add_self_loop(dgl.rand_graph(15, 40))
    if device == "cuda" and name.endswith(("pool", "lstm", "max")):
        try:  # DGL's own aggregators need the graph on the features' device
            g = g.to(device)
        except DGLError:
            pytest.skip("this DGL build cannot hold a graph on the GPU, which DGL's own "
                        "aggregators (pool, lstm, max) need")
    layer = EDGE_WEIGHT_LAYERS[name](k).to(device)
    x = torch.randn(15, 12, device=device)
    first, second = sorted(torch.randperm(g.num_edges())[:2].tolist())
    for bad in (float("inf"), float("-inf"), float("nan")):
        w = torch.rand(g.num_edges(), 1, device=device)
        w[first] = bad
        w[second] = -bad
        pattern = rf"edge_weight contains 2 non-finite .* at index \({first}, 0\)"
        with pytest.raises(ValueError, match=pattern):
            if deferred:
                with dgl_maxk.deferred_checks():
                    layer(g, x, edge_weight=w)
            else:
                layer(g, x, edge_weight=w)
    layer(g, x, edge_weight=torch.rand(g.num_edges(), 1, device=device))  # finite: fine
