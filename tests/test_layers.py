"""Drop-in layers: parity with DGL's (k=None), MaxK semantics (k set), blocks, zero in-degree.

Stock DGL layers are only ever run on full graphs here (in this environment DGL's C++ can
crash on blocks): a block result of ours is compared with the stock layer's full-graph result
at the seed nodes, the block being ``to_block(in_subgraph(g, seeds), seeds)`` so that every
in-edge of a seed is present.
"""
import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from dgl_maxk import CBSR, maxk
from dgl_maxk._dgl import DGLError, dgl
from dgl_maxk.nn import GINConv, GraphConv, SAGEConv

# float64 sums in DGL's order and in ours: 1e-10 absolute, and a few hundred ulps relative for
# the large second derivatives (about 4e5 here, where one ulp is 6e-11)
F64 = dict(rtol=1e-13, atol=1e-10)
STOCK = {"SAGEConv": dgl.nn.SAGEConv, "GraphConv": dgl.nn.GraphConv,
         "GINConv": dgl.nn.GINConv}
OURS = {"SAGEConv": SAGEConv, "GraphConv": GraphConv, "GINConv": GINConv}


def close(actual, expected, what=""):
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, **F64, msg=lambda m: f"{what}\n{m}")


def perturb(module):
    """Move every parameter away from its (possibly zero) initial value."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def twins(name, *args, direction="dgl->ours", **kwargs):
    """A stock DGL layer and ours with the same weights (float64), loaded one way."""
    stock = STOCK[name](*args, **kwargs).double()
    ours = OURS[name](*args, **kwargs).double()
    assert ours.k is None
    assert set(stock.state_dict()) == set(ours.state_dict())
    if direction == "dgl->ours":
        ours.load_state_dict(perturb(stock).state_dict())
    else:
        stock.load_state_dict(perturb(ours).state_dict())
    return stock, ours


def leaves(feat):
    return list(feat) if isinstance(feat, tuple) else [feat]


def clone_feat(feat):
    if isinstance(feat, tuple):
        return tuple(t.detach().clone().requires_grad_() for t in feat)
    return feat.detach().clone().requires_grad_()


def compare_runs(stock_fn, ours_fn, stock_params, ours_params, feat, what,
                 stock_feat_fn=None, rows=None):
    """Run both (each on its own copy of the features), compare outputs and gradients of the
    features and of the parameters. ``rows`` selects the stock output rows (blocks);
    ``stock_feat_fn`` maps features before the stock layer (MaxK's dense definition)."""
    fs, fo = clone_feat(feat), clone_feat(feat)
    ys = stock_fn(stock_feat_fn(fs) if stock_feat_fn else fs)
    yo = ours_fn(fo)
    if rows is not None:
        ys = ys[rows]
    close(yo, ys, f"{what}: output")
    dy = torch.randn_like(ys)
    inputs_s = leaves(fs) + list(stock_params)
    inputs_o = leaves(fo) + list(ours_params)
    gs = torch.autograd.grad(ys, inputs_s, dy, allow_unused=True)
    go = torch.autograd.grad(yo, inputs_o, dy, allow_unused=True)
    for i, (a, b) in enumerate(zip(go, gs)):
        if b is None:
            assert a is None or not a.any(), f"{what}: gradient {i}"
        else:
            assert a is not None, f"{what}: gradient {i} missing"
            close(a, b, f"{what}: gradient {i}")


def named_params(module):
    return [p for _, p in sorted(module.named_parameters())]


def feats(g, width, tuple_input=False, dst_width=None):
    x = torch.randn(g.num_src_nodes(), width, dtype=torch.float64)
    if not tuple_input:
        return x
    return x, torch.randn(g.num_dst_nodes(), dst_width or width, dtype=torch.float64)


def graph_with_empty_rows(h, n=30):
    return h.graph_with_zero_in_degree(n, 3 * n, 5)[0]


def seeded_block(h, g, count=10):
    return h.block_of(g, h.random_seeds(g.num_nodes(), count))


# --------------------------------------------------------------------------- SAGEConv, k=None

@pytest.mark.parametrize("tuple_input", (False, True), ids=("single", "pair"))
@pytest.mark.parametrize("weighted", (False, True), ids=("unweighted", "weighted"))
@pytest.mark.parametrize("in_out", ((6, 3), (3, 6)), ids=("in>out", "in<out"))
@pytest.mark.parametrize("agg", ("mean", "gcn", "pool", "lstm"))
def test_sage_parity(agg, in_out, weighted, tuple_input, h):
    # A pair goes with a bipartite graph (see test_sage_gcn_pair_on_homograph for why)
    g = h.make_graph("bipartite") if tuple_input else graph_with_empty_rows(h)
    stock, ours = twins("SAGEConv", *in_out, agg)
    w = h.positive_edge_weight(g) if weighted else None
    compare_runs(lambda f: stock(g, f, edge_weight=w), lambda f: ours(g, f, edge_weight=w),
                 named_params(stock), named_params(ours), feats(g, in_out[0], tuple_input),
                 f"SAGE {agg} {in_out}")


@pytest.mark.parametrize("agg", ("mean", "gcn", "pool", "lstm"))
def test_sage_parity_options_and_state_dict_from_ours(agg, h):
    """norm, activation, bias=False; weights loaded from our layer into DGL's."""
    g = h.make_graph("self_loops", 25)
    stock, ours = twins("SAGEConv", 5, 4, agg, bias=False, norm=nn.LayerNorm(4),
                        activation=torch.tanh, direction="ours->dgl")
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, f), named_params(stock),
                 named_params(ours), feats(g, 5), f"SAGE {agg} options")


@pytest.mark.parametrize("k", (None, 2))
@pytest.mark.parametrize("in_out", ((6, 3), (3, 6)), ids=("in>out", "in<out"))
def test_sage_gcn_pair_on_homograph(in_out, k, h):
    """A (src, dst) pair on a one-node-type graph: ours aggregates the source features,
    ((A x_src) + x_dst) / (in-degree + 1). DGL 2.1's 'gcn' writes fc(x_dst) into the node
    frame that a homogeneous graph shares between src and dst, and so aggregates x_dst
    instead: a DGL quirk that dgl_maxk does not reproduce (the parity tests use bipartite
    graphs for pairs)."""
    g = graph_with_empty_rows(h)
    conv = perturb(SAGEConv(*in_out, "gcn", k=k).double())
    xs, xd = feats(g, in_out[0], True)
    y = conv(g, (xs, xd))
    if k is not None:
        xs, xd = maxk(xs, k).to_dense(), maxk(xd, k).to_dense()
    a = h.dense_adjacency(g)
    with torch.no_grad():
        expected = conv.fc_neigh((a @ xs + xd) / (a.sum(1, keepdim=True) + 1)) + conv.bias
    close(y, expected)


@pytest.mark.parametrize("in_feats", ((4, 6), (6, 4)))
def test_sage_mean_bipartite_different_widths(in_feats, h):
    g = h.make_graph("bipartite")
    stock, ours = twins("SAGEConv", in_feats, 5, "mean")
    w = h.positive_edge_weight(g)
    compare_runs(lambda f: stock(g, f, edge_weight=w), lambda f: ours(g, f, edge_weight=w),
                 named_params(stock), named_params(ours),
                 feats(g, in_feats[0], True, in_feats[1]), "SAGE bipartite")


def test_sage_mean_trailing_dimensions(h):
    g = h.make_graph("random", 20)
    stock, ours = twins("SAGEConv", 4, 3, "mean")
    x = torch.randn(20, 2, 4, dtype=torch.float64)
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, f), named_params(stock),
                 named_params(ours), x, "SAGE 3-d input")


@pytest.mark.parametrize("tuple_input", (False, True), ids=("single", "pair"))
@pytest.mark.parametrize("in_out", ((6, 3), (3, 6)), ids=("in>out", "in<out"))
@pytest.mark.parametrize("agg", ("mean", "gcn"))
def test_sage_block_matches_full_graph_at_seeds(agg, in_out, tuple_input, h):
    g = graph_with_empty_rows(h, 40)  # some seeds may have no in-edge
    block, src, dst, eids = seeded_block(h, g, 12)
    stock, ours = twins("SAGEConv", *in_out, agg)
    x = torch.randn(g.num_nodes(), in_out[0], dtype=torch.float64)
    w = h.positive_edge_weight(g)
    assert torch.equal(src[:block.num_dst_nodes()], dst)  # DGL blocks list seeds first

    # ours sees the block's source features (as one tensor or as the pair (src, src[:dst]));
    # stock sees them scattered back into the full graph's features (differentiably)
    def ours_fn(f):
        feat = (f, f[:block.num_dst_nodes()]) if tuple_input else f
        return ours(block, feat, edge_weight=w[eids])

    compare_runs(lambda f: stock(g, f, edge_weight=w), ours_fn, named_params(stock),
                 named_params(ours), x[src], f"SAGE block {agg}",
                 stock_feat_fn=lambda f: x.clone().index_put((src,), f), rows=dst)


# --------------------------------------------------------------------------- GraphConv, k=None

@pytest.mark.parametrize("weighted", (False, True), ids=("unweighted", "weighted"))
@pytest.mark.parametrize("in_out", ((6, 3), (3, 6)), ids=("in>out", "in<out"))
@pytest.mark.parametrize("weight", ("own", "none", "external"))
@pytest.mark.parametrize("norm", ("none", "left", "right", "both"))
def test_graphconv_parity(norm, weight, in_out, weighted, h):
    g = graph_with_empty_rows(h)
    if weight == "none":
        in_out = (in_out[0], in_out[0])  # no projection: the output (and bias) is in_feats wide
    stock, ours = twins("GraphConv", *in_out, norm=norm, weight=weight == "own",
                        allow_zero_in_degree=True)
    w = h.positive_edge_weight(g) if weighted else None
    ext = torch.randn(*in_out, dtype=torch.float64, requires_grad=True) \
        if weight == "external" else None
    compare_runs(lambda f: stock(g, f, weight=ext, edge_weight=w),
                 lambda f: ours(g, f, weight=ext, edge_weight=w),
                 named_params(stock) + ([ext] if ext is not None else []),
                 named_params(ours) + ([ext] if ext is not None else []),
                 feats(g, in_out[0]), f"GraphConv {norm} {weight}")


@pytest.mark.parametrize("norm", ("none", "left", "right", "both"))
def test_graphconv_parity_options_pair_and_state_dict_from_ours(norm, h):
    """bias=False, activation, a (src, dst) pair on a bipartite graph, 3-d features; weights
    loaded from our layer into DGL's."""
    g = h.make_graph("bipartite")
    stock, ours = twins("GraphConv", 5, 3, norm=norm, bias=False, activation=torch.tanh,
                        allow_zero_in_degree=True, direction="ours->dgl")
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, f), named_params(stock),
                 named_params(ours), feats(g, 5, True, 2), f"GraphConv pair {norm}")
    g = h.make_graph("self_loops", 20)
    x = torch.randn(20, 2, 5, dtype=torch.float64)
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, f), named_params(stock),
                 named_params(ours), x, f"GraphConv 3-d {norm}")


@pytest.mark.parametrize("in_out", ((6, 3), (3, 6)), ids=("in>out", "in<out"))
@pytest.mark.parametrize("norm", ("none", "right"))
def test_graphconv_block_matches_full_graph_at_seeds(norm, in_out, h):
    g = dgl.add_self_loop(h.random_graph(40, 120))
    block, src, dst, eids = seeded_block(h, g, 12)
    stock, ours = twins("GraphConv", *in_out, norm=norm)
    x = torch.randn(40, in_out[0], dtype=torch.float64)
    w = h.positive_edge_weight(g)
    compare_runs(lambda f: stock(g, f, edge_weight=w),
                 lambda f: ours(block, f, edge_weight=w[eids]),
                 named_params(stock), named_params(ours), x[src], f"GraphConv block {norm}",
                 stock_feat_fn=lambda f: x.clone().index_put((src,), f), rows=dst)


def test_graphconv_block_left_norm_uses_block_out_degrees(h):
    """'left'/'both' on a block normalise by the block's out-degrees (as DGL does)."""
    g = dgl.add_self_loop(h.random_graph(30, 90))
    block, src, dst, eids = seeded_block(h, g, 8)
    x = torch.randn(block.num_src_nodes(), 4, dtype=torch.float64)
    for norm in ("left", "both"):
        conv = GraphConv(4, 4, norm=norm, weight=False, bias=False)
        close(conv(block, x), h.dense_adjacency(block, norm) @ x, norm)


def test_graphconv_external_weight_with_own_weight_raises(h):
    g = h.make_graph("self_loops", 10)
    ours = GraphConv(4, 3)
    stock = dgl.nn.GraphConv(4, 3)
    x, ext = torch.randn(10, 4), torch.randn(4, 3)
    with pytest.raises(DGLError) as expected:
        stock(g, x, weight=ext)
    with pytest.raises(DGLError) as got:
        ours(g, x, weight=ext)
    assert str(got.value) == str(expected.value)


# --------------------------------------------------------------------------- GINConv, k=None

@pytest.mark.parametrize("weighted", (False, True), ids=("unweighted", "weighted"))
@pytest.mark.parametrize("learn_eps", (False, True))
@pytest.mark.parametrize("apply_func", (False, True), ids=("no_func", "linear"))
@pytest.mark.parametrize("agg", ("sum", "mean", "max"))
def test_gin_parity(agg, apply_func, learn_eps, weighted, h):
    g = graph_with_empty_rows(h)
    func = nn.Linear(5, 3) if apply_func else None
    stock, ours = twins("GINConv", func, agg, init_eps=0.3, learn_eps=learn_eps,
                        activation=torch.tanh)
    w = h.positive_edge_weight(g) if weighted else None
    compare_runs(lambda f: stock(g, f, edge_weight=w), lambda f: ours(g, f, edge_weight=w),
                 named_params(stock), named_params(ours), feats(g, 5),
                 f"GIN {agg} {apply_func} {learn_eps}")


@pytest.mark.parametrize("apply_func", (False, True), ids=("no_func", "tanh"))
@pytest.mark.parametrize("agg", ("sum", "mean", "max"))
def test_gin_takes_one_dimensional_features_as_dgl(agg, apply_func, h):
    """DGL's GINConv takes (N,) features as one column and returns (N,) rows."""
    g = graph_with_empty_rows(h)
    stock, ours = twins("GINConv", nn.Tanh() if apply_func else None, agg, learn_eps=True)
    x = torch.randn(g.num_nodes(), dtype=torch.float64)
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, f), named_params(stock),
                 named_params(ours), x, f"GIN {agg} on 1-D features")


@pytest.mark.parametrize("agg", ("sum", "mean"))
def test_gin_one_dimensional_features_with_k(agg, h):
    """k = 1 keeps 1-D features' one column (the layer's output as with k=None); a larger
    k says the features are 1-D, not only that k exceeds width 1."""
    g = graph_with_empty_rows(h)
    x = torch.randn(g.num_nodes(), dtype=torch.float64)
    torch.manual_seed(0)
    with_k = GINConv(None, agg, k=1)
    torch.manual_seed(0)
    plain = GINConv(None, agg)
    assert torch.allclose(with_k(g, x), plain(g, x))
    with pytest.raises(ValueError, match=r"k = 2 exceeds the input width: 1-D features"):
        GINConv(None, agg, k=2)(g, x)


@pytest.mark.parametrize("agg", ("sum", "mean", "max"))
def test_gin_parity_pair_and_state_dict_from_ours(agg, h):
    g = h.make_graph("bipartite")
    stock, ours = twins("GINConv", nn.Linear(4, 2), agg, learn_eps=True,
                        direction="ours->dgl")
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, f), named_params(stock),
                 named_params(ours), feats(g, 4, True), f"GIN pair {agg}")


@pytest.mark.parametrize("agg", ("sum", "mean"))
def test_gin_block_matches_full_graph_at_seeds(agg, h):
    g = graph_with_empty_rows(h, 40)
    block, src, dst, eids = seeded_block(h, g, 12)
    stock, ours = twins("GINConv", nn.Linear(5, 3), agg, init_eps=0.2, learn_eps=True)
    x = torch.randn(40, 5, dtype=torch.float64)
    w = h.positive_edge_weight(g)
    compare_runs(lambda f: stock(g, f, edge_weight=w),
                 lambda f: ours(block, f, edge_weight=w[eids]),
                 named_params(stock), named_params(ours), x[src], f"GIN block {agg}",
                 stock_feat_fn=lambda f: x.clone().index_put((src,), f), rows=dst)


# --------------------------------------------------------------------------- common

@pytest.mark.parametrize("name, args, kwargs", [
    ("SAGEConv", (6, 4, "mean"), {}), ("SAGEConv", (6, 4, "gcn"), {}),
    ("SAGEConv", (6, 4, "pool"), {}), ("SAGEConv", (6, 4, "lstm"), {}),
    ("GraphConv", (6, 4), {}), ("GINConv", (nn.Linear(6, 4), "sum"), {"learn_eps": True, "init_eps": 0.25}),
])
def test_reset_parameters(name, args, kwargs, h):
    ours = OURS[name](*args, **kwargs)
    stock = STOCK[name](*args, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in stock.named_parameters()]
    eps = {n: p.clone() for n, p in ours.named_parameters() if n == "eps"}
    with torch.no_grad():
        for p in ours.parameters():
            p.fill_(7.0)
    ours.reset_parameters()
    weights = [p for n, p in ours.named_parameters() if n.endswith("weight") or "weight_" in n]
    assert weights, name
    for p in weights:
        assert not (p == 7.0).any(), "reset_parameters must reinitialise every weight"
        assert p.abs().max() < 2, "weights are Glorot-initialised"
    for n, p in ours.named_parameters():
        if n in eps:
            assert torch.equal(p, eps[n]), "eps goes back to init_eps"
    g = h.make_graph("self_loops", 10)
    assert torch.isfinite(ours(g, torch.randn(10, 6))).all()


def test_repr_mentions_k():
    assert "k=4" in repr(SAGEConv(8, 8, "mean", k=4))
    assert "k=4" in repr(GraphConv(8, 8, k=4))
    assert "k=4" in repr(GINConv(None, "sum", k=4))


@pytest.mark.parametrize("name, args", [("GraphConv", (4, 3)), ("SAGEConv", (4, 3, "mean")),
                                         ("GINConv", (None, "sum"))])
def test_second_derivatives_through_edge_weights_on_a_multigraph(name, args, h):
    """Gradient penalties and meta-learning differentiate the gradient: each of a multigraph's
    repeated edges keeps its own second derivative, as in DGL."""
    g = dgl.add_self_loop(h.random_graph(12, 40))
    g = dgl.add_edges(g, *g.edges())  # every edge twice
    stock, ours = twins(name, *args)
    x = torch.randn(12, 4, dtype=torch.float64)
    w = torch.rand(g.num_edges(), dtype=torch.float64) + 0.5
    grads = []
    for layer in (stock, ours):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        gx, = torch.autograd.grad(layer(g, xi, edge_weight=wi).pow(2).sum(), xi,
                                  create_graph=True)
        grads.append(torch.autograd.grad(gx.pow(2).sum(), (xi, wi)))
    for a, b, what in zip(grads[1], grads[0], ("x", "edge_weight")):
        close(a, b, f"{name} second derivative of {what}")


# --------------------------------------------------------------------------- k set

def maxk_dense(k):
    def f(feat):
        if isinstance(feat, tuple):
            return tuple(maxk(t, k).to_dense() for t in feat)
        return maxk(feat, k).to_dense()
    return f


@pytest.mark.parametrize("tuple_input", (False, True), ids=("single", "pair"))
@pytest.mark.parametrize("weighted", (False, True), ids=("unweighted", "weighted"))
@pytest.mark.parametrize("in_out", ((12, 5), (5, 12)), ids=("in>out", "in<out"))
@pytest.mark.parametrize("agg", ("mean", "gcn"))
def test_sage_with_k_is_stock_on_maxk_input(agg, in_out, weighted, tuple_input, h):
    g = h.make_graph("bipartite") if tuple_input else graph_with_empty_rows(h)
    k = 3
    stock = perturb(dgl.nn.SAGEConv(*in_out, agg).double())
    ours = SAGEConv(*in_out, agg, k=k).double()
    ours.load_state_dict(stock.state_dict())
    assert ours.k == k
    w = h.positive_edge_weight(g) if weighted else None
    compare_runs(lambda f: stock(g, f, edge_weight=w), lambda f: ours(g, f, edge_weight=w),
                 named_params(stock), named_params(ours), feats(g, in_out[0], tuple_input),
                 f"SAGE {agg} k", stock_feat_fn=maxk_dense(k))


class ScaledLinear(torch.nn.Module):
    """A wrapper such as adapters use: the layer must call it, not read its weight."""

    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return 0.5 * self.linear(x)


def hook_scaling_output(module, calls):
    module.register_forward_hook(lambda m, inputs, out: calls.append(m) or 3 * out)


@pytest.mark.parametrize("change", ("hooks", "prune", "wrap"))
@pytest.mark.parametrize("cbsr_input", (False, True), ids=("k", "cbsr_input"))
def test_sage_mean_calls_its_linears_when_they_are_not_plain(change, cbsr_input, h):
    """Hooks on fc_self / fc_neigh, pruning and wrapped modules act as in DGL's layer (the
    fused GEMM on their weights is taken only when nobody could tell)."""
    g = graph_with_empty_rows(h)
    k = 3
    layers = [perturb(dgl.nn.SAGEConv(12, 5, "mean").double())]
    layers.append(SAGEConv(12, 5, "mean", k=None if cbsr_input else k).double())
    layers[1].load_state_dict(layers[0].state_dict())
    calls = []
    for layer in layers:
        if change == "hooks":
            calls.append([])
            hook_scaling_output(layer.fc_neigh, calls[-1])
            hook_scaling_output(layer.fc_self, calls[-1])
        elif change == "prune":
            prune.l1_unstructured(layer.fc_neigh, "weight", amount=0.5)
        else:
            layer.fc_self = ScaledLinear(layer.fc_self)
    stock, ours = layers
    ours_input = (lambda f: maxk(f, k)) if cbsr_input else (lambda f: f)
    compare_runs(lambda f: stock(g, f), lambda f: ours(g, ours_input(f)), named_params(stock),
                 named_params(ours), feats(g, 12), f"SAGE mean {change}",
                 stock_feat_fn=maxk_dense(k))
    if change == "hooks":
        assert len(calls[0]) == len(calls[1]) == 2
    if change == "prune":  # a second step through the pruned weight, as in training
        compare_runs(lambda f: stock(g, f), lambda f: ours(g, ours_input(f)),
                     named_params(stock), named_params(ours), feats(g, 12), "pruned again",
                     stock_feat_fn=maxk_dense(k))


@pytest.mark.parametrize("weighted", (False, True), ids=("unweighted", "weighted"))
@pytest.mark.parametrize("in_out", ((12, 5), (5, 12)), ids=("in>out", "in<out"))
@pytest.mark.parametrize("weight", (True, False))
@pytest.mark.parametrize("norm", ("none", "left", "right", "both"))
def test_graphconv_with_k_is_stock_on_maxk_input(norm, weight, in_out, weighted, h):
    g = h.make_graph("self_loops", 30)
    if not weight:
        in_out = (in_out[0], in_out[0])
    k = 4
    stock = perturb(dgl.nn.GraphConv(*in_out, norm=norm, weight=weight).double())
    ours = GraphConv(*in_out, norm=norm, weight=weight, k=k).double()
    ours.load_state_dict(stock.state_dict())
    w = h.positive_edge_weight(g) if weighted else None
    compare_runs(lambda f: stock(g, f, edge_weight=w), lambda f: ours(g, f, edge_weight=w),
                 named_params(stock), named_params(ours), feats(g, in_out[0]),
                 f"GraphConv {norm} k", stock_feat_fn=maxk_dense(k))


@pytest.mark.parametrize("weighted", (False, True), ids=("unweighted", "weighted"))
@pytest.mark.parametrize("agg", ("sum", "mean"))
def test_gin_with_k_is_stock_on_maxk_input(agg, weighted, h):
    g = graph_with_empty_rows(h)
    k = 2
    stock = perturb(dgl.nn.GINConv(nn.Linear(7, 3), agg, init_eps=0.1, learn_eps=True)
                    .double())
    ours = GINConv(nn.Linear(7, 3), agg, init_eps=0.1, learn_eps=True, k=k).double()
    ours.load_state_dict(stock.state_dict())
    w = h.positive_edge_weight(g) if weighted else None
    compare_runs(lambda f: stock(g, f, edge_weight=w), lambda f: ours(g, f, edge_weight=w),
                 named_params(stock), named_params(ours), feats(g, 7), f"GIN {agg} k",
                 stock_feat_fn=maxk_dense(k))


@pytest.mark.parametrize("layer", ("sage_mean", "sage_gcn", "graphconv", "gin"))
def test_with_k_on_blocks(layer, h):
    g = dgl.add_self_loop(h.random_graph(40, 120))
    block, src, dst, eids = seeded_block(h, g, 12)
    k = 3
    if layer.startswith("sage"):
        stock = perturb(dgl.nn.SAGEConv(10, 4, layer[5:]).double())
        ours = SAGEConv(10, 4, layer[5:], k=k).double()
    elif layer == "graphconv":
        stock = perturb(dgl.nn.GraphConv(10, 4, norm="right").double())
        ours = GraphConv(10, 4, norm="right", k=k).double()
    else:
        stock = perturb(dgl.nn.GINConv(nn.Linear(10, 4), "sum", learn_eps=True).double())
        ours = GINConv(nn.Linear(10, 4), "sum", learn_eps=True, k=k).double()
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(40, 10, dtype=torch.float64)
    w = h.positive_edge_weight(g)
    compare_runs(lambda f: stock(g, f, edge_weight=w),
                 lambda f: ours(block, f, edge_weight=w[eids]),
                 named_params(stock), named_params(ours), x[src], f"{layer} block k",
                 stock_feat_fn=lambda f: maxk(x.clone().index_put((src,), f), k).to_dense(),
                 rows=dst)


@pytest.mark.parametrize("k", (None, 4))
def test_graphconv_never_reads_destination_features(k, h):
    """GraphConv, as DGL's, reads only source rows: a pair's destination features narrower
    than k, or holding NaN, change nothing (their rows and device are still checked)."""
    g = dgl.add_self_loop(h.random_graph(40, 120))
    block, src, dst, _ = seeded_block(h, g, 12)
    stock = perturb(dgl.nn.GraphConv(8, 3, norm="right").double())
    ours = GraphConv(8, 3, norm="right", k=k).double()
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(40, 8, dtype=torch.float64)
    narrow = torch.randn(len(dst), 3, dtype=torch.float64)
    narrow[int(torch.randint(len(dst), ())), 1] = float("nan")
    expected = stock(g, x if k is None else maxk(x, k).to_dense())[dst]
    close(ours(block, (x[src], narrow)), expected, f"GraphConv k={k} pair")
    with pytest.raises(DGLError, match="destination features have 11 rows"):
        ours(block, (x[src], narrow[:11]))

@pytest.mark.parametrize("layer", ("sage_mean", "sage_gcn", "graphconv", "gin"))
@pytest.mark.parametrize("layer_k", (None, 5))
def test_cbsr_input_is_used_as_is(layer, layer_k, h):
    """A CBSR input is aggregated as it is (no second MaxK, even with another k)."""
    g = h.make_graph("self_loops", 25)
    if layer.startswith("sage"):
        stock = perturb(dgl.nn.SAGEConv(10, 4, layer[5:]).double())
        ours = SAGEConv(10, 4, layer[5:], k=layer_k).double()
    elif layer == "graphconv":
        stock = perturb(dgl.nn.GraphConv(10, 4).double())
        ours = GraphConv(10, 4, k=layer_k).double()
    else:
        stock = perturb(dgl.nn.GINConv(nn.Linear(10, 4), "mean").double())
        ours = GINConv(nn.Linear(10, 4), "mean", k=layer_k).double()
    ours.load_state_dict(stock.state_dict())
    x, _ = h.random_cbsr(25, 10, 2, requires_grad=True)
    y = ours(g, x)
    close(y, stock(g, x.to_dense()), layer)
    # the gradient reaches the CBSR values, sampled at their pattern
    dy = torch.randn_like(y)
    (gv,) = torch.autograd.grad(y, x.values, dy)
    values = x.values.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(stock(g, CBSR(values, x.indices, 10).to_dense()),
                                      values, dy)
    close(gv, expected, f"{layer} CBSR gradient")


@pytest.mark.parametrize("layer", ("sage_mean", "sage_gcn", "graphconv"))
def test_sparse_aggregation_happens_before_projection(layer, h, monkeypatch):
    """The trap: with in_feats > out_feats and k set, DGL would project first; ours must
    aggregate the k-sparse (CBSR) input, at full width, before any projection."""
    import dgl_maxk.nn.graphconv as graphconv_module
    import dgl_maxk.nn.sageconv as sageconv_module
    module = graphconv_module if layer == "graphconv" else sageconv_module
    seen = []
    real = module.aggregate

    def spy(plan, x, *args, **kwargs):
        seen.append(x)
        return real(plan, x, *args, **kwargs)
    monkeypatch.setattr(module, "aggregate", spy)
    g = h.make_graph("self_loops", 20)
    conv = (GraphConv(16, 2, k=4) if layer == "graphconv"
            else SAGEConv(16, 2, layer[5:], k=4))
    conv(g, torch.randn(20, 16))
    assert seen, "the layer must aggregate through dgl_maxk.aggregate"
    for x in seen:
        assert isinstance(x, CBSR) and x.k == 4 and x.d == 16


@pytest.mark.parametrize("tuple_input", (False, True))
def test_sage_mean_with_k_keeps_the_destination_rows_sparse(tuple_input, h, monkeypatch):
    """SAGE 'mean' on CBSR destination rows runs its self GEMM on them as CBSR: no N x d
    dense copy of them (CBSR.to_dense) in the forward or the backward."""
    g = h.make_graph("self_loops", 20)
    conv = SAGEConv(16, 8, "mean", k=4)
    x = torch.randn(20, 16, requires_grad=True)
    feat = (x, x) if tuple_input else x

    def refuse(self):
        raise AssertionError("CBSR.to_dense called")
    monkeypatch.setattr(CBSR, "to_dense", refuse)
    conv(g, feat).sum().backward()
    assert x.grad is not None


def test_k_validation_at_construction():
    with pytest.raises(ValueError, match="k"):
        SAGEConv(8, 4, "mean", k=9)
    with pytest.raises(ValueError, match="k"):
        GraphConv(8, 4, k=9)
    assert SAGEConv(8, 4, "mean", k=8).k == 8
    assert GraphConv(8, 4, k=1).k == 1


# --------------------------------------------------------------------------- zero in-degree

def test_graphconv_zero_in_degree_error_is_dgls(h):
    g, empty = h.graph_with_zero_in_degree(20, 50, 3)
    x = torch.randn(20, 4)
    with pytest.raises(DGLError) as expected:
        dgl.nn.GraphConv(4, 3)(g, x)
    for conv in (GraphConv(4, 3), GraphConv(4, 3, k=2)):
        with pytest.raises(DGLError) as got:
            conv(g, x)
        assert str(got.value) == str(expected.value)
    assert "0-in-degree" in str(expected.value)
    # the same check on a block whose seeds include nodes without in-edges
    block = h.block_of(g, torch.cat([empty[:1], h.random_seeds(20, 5)]).unique())[0]
    with pytest.raises(DGLError, match="0-in-degree"):
        GraphConv(4, 3)(block, torch.randn(block.num_src_nodes(), 4))
    # and allowed when asked for: those rows get the bias only
    conv = GraphConv(4, 3, allow_zero_in_degree=True)
    with torch.no_grad():
        conv.bias.normal_()
    y = conv(g, x)
    close(y[empty], conv.bias.expand(len(empty), 3), "zero in-degree rows")


@pytest.mark.parametrize("agg", ("mean", "gcn"))
@pytest.mark.parametrize("k", (None, 2))
def test_sage_zero_in_degree_gives_zero_neighbour_part(agg, k, h):
    g, empty = h.graph_with_zero_in_degree(20, 50, 4)
    stock = perturb(dgl.nn.SAGEConv(5, 3, agg).double())
    ours = SAGEConv(5, 3, agg, k=k).double()
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(20, 5, dtype=torch.float64)
    xin = x if k is None else maxk(x, k).to_dense()
    y = ours(g, x)
    close(y, stock(g, xin), agg)
    with torch.no_grad():
        if agg == "mean":
            own = ours.fc_self(xin[empty])  # neighbour part 0
        else:
            own = ours.fc_neigh(xin[empty]) + ours.bias  # (0 + self) / (0 + 1)
    close(y[empty], own, "rows without in-edges")


# --------------------------------------------------------------------------- GPU

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (torch.cuda.is_available() is "
                                          "False)")


@requires_cuda
@pytest.mark.parametrize("layer", ("sage", "graphconv", "gin"))
@pytest.mark.parametrize("k", (None, 4))
def test_cuda_features_with_cpu_graph(layer, k, h):
    g = h.make_graph("block")
    conv = {"sage": lambda: SAGEConv(16, 8, "mean", k=k),
            "graphconv": lambda: GraphConv(16, 8, norm="right", k=k),
            "gin": lambda: GINConv(nn.Linear(16, 8), "sum", learn_eps=True, k=k)}[layer]()
    x = torch.randn(g.num_src_nodes(), 16)
    w = h.positive_edge_weight(g, dtype=torch.float32)
    y = conv(g, x, edge_weight=w)
    gpu = conv.cuda()
    yc = gpu(g, x.cuda(), edge_weight=w.cuda())
    assert yc.is_cuda
    torch.testing.assert_close(yc.cpu(), y, rtol=1e-5, atol=1e-5)
    yc.sum().backward()
    assert all(p.grad is not None and p.grad.is_cuda for p in gpu.parameters())


@pytest.mark.parametrize("k", (None, 4))
def test_float32_layers_match_stock(k, h):
    """The everyday case: float32, ~1e-5 relative agreement."""
    g = h.make_graph("self_loops", 60)
    x = torch.randn(60, 16)
    xin = x if k is None else maxk(x, k).to_dense()
    pairs = [(dgl.nn.SAGEConv(16, 8, "mean"), SAGEConv(16, 8, "mean", k=k)),
             (dgl.nn.SAGEConv(16, 8, "gcn"), SAGEConv(16, 8, "gcn", k=k)),
             (dgl.nn.GraphConv(16, 8), GraphConv(16, 8, k=k)),
             (dgl.nn.GINConv(nn.Linear(16, 8), "sum"), GINConv(nn.Linear(16, 8), "sum", k=k))]
    for stock, ours in pairs:
        ours.load_state_dict(perturb(stock).state_dict())
        y = ours(g, x)
        assert y.dtype == torch.float32
        torch.testing.assert_close(y, stock(g, xin), rtol=1e-5, atol=1e-5)
