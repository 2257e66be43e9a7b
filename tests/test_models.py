"""The paper's models: they train with MaxK on the CPU, ReLU variants run, blocks work."""
import pytest
import torch
from torch.nn import functional as F

from dgl_maxk import CBSR
from dgl_maxk._dgl import dgl
from dgl_maxk.models import (MODELS, MaxKGCN, MaxKGIN, MaxKSAGE, OutputLinear,
                             aligned_features, aligned_width, build_model)
from dgl_maxk.nn import GINConv, GraphConv, SAGEConv


def planted_partition(n=90, classes=3, p_in=0.15, p_out=0.02, in_feats=8):
    """A small planted-partition graph (self-loops added) with weakly informative features."""
    labels = torch.arange(n) % classes
    same = labels[:, None] == labels[None, :]
    prob = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    src, dst = (torch.rand(n, n) < prob).nonzero(as_tuple=True)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n))
    feat = torch.randn(n, in_feats)
    feat[:, :classes] += 1.0 * F.one_hot(labels, classes)
    return g, feat, labels


def train(model, g, feat, labels, epochs=40, lr=0.01):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(epochs):
        loss = F.cross_entropy(model(g, feat), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def conv_inputs(model):
    """Record what each aggregation layer of ``model`` receives."""
    seen = []
    for module in model.modules():
        if isinstance(module, (SAGEConv, GraphConv, GINConv)):
            module.register_forward_pre_hook(lambda m, args: seen.append((m, args[1])))
    return seen


@pytest.mark.parametrize("name", ("sage", "gcn", "gin"))
@pytest.mark.parametrize("nonlinearity", ("maxk", "relu"))
def test_model_trains(name, nonlinearity):
    g, feat, labels = planted_partition()
    k = 8
    model = build_model(name, 8, 32, 3, num_layers=2, k=k, dropout=0.1,
                        nonlinearity=nonlinearity)
    assert isinstance(model, MODELS[name])
    seen = conv_inputs(model)
    losses = train(model, g, feat, labels)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses
    # MaxK is really in the model: every aggregation layer gets k-sparse rows
    assert len(seen) == 2 * 40
    for conv, x in seen:
        if nonlinearity == "relu":
            assert isinstance(x, torch.Tensor) and conv.k is None
            assert (x >= 0).all()
        elif name == "sage":
            assert conv.k == k  # SAGEConv applies MaxK itself
        else:
            assert isinstance(x, CBSR) and x.k == k and x.d == 32


def test_sage_fuses_layer_norm_and_maxk_only_where_nothing_watches():
    """The SAGE model runs each LayerNorm fused with the next layer's MaxK, which skips the
    norm's module call: with a hook on a norm, or a norm of torch's own, it runs the layers
    unfused, and the output and gradients are the same either way."""
    g, feat, _ = planted_partition(60)
    model = build_model("sage", 8, 16, 3, num_layers=3, k=4, dropout=0.0).double()
    feat = feat.double()

    def run():
        out = model(g, feat)
        return out, torch.autograd.grad(out.square().sum(), list(model.parameters()))
    fused_out, fused_grads = run()
    calls = []
    handle = model.layers[0].norm.register_forward_hook(lambda *a: calls.append(1))
    hooked_out, hooked_grads = run()
    handle.remove()
    assert calls == [1]
    torch.testing.assert_close(hooked_out, fused_out)
    for a, b in zip(hooked_grads, fused_grads):
        torch.testing.assert_close(a, b)
    plain = torch.nn.LayerNorm(16).double()
    plain.load_state_dict(model.layers[1].norm.state_dict())
    model.layers[1].norm = plain
    torch.testing.assert_close(model(g, feat), fused_out)


@pytest.mark.parametrize("name", ("sage", "gcn", "gin"))
def test_linear_and_maxk_fuse_only_where_nothing_watches(name, monkeypatch):
    """Each Linear whose output goes to a MaxK (SAGE's lin_in, GCN's and GIN's per-layer
    Linear) runs fused with it, which skips the Linear's module call: with a hook on the
    Linear it runs unfused, and the output and gradients are the same either way."""
    from dgl_maxk import library
    calls = []
    real = library.linear_maxk
    monkeypatch.setattr(library, "linear_maxk", lambda *a: calls.append(1) or real(*a))
    g, feat, _ = planted_partition(60)
    model = build_model(name, 8, 16, 3, num_layers=2, k=4, dropout=0.0).double()
    feat = feat.double()

    def run():
        out = model(g, feat)
        return out, torch.autograd.grad(out.square().sum(), list(model.parameters()))
    fused_out, fused_grads = run()
    assert len(calls) == (1 if name == "sage" else 2)
    linear = model.lin_in if name == "sage" else model.linears[0]
    seen = []
    handle = linear.register_forward_hook(lambda *a: seen.append(1))
    hooked_out, hooked_grads = run()
    handle.remove()
    assert seen == [1] and len(calls) == (1 if name == "sage" else 3)
    torch.testing.assert_close(hooked_out, fused_out)
    for a, b in zip(hooked_grads, fused_grads):
        torch.testing.assert_close(a, b)
    relu = build_model(name, 8, 16, 3, num_layers=2, dropout=0.0, nonlinearity="relu")
    relu(g, feat.float())
    assert len(calls) == (1 if name == "sage" else 3)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("blocks", (False, True), ids=("graph", "blocks"))
@pytest.mark.parametrize("name", ("sage", "gcn", "gin"))
def test_relu_and_dropout_fuse_only_where_nothing_watches(name, blocks, device, monkeypatch, h):
    """Under ReLU each layer's ReLU and dropout run as one operator, which skips the dropout's
    module call: with a hook on the dropout they run unfused, and the output and gradients
    are the same either way (CPU: torch's dropout either way, the same masks for the same
    seed; GPU: the kernel draws other masks than torch's, so dropout 0 there). On blocks
    SAGE hands the layer its destination rows apart (their gradients meet in the fused
    backward)."""
    from dgl_maxk import library
    calls = []
    real = library.relu_dropout
    monkeypatch.setattr(library, "relu_dropout", lambda *a: calls.append(a[3]) or real(*a))
    g, feat, _ = planted_partition(60)
    dropout = 0.5 if device == "cpu" else 0.0
    model = build_model(name, 8, 16, 3, num_layers=2, dropout=dropout,
                        nonlinearity="relu").to(device)
    if blocks:
        top, top_src, _, _ = h.block_of(g, h.random_seeds(60, 10))
        bottom, bottom_src, _, _ = h.block_of(g, top_src)
        g, feat = [bottom, top], feat[bottom_src]  # plans follow the features' device
    feat = feat.to(device)

    def run():
        torch.manual_seed(0)
        out = model(g, feat)
        return out, torch.autograd.grad(out.square().sum(), list(model.parameters()))
    fused_out, fused_grads = run()
    heads = [bottom.num_dst_nodes(), top.num_dst_nodes()] if blocks else [0, 0]
    assert calls == (heads if name == "sage" else [0, 0])
    drop = model.layers[0].feat_drop if name == "sage" else model.dropout
    handle = drop.register_forward_hook(lambda *a: calls.append("hooked"))
    hooked_out, hooked_grads = run()
    handle.remove()
    assert calls[2:] == (["hooked"] if name == "sage" else ["hooked", "hooked"]) + (
        [heads[1]] if name == "sage" else [])
    torch.testing.assert_close(hooked_out, fused_out)
    for a, b in zip(hooked_grads, fused_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("name", ("sage", "gcn", "gin"))
def test_relu_models_report_nan_fused_or_not(name, device):
    """NaN reaching a layer's ReLU is named as its features, whether the ReLU and dropout
    run fused (their operator scans them) or apart (a hook on the dropout)."""
    g, feat, _ = planted_partition(60)
    model = build_model(name, 8, 16, 3, num_layers=2, dropout=0.5,
                        nonlinearity="relu").to(device)
    with torch.no_grad():
        model.lin_in.weight[0, 0] = float("nan")
    feat = feat.to(device)
    with pytest.raises(ValueError, match="features contains"):
        model(g, feat)
    drop = model.layers[0].feat_drop if name == "sage" else model.dropout
    drop.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match="features contains"):
        model(g, feat)


def test_relu_sage_fuses_only_dense_layers_no_hook_watches(monkeypatch):
    """A MaxK layer a caller put in a ReLU SAGE model drops after its top-k, and a forward
    hook on a layer sees what it was given: neither runs the fused ReLU and dropout."""
    from dgl_maxk import library
    from dgl_maxk.nn import LayerNorm
    calls = []
    real = library.relu_dropout
    monkeypatch.setattr(library, "relu_dropout", lambda *a: calls.append(1) or real(*a))
    g, feat, _ = planted_partition(60)
    model = build_model("sage", 8, 16, 3, num_layers=2, nonlinearity="relu")
    model(g, feat)
    assert len(calls) == 2
    for i in (1, 0):
        model.layers[i] = SAGEConv(16, 16, "mean", feat_drop=0.5, norm=LayerNorm(16), k=4)
        model(g, feat)
    assert len(calls) == 3
    model.layers[1] = SAGEConv(16, 16, "mean", feat_drop=0.5, norm=LayerNorm(16))
    seen = []
    model.layers[1].register_forward_hook(lambda m, args, out: seen.append(args[1]))
    model(g, feat)
    assert len(calls) == 3 and isinstance(seen[0], torch.Tensor)


def test_sage_layer_with_dense_destination_under_autocast():
    """A (CBSR source, dense destination) pair (k=None: used as given) under bf16 autocast:
    the self GEMM is autocast's (out of place), as the neighbour GEMM is."""
    g, feat, _ = planted_partition(30)
    conv = SAGEConv(8, 6, "mean")
    x = torch.randn(30, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(g, (CBSR.from_dense(x, 3), x))
    assert out.dtype == torch.bfloat16 and out.shape == (30, 6)


@pytest.mark.parametrize("name", ("sage", "gin"))
@pytest.mark.parametrize("nonlinearity", ("maxk", "relu"))
def test_model_on_blocks_matches_full_graph(name, nonlinearity, h):
    """Mini-batch (one block per layer) gives the full-graph output at the seeds."""
    g, feat, _ = planted_partition(60)
    model = build_model(name, 8, 16, 3, num_layers=2, k=4, nonlinearity=nonlinearity).double()
    model.eval()
    feat = feat.double()
    seeds = h.random_seeds(60, 10)
    top, top_src, _, _ = h.block_of(g, seeds)
    bottom, bottom_src, _, _ = h.block_of(g, top_src)
    out = model([bottom, top], feat[bottom_src])
    torch.testing.assert_close(out, model(g, feat)[seeds], rtol=0, atol=1e-10)


def test_gcn_on_blocks_runs(h):
    g, feat, labels = planted_partition(60)
    model = MaxKGCN(8, 16, 3, num_layers=2, k=4)
    top, top_src, _, _ = h.block_of(g, h.random_seeds(60, 10))
    bottom, bottom_src, _, _ = h.block_of(g, top_src)
    out = model([bottom, top], feat[bottom_src])
    assert out.shape == (10, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_model_structure():
    sage = MaxKSAGE(8, 16, 3, num_layers=3, k=4, dropout=0.2)
    assert len(sage.layers) == 3
    for conv in sage.layers:
        assert isinstance(conv, SAGEConv) and conv._aggre_type == "mean" and conv.k == 4
        assert isinstance(conv.norm, torch.nn.LayerNorm)
        assert conv.feat_drop.p == 0.2
    gcn = MaxKGCN(8, 16, 3, num_layers=2, k=4)
    for conv in gcn.convs:
        assert isinstance(conv, GraphConv) and conv._norm == "both" and conv.weight is None
    gin = MaxKGIN(8, 16, 3, num_layers=2, k=4)
    for conv in gin.convs:
        assert isinstance(conv, GINConv) and conv._aggregator_type == "sum"
        assert isinstance(conv.eps, torch.nn.Parameter)
    assert MaxKSAGE(8, 16, 3, 1, nonlinearity="relu").layers[0].k is None


@pytest.mark.parametrize("in_feats", (6, 7, 8))
def test_models_give_the_same_output_on_aligned_features(in_feats):
    """aligned_features pads to a multiple of 8 columns (only where needed); every model
    built with padded_input computes the same output and gradients from the padded features
    as from the raw ones; lin_in keeps nn.Linear's state dict, and other widths get an error
    naming the widths it takes, the padded width too without padded_input."""
    g, feat, labels = planted_partition(in_feats=in_feats)
    feat = feat.double()
    padded = aligned_features(feat)
    assert padded.shape == (feat.shape[0], 8)
    assert torch.equal(padded[:, :in_feats], feat) and not padded[:, in_feats:].any()
    assert (padded is feat) == (in_feats == 8)
    for name in MODELS:
        torch.manual_seed(0)
        model = build_model(name, in_feats, 16, 3, 2, k=4, dropout=0.0,
                            padded_input=True).double()
        assert set(model.lin_in.state_dict()) == {"weight", "bias"}
        assert model.lin_in.weight.shape == (16, in_feats)
        outs = []
        for x in (feat, padded):
            model.zero_grad()
            out = model(g, x)
            F.cross_entropy(out, labels).backward()
            outs.append((out, [p.grad.clone() for p in model.parameters()]))
        assert torch.allclose(outs[0][0], outs[1][0])
        for a, b in zip(outs[0][1], outs[1][1]):
            assert torch.allclose(a, b)
        also = "" if in_feats == 8 else r" \(or 8: padded by aligned_features\)"
        with pytest.raises(ValueError, match=f"features have width 9 but the model's lin_in "
                                             f"expects {in_feats}{also}$"):
            model(g, torch.randn(feat.shape[0], 9, dtype=torch.float64))
    strict = build_model("sage", in_feats, 16, 3, 2, k=4).double()
    strict(g, feat)
    if in_feats != 8:
        with pytest.raises(ValueError, match=f"width 8 but the model's lin_in expects "
                                             f"{in_feats}$"):
            strict(g, padded)


def test_model_initialisation_unchanged_by_input_linear():
    """lin_in draws what torch.nn.Linear draws (same seed, same weights)."""
    torch.manual_seed(3)
    model = MaxKSAGE(602, 16, 3, 1, k=4)
    torch.manual_seed(3)
    plain = torch.nn.Linear(602, 16)
    assert torch.equal(model.lin_in.weight, plain.weight)
    assert torch.equal(model.lin_in.bias, plain.bias)


@pytest.mark.parametrize("out_feats", (1, 5, 8, 41))
@pytest.mark.parametrize("bias", (True, False))
def test_output_linear_is_nn_linear(out_feats, bias):
    """lin_out (its GEMMs on an aligned width) draws nn.Linear's weights, keeps its state
    dict, and gives its output and gradients, on 2-D and 3-D input."""
    torch.manual_seed(5)
    lin = OutputLinear(16, out_feats, bias=bias).double()
    torch.manual_seed(5)
    plain = torch.nn.Linear(16, out_feats, bias=bias).double()
    assert lin.state_dict().keys() == plain.state_dict().keys()
    for a, b in zip(lin.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    for shape in ((37, 16), (3, 11, 16)):
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        outs = []
        for layer in (lin, plain):
            layer.zero_grad()
            x.grad = None
            out = layer(x)
            weights = torch.randn(out.shape, dtype=torch.float64,
                                  generator=torch.Generator().manual_seed(1))
            (out * weights).sum().backward()
            outs.append((out.detach(), x.grad.clone(),
                         [p.grad.clone() for p in layer.parameters()]))
        assert outs[0][0].shape == (*shape[:-1], out_feats)
        assert torch.allclose(outs[0][0], outs[1][0])
        assert torch.allclose(outs[0][1], outs[1][1])
        for a, b in zip(outs[0][2], outs[1][2]):
            assert torch.allclose(a, b)
    # the GEMM ran on the aligned width: the output's rows lie that far apart
    assert lin(torch.randn(4, 16, dtype=torch.float64)).stride(0) == aligned_width(out_feats)
    assert isinstance(build_model("sage", 8, 16, out_feats, 1, k=4).lin_out, OutputLinear)


@pytest.mark.parametrize("kwargs, match", [
    (dict(nonlinearity="gelu"), "nonlinearity"),
    (dict(num_layers=0), "num_layers"),
    (dict(k=0), "k"),
    (dict(k=17), "k"),
])
def test_model_bad_arguments(kwargs, match):
    args = dict(in_feats=8, hidden_feats=16, out_feats=3, num_layers=2, k=4)
    args.update(kwargs)
    for cls in (MaxKSAGE, MaxKGCN, MaxKGIN):
        with pytest.raises(ValueError, match=match):
            cls(**args)


def test_build_model_unknown_name():
    with pytest.raises(ValueError, match="model"):
        build_model("gat", 8, 16, 3, 2)
