"""Operators: maxk, cbsr_spgemm, spmm, aggregate, and the graph plan behind them."""
import math
import re

import pytest
import torch
from torch.nn import functional as F
from torch.autograd import gradcheck

import dgl_maxk
from dgl_maxk import CBSR, cbsr_spgemm, graph_plan, maxk, spmm
from dgl_maxk.sparse import GraphPlan

NORMS = ("none", "left", "right", "both")
F64 = dict(rtol=0, atol=1e-10)
# gradcheck compares an analytic Jacobian with central differences (eps 1e-6); these
# operators are (bi)linear, so the differences are exact up to rounding.
GRADCHECK = dict(eps=1e-6, atol=1e-7, rtol=1e-6)


def close64(actual, expected, what=""):
    assert actual.dtype == torch.float64, what
    assert actual.shape == expected.shape, what
    torch.testing.assert_close(actual, expected, **F64, msg=lambda m: f"{what}\n{m}")


# --------------------------------------------------------------------------- maxk

@pytest.mark.parametrize("n, d, k", [(7, 1, 1), (9, 5, 1), (9, 5, 3), (9, 5, 5), (12, 64, 8),
                                     (6, 256, 32), (5, 257, 16), (4, 384, 384),
                                     (3, 1024, 100)])
def test_maxk_equals_topk_mask(n, d, k, h):
    x = torch.randn(n, d, dtype=torch.float64)  # continuous: no ties
    c = maxk(x, k)
    assert isinstance(c, CBSR)
    assert c.k == k and c.d == d and c.indices.dtype == h.expected_index_dtype(d)
    assert torch.equal(c.to_dense(), h.topk_mask_dense(x, k))
    cols = c.long_indices()
    assert (cols[:, 1:] > cols[:, :-1]).all(), "columns must be ascending and distinct"
    assert torch.equal(c.values, x.gather(1, cols)), "values are the inputs, sign kept"


@pytest.mark.parametrize("k", (1, 2, 3, 5, 8))
def test_maxk_ties_go_to_the_lower_column(k):
    # Few distinct values: many ties, including ties across the k-th place.
    n, d = 40, 8
    x = torch.randint(-2, 3, (n, d)).to(torch.float32)
    x[0] = 1.0  # a row that is one big tie
    c = maxk(x, k)
    for r in range(n):
        row = x[r].tolist()
        expected = sorted(sorted(range(d), key=lambda j: (-row[j], j))[:k])
        assert c.long_indices()[r].tolist() == expected, (r, row)
        assert c.values[r].tolist() == [row[j] for j in expected]
    assert c.long_indices()[0].tolist() == list(range(k))


def test_maxk_exactly_k_per_row_and_negatives_kept(h):
    n, d, k = 30, 16, 6
    x = -torch.rand(n, d, dtype=torch.float64) - 0.1  # all negative
    positives = torch.randint(0, k, (n,))  # fewer than k positives in every row
    for r in range(n):
        cols = torch.randperm(d)[:int(positives[r])]
        x[r, cols] = torch.rand(len(cols), dtype=torch.float64) + 0.1
    c = maxk(x, k)
    assert c.values.shape == (n, k) and c.indices.shape == (n, k)
    for r in range(n):
        p = int(positives[r])
        vals = c.values[r]
        assert int((vals > 0).sum()) == p
        assert int((vals < 0).sum()) == k - p, "negatives fill the row up to k"
        # the kept negatives are the largest (closest to zero) ones of the row
        kept_neg = sorted(v for v in vals.tolist() if v < 0)
        all_neg = sorted(v for v in x[r].tolist() if v < 0)
        assert kept_neg == all_neg[len(all_neg) - (k - p):]
    assert torch.equal(c.to_dense(), h.topk_mask_dense(x, k))


def test_maxk_dtypes_and_zero_rows():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.randn(5, 10).to(dtype)
        c = maxk(x, 3)
        assert c.dtype == dtype
        assert torch.equal(c.to_dense(), x * (c.to_dense() != 0))
    assert maxk(torch.zeros(0, 10), 3).values.shape == (0, 3)
    z = maxk(torch.zeros(4, 6), 2)
    assert torch.equal(z.long_indices(), torch.tensor([[0, 1]] * 4))


def test_maxk_gradient_only_at_kept_positions(h):
    x = h.distinct_values(6, 9).requires_grad_()
    c = maxk(x, 4)
    upstream = torch.randn(6, 4, dtype=torch.float64)
    (c.values * upstream).sum().backward()
    expected = torch.zeros(6, 9, dtype=torch.float64).scatter_(1, c.long_indices(), upstream)
    assert torch.equal(x.grad, expected)


@pytest.mark.parametrize("d, k", [(1, 1), (5, 1), (5, 2), (5, 5), (12, 4), (300, 7)])
def test_maxk_gradcheck(d, k, h):
    # Values at least 0.01 apart: the eps-perturbations never change the selection.
    x = h.distinct_values(2 if d > 100 else 4, d).requires_grad_()
    assert gradcheck(lambda t: maxk(t, k).values, (x,), **GRADCHECK)
    assert gradcheck(lambda t: maxk(t, k).to_dense(), (x,), **GRADCHECK)


# --------------------------------------------------------------------------- cbsr_spgemm

@pytest.mark.parametrize("weight_shape", (None, "flat", "column"))
@pytest.mark.parametrize("norm", NORMS)
def test_cbsr_spgemm_equals_dense_reference(graph_case, norm, weight_shape, h):
    kind, g = graph_case
    w = None if weight_shape is None else h.positive_edge_weight(g, weight_shape)
    a = h.dense_adjacency(g, norm, w)
    for d, k in ((6, 2), (12, 12), (300, 5)):
        x, _ = h.random_cbsr(g.num_src_nodes(), d, k)
        y = cbsr_spgemm(g, x, edge_weight=w, norm=norm)
        close64(y, a @ x.to_dense(), f"{kind} norm={norm} d={d} k={k}")
        assert y.shape == (g.num_dst_nodes(), d)


@pytest.mark.parametrize("norm", NORMS)
def test_cbsr_spgemm_float32(norm, h):
    g = h.make_graph("multi_edges", 60)
    w = h.positive_edge_weight(g, dtype=torch.float32)
    x, _ = h.random_cbsr(60, 40, 8, dtype=torch.float32)
    y = cbsr_spgemm(g, x, edge_weight=w, norm=norm)
    assert y.dtype == torch.float32
    expected = h.dense_adjacency(g, norm, w.double()) @ x.to_dense().double()
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", ("random", "empty_rows", "multi_edges", "directed",
                                  "block", "block_zero_in", "bipartite"))
def test_cbsr_spgemm_gradcheck(kind, norm, h):
    g = h.make_graph(kind, 12)
    x, _ = h.random_cbsr(g.num_src_nodes(), 7, 3, requires_grad=True)
    w = h.positive_edge_weight(g).requires_grad_()

    def f(values, weight):
        return cbsr_spgemm(g, CBSR(values, x.indices, x.d), edge_weight=weight, norm=norm)

    assert gradcheck(f, (x.values, w), **GRADCHECK)
    # without edge weights (the cached unweighted plan values)
    assert gradcheck(lambda v: f(v, None), (x.values,), **GRADCHECK)


def test_cbsr_spgemm_gradients_match_dense_autograd(h):
    """dX_cbsr = (A^T dY) sampled at X's pattern, and dw from the dense formula."""
    g = h.make_graph("multi_edges", 30)
    x, pattern = h.random_cbsr(30, 20, 4, requires_grad=True)
    w = h.positive_edge_weight(g, "column").requires_grad_()
    y = cbsr_spgemm(g, x, edge_weight=w, norm="both")
    dy = torch.randn_like(y)
    gv, gw = torch.autograd.grad(y, (x.values, w), dy)
    a = h.dense_adjacency(g, "both", w.detach())
    close64(gv, (a.T @ dy).gather(1, pattern), "values gradient")
    # y = sum_e w_e s_e x_{src_e} placed at dst_e -> dy/dw_e = s_e <dy[dst_e], x[src_e]>
    src, dst = g.edges()
    ones = torch.ones(g.num_edges(), dtype=torch.float64)
    scale = torch.zeros(g.num_edges(), dtype=torch.float64)
    for e in range(g.num_edges()):
        # the normalisation of edge e alone: A of a graph of weight one on e only
        we = torch.zeros_like(ones)
        we[e] = 1
        scale[e] = h.dense_adjacency(g, "both", we)[dst[e], src[e]]
    expected_gw = scale * (dy[dst] * x.to_dense().detach()[src]).sum(1)
    assert gw.shape == w.shape
    close64(gw.reshape(-1), expected_gw, "edge weight gradient")


def test_cbsr_spgemm_no_edges_and_no_rows(h):
    g = h.make_graph("no_edges", 10)
    x, _ = h.random_cbsr(10, 8, 3, requires_grad=True)
    y = cbsr_spgemm(g, x, norm="both")
    assert torch.equal(y, torch.zeros(10, 8, dtype=torch.float64))
    y.sum().backward()
    assert torch.equal(x.values.grad, torch.zeros(10, 3, dtype=torch.float64))


@pytest.mark.parametrize("norm", NORMS)
def test_cbsr_spgemm_hands_node_scales_not_edge_values(norm, h, monkeypatch):
    """Without edge weights A's values are node scales: the backend gets no per-edge values,
    the destination scales as ``row_scale`` and X's values times the source scales (so the
    kernels read a scale a row, not a value an edge); with edge weights, edge values only."""
    from dgl_maxk import backends
    g = h.make_graph("random", 20)
    x, _ = h.random_cbsr(20, 8, 3)
    plan = graph_plan(g, "cpu")
    calls, spgemm = [], backends.reference.cbsr_spgemm
    monkeypatch.setattr(backends.reference, "cbsr_spgemm",
                        lambda *args: calls.append(args) or spgemm(*args))
    cbsr_spgemm(plan, x, norm=norm)
    _, edge_values, values, _, _, row_scale = calls[-1]
    src = plan.node_scale(norm, "src", torch.float64)
    dst = plan.node_scale(norm, "dst", torch.float64)
    assert edge_values is None and (row_scale is dst if dst is not None else row_scale is None)
    assert torch.equal(values, x.values if src is None else x.values * src[:, None])
    cbsr_spgemm(plan, x, edge_weight=h.positive_edge_weight(g), norm=norm)
    _, edge_values, values, _, _, row_scale = calls[-1]
    assert edge_values.shape == (plan.num_edges,) and row_scale is None and values is x.values


def test_cbsr_spgemm_half_gradient_takes_the_source_scale_before_its_cast(monkeypatch):
    """The source scale (norm 'left' or 'both') goes onto the fp32 sums, before the cast to
    the features' half dtype: a backend that returns grad_y's dtype (as the CUDA one does)
    would otherwise round, and here overflow, the unscaled sum of 70,000 out-edges."""
    from types import SimpleNamespace
    from dgl_maxk import backends
    n = 70_000
    plan = GraphPlan(torch.arange(n + 1), torch.zeros(n, dtype=torch.int64), None, 1, n)
    like_cuda = SimpleNamespace(  # fp32 sums, returned in grad_y's dtype
        cbsr_spgemm=backends.reference.cbsr_spgemm,
        cbsr_sspmm=lambda plan, ev, gy, xi, rs: backends.reference.cbsr_sspmm(
            plan, ev, gy.float(), xi, rs).to(gy.dtype))
    monkeypatch.setattr(backends, "for_tensor", lambda tensor: like_cuda)
    values = torch.ones(1, 1, dtype=torch.float16, requires_grad=True)
    x = CBSR(values, torch.zeros(1, 1, dtype=torch.uint8), 4)
    for norm, want in (("left", 1.0), ("both", n ** 0.5)):  # sum of n scales
        y = cbsr_spgemm(plan, x, norm=norm)
        (grad,) = torch.autograd.grad(y, values, torch.ones_like(y))
        assert grad.dtype == torch.float16
        torch.testing.assert_close(grad.float(), torch.tensor([[want]]), rtol=1e-3, atol=0)


def test_aggregation_backends_take_edge_values_or_row_scales_not_both():
    """The kernels read one or the other (the backward would scale dY rows as well)."""
    from dgl_maxk.backends import cuda, reference
    plan, _ = _sorted_plan([2, 0, 3], 4, 0)
    xv, xi = torch.rand(4, 2), torch.zeros(4, 2, dtype=torch.uint8)
    ev, rs, gy = torch.rand(plan.num_edges), torch.rand(3), torch.rand(3, 8)
    for backend in (reference, cuda):
        with pytest.raises(ValueError, match="not both"):
            backend.cbsr_spgemm(plan, ev, xv, xi, 8, rs)
        with pytest.raises(ValueError, match="not both"):
            backend.cbsr_sspmm(plan, ev, gy, xi, rs)


def test_cbsr_spgemm_accepts_a_graph_plan(h):
    g = h.make_graph("block")
    x, _ = h.random_cbsr(g.num_src_nodes(), 10, 2)
    plan = graph_plan(g, "cpu")
    close64(cbsr_spgemm(plan, x, norm="right"), cbsr_spgemm(g, x, norm="right"))


# --------------------------------------------------------------------------- spmm, aggregate

@pytest.mark.parametrize("weight_shape", (None, "flat", "column"))
@pytest.mark.parametrize("norm", NORMS)
def test_spmm_equals_dense_reference(graph_case, norm, weight_shape, h):
    kind, g = graph_case
    w = None if weight_shape is None else h.positive_edge_weight(g, weight_shape)
    x = torch.randn(g.num_src_nodes(), 5, dtype=torch.float64)
    close64(spmm(g, x, edge_weight=w, norm=norm), h.dense_adjacency(g, norm, w) @ x,
            f"{kind} norm={norm}")


def test_spmm_trailing_dimensions(h):
    g = h.make_graph("block")
    x = torch.randn(g.num_src_nodes(), 2, 3, dtype=torch.float64)
    y = spmm(g, x, norm="both")
    assert y.shape == (g.num_dst_nodes(), 2, 3)
    expected = (h.dense_adjacency(g, "both") @ x.reshape(len(x), -1)).reshape(-1, 2, 3)
    close64(y, expected)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", ("random", "empty_rows", "directed", "block_zero_in",
                                  "bipartite"))
def test_spmm_gradcheck(kind, norm, h):
    g = h.make_graph(kind, 12)
    x = torch.randn(g.num_src_nodes(), 3, dtype=torch.float64, requires_grad=True)
    w = h.positive_edge_weight(g).requires_grad_()
    assert gradcheck(lambda a, b: spmm(g, a, edge_weight=b, norm=norm), (x, w), **GRADCHECK)
    assert gradcheck(lambda a: spmm(g, a, norm=norm), (x,), **GRADCHECK)


def test_aggregate_dispatches(h):
    g = h.make_graph("self_loops")
    x, _ = h.random_cbsr(g.num_src_nodes(), 9, 3)
    w = h.positive_edge_weight(g)
    for norm in NORMS:
        sparse = dgl_maxk.aggregate(g, x, w, norm)
        dense = dgl_maxk.aggregate(g, x.to_dense(), w, norm)
        close64(sparse, dense, norm)
        close64(sparse, cbsr_spgemm(g, x, w, norm), norm)


def test_aggregations_refuse_infinite_edge_weights(h):
    """Both aggregations refuse +-inf edge weights as they refuse NaN (see the layers'
    edge-weight test), naming the first position, unless content checks are off."""
    g = h.make_graph("self_loops", 12)
    x = torch.randn(g.num_src_nodes(), 6, dtype=torch.float64)
    w = h.positive_edge_weight(g)
    at = int(torch.randint(g.num_edges(), ()))
    w[at] = float("-inf") if torch.rand(()) < 0.5 else float("inf")
    for op, feat in ((spmm, x), (cbsr_spgemm, maxk(x, 2))):
        with pytest.raises(ValueError, match=rf"edge_weight contains 1 non-finite .*\({at},\)"):
            op(g, feat, edge_weight=w)
        with dgl_maxk.input_checks(False):
            op(g, feat, edge_weight=w)

# --------------------------------------------------------------------------- graph plan

def test_graph_plan_structure(graph_case, h):
    kind, g = graph_case
    plan = graph_plan(g, "cpu")
    assert (plan.num_src, plan.num_dst, plan.num_edges) == (
        g.num_src_nodes(), g.num_dst_nodes(), g.num_edges())
    assert torch.equal(plan.in_degrees, g.in_degrees().long())
    assert torch.equal(plan.out_degrees, g.out_degrees().long())
    # CSR entry i is the DGL edge edge_ids[i]: same endpoints, rows in order
    src, dst = g.edges()
    assert torch.equal(plan.indices, src[plan.edge_ids].long())
    rows = torch.repeat_interleave(torch.arange(plan.num_dst), plan.in_degrees)
    assert torch.equal(rows, dst[plan.edge_ids].long())
    assert sorted(plan.edge_ids.tolist()) == list(range(g.num_edges()))
    # each row lists its sources in ascending order (the backward's source slices need it)
    assert plan.rows_sorted_by_source()
    key = rows * max(plan.num_src, 1) + plan.indices
    assert bool((key[1:] >= key[:-1]).all())


def _sorted_plan(degrees, num_src, seed):
    gen = torch.Generator().manual_seed(seed)
    degrees = torch.as_tensor(degrees, dtype=torch.int64)
    indptr = torch.zeros(degrees.numel() + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    rows = torch.repeat_interleave(torch.arange(degrees.numel()), degrees)
    src = torch.randint(0, num_src, (int(indptr[-1]),), generator=gen)
    src = src[torch.argsort(rows * num_src + src, stable=True)]
    return GraphPlan(indptr, src, None, num_src, degrees.numel()), rows


@pytest.mark.parametrize("slices", [1, 2, 3, 7, 500])
def test_source_slices_walk_each_entry_once_slice_by_slice(slices):
    """Groups of one row and one source slice, at most group_size entries, listed slice by
    slice; together they cover every CSR entry once (empty rows, hubs, more slices than
    sources)."""
    seed = int(torch.randint(0, 2 ** 31, ()))
    degrees = torch.randint(0, 40, (60,))
    degrees[[3, 17]] = 0
    degrees[[5, 40]] = 300  # hubs, many groups per slice
    plan, rows = _sorted_plan(degrees, 150, seed)
    group_row, start, end = plan.source_slices(16, slices)
    assert plan.source_slices(16, slices) is plan.source_slices(16, slices)
    width = -(-150 // slices)
    covered = torch.zeros(plan.num_edges, dtype=torch.int64)
    last = -1
    for g in range(group_row.numel()):
        lo, hi = int(start[g]), int(end[g])
        assert 0 < hi - lo <= 16, seed
        assert bool((rows[lo:hi] == int(group_row[g])).all()), seed
        part = (plan.indices[lo:hi] // width).unique()
        assert part.numel() == 1 and int(part) >= last, seed
        last = int(part)
        covered[lo:hi] += 1
    assert bool((covered == 1).all()), seed


def test_source_slices_need_rows_sorted_by_source():
    plan = GraphPlan(torch.tensor([0, 0, 2, 3]), torch.tensor([4, 1, 0]), None, 5, 3)
    assert not plan.rows_sorted_by_source()
    with pytest.raises(ValueError, match="ascending"):
        plan.source_slices(16, 2)
    # a row boundary is not a descent; empty leading rows are not either
    assert GraphPlan(torch.tensor([0, 0, 2, 3]), torch.tensor([1, 4, 0]), None, 5,
                     3).rows_sorted_by_source()


def test_graph_plan_is_cached_and_invalidated(h):
    g = h.random_graph(20, 50)
    plan = graph_plan(g, "cpu")
    assert graph_plan(g, torch.device("cpu")) is plan
    x = torch.randn(20, 4, dtype=torch.float64)
    before = spmm(g, x, norm="right")
    g.add_edges(torch.tensor([0, 1, 2]), torch.tensor([5, 5, 5]))
    new_plan = graph_plan(g, "cpu")
    assert new_plan is not plan and new_plan.num_edges == 53
    after = spmm(g, x, norm="right")
    close64(after, h.dense_adjacency(g, "right") @ x)
    assert not torch.allclose(after[5], before[5])
    g.remove_nodes(torch.tensor([19]))
    assert graph_plan(g, "cpu").num_src == 19


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_plan_is_one_for_cuda_and_the_current_cuda_device(h):
    """Features on "cuda:0" find the plan built for "cuda" (a compiled model reads it)."""
    g = h.random_graph(20, 50)
    plan = graph_plan(g, "cuda")
    assert graph_plan(g, torch.device("cuda", torch.cuda.current_device())) is plan


def test_graph_plan_rejects_bad_norm(h):
    plan = graph_plan(h.random_graph(5, 8), "cpu")
    with pytest.raises(ValueError, match="norm"):
        plan.edge_values("sum")


# --------------------------------------------------------------------------- GPU

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (torch.cuda.is_available() is "
                                          "False)")


@requires_cuda
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_features_with_cpu_graph(norm, h):
    g = h.make_graph("block")  # DGL graphs stay on the CPU
    x, _ = h.random_cbsr(g.num_src_nodes(), 64, 8, dtype=torch.float32, requires_grad=True)
    w = h.positive_edge_weight(g, dtype=torch.float32).requires_grad_()
    xc = CBSR(x.values.detach().cuda().requires_grad_(), x.indices.cuda(), x.d)
    wc = w.detach().cuda().requires_grad_()
    y = cbsr_spgemm(g, x, w, norm)
    yc = cbsr_spgemm(g, xc, wc, norm)
    assert yc.is_cuda
    torch.testing.assert_close(yc.cpu(), y, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x.values, w), dy)
    grads_c = torch.autograd.grad(yc, (xc.values, wc), dy.cuda())
    for a, b in zip(grads_c, grads):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    hd = torch.randn(50, 64)
    assert torch.equal(maxk(hd.cuda(), 8).to_dense().cpu(), maxk(hd, 8).to_dense())
    xd = torch.randn(g.num_src_nodes(), 16)
    torch.testing.assert_close(spmm(g, xd.cuda(), norm=norm).cpu(), spmm(g, xd, norm=norm),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_dense_multigraph_with_more_edges_than_matrix_entries(norm, h):
    """cuSPARSE rejects a CSR with more entries than rows x columns; such graphs (a few nodes,
    many parallel edges) must still aggregate and differentiate correctly."""
    n = 3
    g = h.homograph(torch.randint(0, n, (40,)), torch.randint(0, n, (40,)), n)
    w = h.positive_edge_weight(g).requires_grad_()
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    close64(spmm(g, x, edge_weight=w, norm=norm), h.dense_adjacency(g, norm, w) @ x)
    assert gradcheck(lambda a, b: spmm(g, a, edge_weight=b, norm=norm), (x, w), **GRADCHECK)
    c, _ = h.random_cbsr(n, 4, 2, requires_grad=True)
    assert gradcheck(lambda v, b: cbsr_spgemm(g, CBSR(v, c.indices, c.d), edge_weight=b,
                                              norm=norm), (c.values, w), **GRADCHECK)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_reference_maxk_is_the_stable_sort_definition(dtype):
    """The reference's top-k shortcut keeps exactly what a stable descending sort keeps, on
    inputs full of ties, signed zeros, infinities and (in some rows) NaN."""
    from dgl_maxk.backends.reference import maxk_cbsr
    for trial in range(12):
        d = int(torch.randint(1, 300, (1,)))
        k = int(torch.randint(1, d + 1, (1,)))
        h = torch.randint(-3, 4, (30, d)).to(dtype)
        zeros = h == 0
        h[zeros] = torch.where(torch.rand(int(zeros.sum())) < 0.5, -0.0, 0.0).to(dtype)
        h[1, : min(3, d)] = float("inf")
        h[2, : min(2, d)] = float("-inf")
        if trial % 3 == 0:
            h[0, d // 2] = float("nan")
        values, indices = maxk_cbsr(h, k)
        top = torch.sort(h, dim=1, descending=True, stable=True).indices[:, :k]
        expected = top.sort(dim=1).values
        assert torch.equal(indices.long(), expected), (trial, d, k)
        assert torch.equal(values.view(torch.uint8), h.gather(1, expected).view(torch.uint8))


@pytest.mark.parametrize("shape", [(13, 8), (5, 256), (0, 4)])
def test_layer_norm_op_is_torchs(shape):
    """dgl_maxk's LayerNorm (on the CPU: the reference behind the same autograd Function
    the GPU kernel uses) gives torch's output and gradients, and loads torch's state dict."""
    from dgl_maxk.nn import LayerNorm
    d = shape[1]
    ours, theirs = LayerNorm(d), torch.nn.LayerNorm(d)
    with torch.no_grad():
        theirs.weight.normal_(), theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 5).requires_grad_()
    ours, theirs = ours.double(), theirs.double()
    assert gradcheck(lambda t: ours(t), (x,)) if shape[0] else True
    g = torch.randn(shape, dtype=torch.float64)
    y, y_ref = ours(x), theirs(x)
    assert torch.allclose(y, y_ref)
    grads = torch.autograd.grad(y, (x, ours.weight, ours.bias), g)
    grads_ref = torch.autograd.grad(y_ref, (x, theirs.weight, theirs.bias), g)
    for a, b in zip(grads, grads_ref):
        assert torch.allclose(a, b)


def test_layer_norm_under_autocast_and_other_shapes_is_torchs():
    from dgl_maxk.ops import layer_norm
    x = torch.randn(6, 8)
    w, b = torch.randn(8), torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer_norm(x.bfloat16(), (8,), w, b)
        want = torch.nn.functional.layer_norm(x.bfloat16(), (8,), w, b)
    assert got.dtype == want.dtype and torch.equal(got, want)
    x3 = torch.randn(2, 3, 8)
    assert torch.equal(layer_norm(x3, (8,), w, b),
                       torch.nn.functional.layer_norm(x3, (8,), w, b))
    assert torch.equal(layer_norm(x, (8,)), torch.nn.functional.layer_norm(x, (8,)))


def test_cbsr_addmm_is_addmm_on_the_dense_rows(h):
    """Value and gradients (c, values, weight) of the Linear on CBSR rows against torch's
    addmm on the dense rows; no gradient is asked of what does not need one."""
    from dgl_maxk.ops import cbsr_addmm
    x, _ = h.random_cbsr(30, 16, 5, requires_grad=True)
    c = torch.randn(30, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda cc, v, ww: cbsr_addmm(cc, x.with_values(v), ww), (c, x.values, w))
    got = cbsr_addmm(c, x, w)
    want = torch.addmm(c, x.to_dense(), w.t())
    assert torch.allclose(got, want)
    g = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad(got, (c, x.values, w), g),
                    torch.autograd.grad(want, (c, x.values, w), g)):
        assert torch.allclose(a, b)
    frozen = cbsr_addmm(c.detach(), x.with_values(x.values.detach()), w)
    (gw,) = torch.autograd.grad(frozen.sum(), w)
    assert torch.allclose(gw, torch.ones(30, 7, dtype=torch.float64).t() @ x.to_dense().detach())


def test_cbsr_addmm_in_place_adds_into_c(h):
    """inplace=True returns c itself, holding what the out-of-place op returns, and gives
    the same gradients through c's producer, the values and the weight."""
    from dgl_maxk.ops import cbsr_addmm
    x, _ = h.random_cbsr(25, 12, 4, requires_grad=True)
    a = torch.randn(25, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 12, dtype=torch.float64, requires_grad=True)
    c = a * 2  # a temporary, as the neighbour GEMM's output is in SAGEConv
    want = cbsr_addmm(a * 2, x, w)
    got = cbsr_addmm(c, x, w, inplace=True)
    assert got.data_ptr() == c.data_ptr() and torch.allclose(got, want)
    g = torch.randn_like(got)
    for gi, wi in zip(torch.autograd.grad(got, (a, x.values, w), g),
                      torch.autograd.grad(want, (a, x.values, w), g)):
        assert torch.allclose(gi, wi)
    assert gradcheck(lambda aa, v, ww: cbsr_addmm(aa * 1.5, x.with_values(v), ww, inplace=True),
                     (a, x.values, w))


def test_linear_is_torch_linear():
    """ops.linear: F.linear's value and gradients (input, weight, bias, each alone too) for
    2-D input with a bias; torch's own call for the rest."""
    from dgl_maxk.ops import linear
    x = torch.randn(37, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert gradcheck(linear, (x, w, b))
    got, want = linear(x, w, b), F.linear(x, w, b)
    assert torch.allclose(got, want)
    g = torch.randn_like(got)
    for a, c in zip(torch.autograd.grad(got, (x, w, b), g),
                    torch.autograd.grad(want, (x, w, b), g)):
        assert torch.allclose(a, c)
    for i in range(3):  # one input needing a gradient
        ours, torchs = ([t.detach().requires_grad_(j == i) for j, t in enumerate((x, w, b))]
                        for _ in range(2))
        (grad,) = torch.autograd.grad(linear(*ours), ours[i], g)
        (ref_grad,) = torch.autograd.grad(F.linear(*torchs), torchs[i], g)
        assert torch.allclose(grad, ref_grad)
    x3 = torch.randn(2, 4, 9, dtype=torch.float64)
    assert torch.equal(linear(x3, w, b), F.linear(x3, w, b))
    assert torch.equal(linear(x, w), F.linear(x, w))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_linear_under_torch_func_and_forward_ad():
    """ops.linear works where F.linear does: torch.func's grad, vmap and jvp (forward-mode
    AD), with the tangents of any of its inputs."""
    from torch.func import grad, jvp, vmap
    from dgl_maxk.ops import linear
    x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((6, 3), (4, 3), (4,)))
    for i in range(3):
        got = grad(lambda *a: linear(*a).pow(2).sum(), argnums=i)(x, w, b)
        want = grad(lambda *a: F.linear(*a).pow(2).sum(), argnums=i)(x, w, b)
        assert torch.allclose(got, want)
        tangents = [torch.zeros_like(t) for t in (x, w, b)]
        tangents[i] = torch.randn_like(tangents[i])
        for a, c in zip(jvp(linear, (x, w, b), tuple(tangents)),
                        jvp(F.linear, (x, w, b), tuple(tangents))):
            assert torch.allclose(a, c)
    xs = torch.randn(5, 6, 3, dtype=torch.float64)
    assert torch.allclose(vmap(linear, in_dims=(0, None, None))(xs, w, b),
                          vmap(F.linear, in_dims=(0, None, None))(xs, w, b))
    assert gradcheck(linear, tuple(t.requires_grad_() for t in (x, w, b)),
                     check_forward_ad=True)


def assert_same_entries_and_grads(got, want, inputs):
    """CBSR ``got`` holds ``want``'s entries, and passes the same gradients to ``inputs``."""
    assert torch.equal(got.indices, want.indices)
    torch.testing.assert_close(got.values, want.values)
    g = torch.randn_like(got.values)
    for a, r in zip(torch.autograd.grad(got.values, inputs, g),
                    torch.autograd.grad(want.values, inputs, g)):
        torch.testing.assert_close(a, r)


def test_layer_norm_maxk_is_maxk_of_layer_norm():
    """The fused operator's CBSR and gradients (x, weight, bias) are those of maxk applied to
    layer_norm; without weight and bias it is the two operators."""
    from dgl_maxk.ops import layer_norm, layer_norm_maxk
    x = torch.randn(40, 12, dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, dtype=torch.float64, requires_grad=True)
    assert_same_entries_and_grads(layer_norm_maxk(x, 5, w, b),
                                  maxk(layer_norm(x, (12,), w, b), 5), (x, w, b))
    assert gradcheck(lambda xx, ww, bb: layer_norm_maxk(xx, 5, ww, bb).values, (x, w, b))
    plain = layer_norm_maxk(x, 5, None, None)
    assert torch.equal(plain.to_dense(), maxk(layer_norm(x, (12,)), 5).to_dense())


def test_linear_maxk_is_maxk_of_linear():
    """The fused operator's CBSR and gradients (x, weight, bias) are those of maxk applied to
    linear, for k from 1 to d; without a bias, and under autocast, it is the two operators."""
    from dgl_maxk.ops import linear, linear_maxk
    x = torch.randn(40, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, dtype=torch.float64, requires_grad=True)
    for k in range(1, 13):
        got = linear_maxk(x, k, w, b)
        assert got.d == 12
        assert_same_entries_and_grads(got, maxk(linear(x, w, b), k), (x, w, b))
    assert gradcheck(lambda xx, ww, bb: linear_maxk(xx, 5, ww, bb).values, (x, w, b))
    assert torch.autograd.gradgradcheck(lambda xx, ww, bb: linear_maxk(xx, 5, ww, bb).values,
                                        (x, w, b))
    plain = linear_maxk(x, 5, w, None)
    assert torch.equal(plain.to_dense(), maxk(x @ w.t(), 5).to_dense())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = linear_maxk(x.float(), 5, w.float(), b.float())
    assert cast.values.dtype == torch.bfloat16


def test_linear_maxk_checks_the_linear_output():
    """NaN in the Linear's output is named as maxk's input, at its (row, column); a width
    the weight does not take is torch's error."""
    from dgl_maxk.ops import linear_maxk
    x, w, b = torch.randn(6, 3), torch.randn(5, 3), torch.randn(5)
    w[2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"maxk input contains 6 NaN value\(s\), the first at "
                                         r"index \(0, 2\)"):
        linear_maxk(x, 2, w, b)
    assert linear_maxk(x, 2, w, b, check_nan=False).values.shape == (6, 2)
    with pytest.raises(RuntimeError):
        linear_maxk(torch.randn(6, 4), 2, w, b)


@pytest.mark.parametrize("p", [0.0, 0.5, 0.3, 1.0])
def test_relu_dropout_is_dropout_of_relu(p):
    """On the CPU the operator is torch's dropout of the ReLU (the same mask for the same
    seed), its head the output's first rows; the gradient, from the output's and the head's
    together, is that of relu -> dropout with the head a view; in eval mode, the ReLU."""
    from dgl_maxk.ops import relu_dropout
    x = torch.randn(50, 12, requires_grad=True)
    for num_head in (0, 7, 50):
        torch.manual_seed(5)
        out, head = relu_dropout(x, p, num_head=num_head)
        torch.manual_seed(5)
        want = F.dropout(F.relu(x), p)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert torch.equal(head, out[:num_head])
        g, gh = torch.randn_like(out), torch.randn_like(head)
        got = torch.autograd.grad((out * g).sum() + (head * gh).sum(), x)[0]
        expected = torch.autograd.grad((want * g).sum() + (want[:num_head] * gh).sum(), x)[0]
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    out, _ = relu_dropout(x, p, training=False)
    assert torch.equal(out, F.relu(x))
    x64 = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda xx: torch.cat(relu_dropout(xx, 0.0, num_head=3)), (x64,))
    # twice differentiable: the backward's own gradient (through the gradients it takes)
    assert torch.autograd.gradgradcheck(lambda xx: torch.cat(relu_dropout(xx, 0.0,
                                                                          num_head=3)), (x64,))


def test_relu_dropout_checks_its_input():
    """NaN named as the features, at its (row, column); a probability or head out of range,
    integer features: ValueErrors."""
    from dgl_maxk.ops import relu_dropout
    x = torch.randn(6, 4)
    x[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"features contains 1 NaN value\(s\), the first at "
                                         r"index \(3, 1\)"):
        relu_dropout(x, 0.5)
    assert relu_dropout(x, 0.5, check_nan=False)[0].shape == (6, 4)
    for kwargs, match in (({"p": 1.5}, "between 0 and 1"), ({"num_head": 7}, "num_head"),
                          ({"num_head": -1}, "num_head")):
        with pytest.raises(ValueError, match=match):
            relu_dropout(torch.randn(6, 4), **kwargs)
    with pytest.raises(ValueError, match="floating point"):
        relu_dropout(torch.ones(6, 4, dtype=torch.int64))


def test_layer_norm_op_refuses_what_torch_refuses():
    """A normalized_shape other than the input's last width gets torch's error, not a
    LayerNorm over the whole row (with weights of another width: a read past them on a GPU)."""
    from dgl_maxk.nn import LayerNorm
    from dgl_maxk.ops import layer_norm
    x, w, b = torch.randn(5, 8), torch.randn(8), torch.randn(8)
    with pytest.raises(RuntimeError) as want:
        torch.nn.functional.layer_norm(x, (4,), w, b)
    with pytest.raises(RuntimeError, match=re.escape(str(want.value))):
        layer_norm(x, (4,), w, b)
    with pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 8\]"):
        LayerNorm(8)(torch.randn(5, 16))


def test_maxk_and_cbsr_addmm_have_second_derivatives():
    """Their backwards make dense rows; with create_graph=True those are recorded too."""
    from dgl_maxk.ops import cbsr_addmm
    x = torch.randn(12, 10, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 10, dtype=torch.float64, requires_grad=True)
    c = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: maxk(t, 3).values, (x,))
    assert torch.autograd.gradgradcheck(lambda cc, ww: cbsr_addmm(cc, maxk(x, 3), ww) ** 2,
                                        (c, w))


def test_forward_loads_two_entries_a_lane_from_k_16():
    """Below k = 32 the forward's 8 lanes an edge (its private buffers need 8 busy lanes)
    load 2 entries each from k = 16 (k = 24: 16 lanes), 1 below, 4 from k = 32."""
    from dgl_maxk.backends.cuda import launch
    plans = {k: launch.spgemm_lanes(k, 256, True)[:2] for k in (8, 12, 16, 24, 32)}
    assert plans == {8: (8, 1), 12: (16, 1), 16: (8, 2), 24: (16, 2), 32: (8, 4)}
    with launch.overrides(cbsr_spgemm={"qv": 0}):  # wide loads off
        assert launch.spgemm_lanes(16, 256, True)[:2] == (16, 1)


@pytest.mark.parametrize("d", [32, 64, 256, 384, 512, 1024])
def test_top_k_bank_order_is_the_forwards_lane_plan(d):
    """The top-k kernel orders each row for the lanes the forward will use (CPU: the launch
    plans only): same L and QV, bank windows exactly where that order applies, and neither
    for a CBSR matrix too large to gain from them."""
    from dgl_maxk.backends.cuda import launch
    limit = launch.option("cbsr_spgemm", "banked_max_bytes")
    for k in sorted({1, 3, 8, 16, 24, 32, 48, 64, 128, d // 2, d} - {0}):
        if k > d:
            continue
        for rows in (4, limit // (k * 5) + 1):
            # stride-0 rows: the plans read shapes, dtypes and alignment, not data
            values = torch.zeros(1, k).expand(rows, k)
            indices = torch.zeros(1, k, dtype=torch.uint8 if d <= 256 else torch.int16
                                  ).expand(rows, k)
            cbsr_bytes = rows * k * (4 + indices.element_size())
            forward = launch.spgemm_config(k, d, values, indices)[0]
            assert k % forward["P_QV"] == 0  # a lane's wide load never passes the row's end
            order = launch.bank_order(k, d, cbsr_bytes)
            if order["ORDER_L"]:
                assert (order["ORDER_L"], order["ORDER_QV"]) == (forward["P_L"], forward["P_QV"])
                assert order["ORDER_STEPS"] * forward["P_L"] == k and k >= 2 * forward["P_L"]
                assert cbsr_bytes <= limit
            assert forward["P_BANKED"] == int(0 < order["ORDER_L"] < 32), (k, d, rows)
            top_k = launch.maxk_config(torch.zeros(1, d).expand(rows, d), d, k)[1]
            assert top_k.get("ORDER_L", 0) == order["ORDER_L"], (k, d, rows)


@pytest.mark.parametrize("d", [256, 1000])
def test_forward_entries_hold_each_value_with_its_index(d):
    """The forward gathers each entry in one load: half-precision values packed with their
    index in one 32-bit word (value low, index high), fp32 values of rows of at most
    ``pairs_max_k`` entries paired with it as two int32 (CPU: the writing and the launch
    plans; the GPU tests run the kernel)."""
    from dgl_maxk.backends.cuda import launch
    from dgl_maxk.backends.cuda.kernels import _entries
    from dgl_maxk.sparse.cbsr import index_dtype
    max_k = launch.option("cbsr_spgemm", "pairs_max_k")
    for k in (max_k, max_k + 1, max_k + 8):
        indices = torch.randint(0, d, (50, k)).to(index_dtype(d))
        for dtype in (torch.float16, torch.bfloat16):
            values = torch.randn(50, k).to(dtype)
            assert launch.spgemm_config(k, d, values, indices)[0]["P_PACKED"] == (
                launch.ENTRIES_PACKED)
            words = _entries(launch.ENTRIES_PACKED, values, indices)
            assert words.dtype == torch.int32 and words.shape == values.shape
            assert torch.equal(words & 0xffff,
                               values.view(torch.int16).to(torch.int32) & 0xffff)
            assert torch.equal(words >> 16, indices.to(torch.int32))
        values = torch.randn(50, k)
        assert launch.spgemm_config(k, d, values, indices)[0]["P_PACKED"] == (
            launch.ENTRIES_PAIRED if k <= max_k else launch.ENTRIES_APART)
        pairs = _entries(launch.ENTRIES_PAIRED, values, indices)
        assert pairs.dtype == torch.int32 and pairs.shape == (50, k, 2)
        assert torch.equal(pairs[..., 0], values.view(torch.int32))
        assert torch.equal(pairs[..., 1], indices.to(torch.int32))
        assert _entries(launch.ENTRIES_APART, values, indices) is values
        with launch.overrides(cbsr_spgemm={"packed": 0}):
            for v in (values, values.half()):
                assert launch.spgemm_config(k, d, v, indices)[0]["P_PACKED"] == (
                    launch.ENTRIES_APART)


def test_misaligned_cbsr_rows_take_one_entry_loads():
    """CBSR tensors at an odd storage offset (views into a larger buffer) cannot be read 4
    entries at a time: the SDDMM, the SSpMM and the forward with fp32 values of wide rows
    plan 1-entry loads; a forward on half-precision values or short fp32 rows writes its
    entries afresh (packed, paired) and keeps wide loads (CPU: the launch plans)."""
    from dgl_maxk.backends.cuda import launch
    n, k, d = 6, 32, 256
    gy = torch.zeros(n, d)

    def offset(t):  # the same rows one element into a larger buffer
        return torch.cat([t.new_zeros(1), t.flatten()])[1:].view_as(t)
    values, indices = torch.zeros(n, k), torch.zeros(n, k, dtype=torch.uint8)
    assert launch.sddmm_config(k, d, gy, values, indices)[0]["P_QV"] == 4
    assert launch.sddmm_config(k, d, gy, offset(values), indices)[0]["P_QV"] == 1
    assert launch.sddmm_config(k, d, gy, values, offset(indices))[0]["P_QV"] == 1
    assert launch.sspmm_config(k, d, gy, offset(indices))[0]["P_QV"] == 1
    assert launch.spgemm_config(k, d, offset(values), indices)[0]["P_QV"] == 1
    half = offset(values.to(torch.bfloat16))
    assert launch.spgemm_config(k, d, half, offset(indices))[0]["P_QV"] == 4
    short = 16  # 2-entry loads when aligned (launch.spgemm_lanes)
    with launch.overrides(cbsr_spgemm={"pairs_max_k": short}):
        forward = launch.spgemm_config(short, d, offset(values[:, :short].contiguous()),
                                       offset(indices[:, :short].contiguous()))[0]
    assert (forward["P_PACKED"], forward["P_QV"]) == (launch.ENTRIES_PAIRED, 2)


def test_forward_buffer_stride_fits_the_kernels_layout():
    """The buffer stride the launch hands the forward (d + ``P_PAD``) passes the kernel's
    checks (cbsr_spgemm.cu's static_asserts and its run-time trap) and fits its layout, for every
    width: private buffers at least d floats and L more than a multiple of 32 apart, so that
    each sub-group's column c has its own shared-memory bank, 16-byte aligned where rows
    are; bank windows holding every column; the shared memory asked for is the warps'
    buffers (CPU: the launch plans)."""
    from dgl_maxk.backends.cuda import launch
    for d in range(1, 600):
        for k in sorted({1, 4, 8, 16, 32, 64, d} & set(range(1, d + 1))):
            values = torch.zeros(1, k).expand(3, k)
            indices = torch.zeros(1, k, dtype=torch.uint8 if d <= 256 else torch.int16
                                  ).expand(3, k)
            defines, warps, smem, _ = launch.spgemm_config(k, d, values, indices)
            lanes, pad, banked = defines["P_L"], defines["P_PAD"], defines["P_BANKED"]
            stride, subs = d + pad, 32 // lanes  # one buffer per sub-group
            assert 0 <= pad < (lanes if banked else 32) and (d % 4 or pad % 4 == 0), (d, k)
            assert smem == warps * subs * stride * 4, (d, k)
            if banked:  # column c of sub-group s at (c / L) * 32 + s * L + c % L
                assert stride % lanes == 0, (d, k)
                last = ((d - 1) // lanes) * 32 + (subs - 1) * lanes + (d - 1) % lanes
                assert last < subs * stride, (d, k)
            elif subs == 1:
                assert pad == 0, (d, k)
            else:
                assert (stride - lanes) % 32 == 0, (d, k)
                assert len({(s * stride) % 32 for s in range(subs)}) == subs, (d, k)


def _log_uniform_int(low, high):
    return int(torch.empty(()).uniform_(math.log(low), math.log(high)).exp())


def test_sspmm_slices_are_the_fewest_that_fit_within_their_caps():
    """The SSpMM's source slices (CPU: the rule only), on sizes drawn log-uniformly: one slice
    for a dX within ``unsliced_bytes`` or for sources with few entries each (sampled blocks);
    otherwise the fewest slices of at most ``slice_bytes`` of dX, unless ``max_slices`` or the
    dY rereads (``reread_bytes``) stop them first; a forced count wins."""
    from dgl_maxk.backends.cuda import launch

    def opt(key):
        return launch.option("cbsr_sspmm", key)
    for _ in range(2000):
        n, k = _log_uniform_int(1, 5_000_000), _log_uniform_int(1, 257)
        dy_bytes = n * 4 * _log_uniform_int(1, 1025)
        entries = n * opt("min_source_entries") + int(torch.randint(0, n * 100, ()))
        dx_bytes, case = n * k * 4, (n, entries, k, dy_bytes)
        slices = launch.sspmm_slices(*case)
        assert 1 <= slices <= opt("max_slices"), case
        assert slices == 1 or slices * dy_bytes <= opt("reread_bytes"), case
        if dx_bytes <= opt("unsliced_bytes"):
            assert slices == 1, case
            continue
        capped = (slices == opt("max_slices")
                  or (slices + 1) * dy_bytes > opt("reread_bytes"))
        assert capped or -(-dx_bytes // slices) <= opt("slice_bytes"), case  # they fit
        assert slices == 1 or -(-dx_bytes // (slices - 1)) > opt("slice_bytes"), case  # fewest
        few = int(torch.randint(0, n * opt("min_source_entries"), ()))
        assert launch.sspmm_slices(n, few, k, dy_bytes) == 1, case
        with launch.overrides(cbsr_sspmm={"slices": 3}):
            assert launch.sspmm_slices(n, few, k, dy_bytes) == 3


def test_sspmm_slices_of_the_measured_cases():
    """The counts that the measurements in docs/performance.md chose (d = 256): (sources,
    entries, k) -> slices, with the dY rows of the graph's destinations in fp32."""
    from dgl_maxk.backends.cuda import launch
    reddit, products = (232_965, 114_615_892), (2_449_029, 123_718_280)
    medium, block = (200_000, 8_000_000), (598_575, 661_621)
    chosen = {(*reddit, 16): 1, (*reddit, 32): 1, (*reddit, 64): 4, (*products, 8): 3,
              (*products, 16): 3, (*products, 32): 3, (*medium, 32): 1, (*medium, 64): 4,
              (*block, 32): 1, (*block, 64): 1}
    for (n, entries, k), slices in chosen.items():
        num_dst = 54_365 if (n, entries) == block else n
        assert launch.sspmm_slices(n, entries, k, num_dst * 256 * 4) == slices, (n, k)


@pytest.mark.parametrize("slices", [1, 3])
def test_cuda_sspmm_asks_the_rule_with_its_sizes_and_walks_its_slices(monkeypatch, slices):
    """The CUDA backend's SSpMM (CPU: the kernel replaced by a recorder) asks
    ``sspmm_slices`` for (sources, entries, k, dY bytes as the fp32 it stages) and walks the
    plan's source slices when the answer is more than one, its edge groups otherwise."""
    from dgl_maxk.backends import cuda
    from dgl_maxk.backends.cuda import kernels, launch
    plan, _ = _sorted_plan(torch.randint(0, 40, (57,)), 90, int(torch.randint(0, 2**31, ())))
    d, k = 24, 5
    asked, walked = [], []

    def recorder(group_row, group_start, group_end, col, edge_values, row_scale, grad_y,
                 x_indices):
        walked.append((group_row, group_start, group_end))
        return torch.zeros(x_indices.shape)
    monkeypatch.setattr(launch, "sspmm_slices", lambda *sizes: asked.append(sizes) or slices)
    monkeypatch.setattr(kernels, "cbsr_sspmm", recorder)
    grad_y = torch.randn(plan.num_dst, d, dtype=torch.bfloat16)
    x_indices = torch.randint(0, d, (plan.num_src, k), dtype=torch.uint8)
    dx = cuda.cbsr_sspmm(plan, torch.rand(plan.num_edges), grad_y, x_indices)
    assert dx.shape == (plan.num_src, k) and dx.dtype == torch.bfloat16
    assert asked == [(plan.num_src, plan.num_edges, k, plan.num_dst * d * 4)]
    if slices > 1:
        want = plan.source_slices(launch.group_size(), slices)
    else:
        group_row, group_start = plan.edge_groups(launch.group_size())[:2]
        want = (group_row, group_start, group_start[1:])
    assert len(walked) == 1 and all(torch.equal(a, b) for a, b in zip(walked[0], want))


def test_launch_overrides_hold_in_other_threads_and_end_with_their_block():
    """Launch overrides reach every thread while their block runs (autograd computes a CUDA
    backward on its own thread), nest, and are gone after the block, also after an error."""
    import threading
    from dgl_maxk.backends.cuda import launch
    default = launch.group_size()
    default_slices = launch.option("cbsr_sspmm", "slices")

    def seen_in_a_thread():
        seen = []
        thread = threading.Thread(target=lambda: seen.append(
            (launch.group_size(), launch.option("cbsr_sspmm", "slices"))))
        thread.start()
        thread.join()
        return seen[0]

    with launch.overrides(group_size=32):
        assert seen_in_a_thread() == (32, default_slices)
        with launch.overrides(cbsr_sspmm={"slices": 3}):
            assert seen_in_a_thread() == (32, 3)
        assert seen_in_a_thread() == (32, default_slices)
    with pytest.raises(RuntimeError, match="inside"):
        with launch.overrides(group_size=8):
            raise RuntimeError("inside")
    assert seen_in_a_thread() == (default, default_slices)
    assert launch.group_size() == default
    outer = launch.overrides(group_size=16)
    outer.__enter__()
    try:
        with pytest.raises(RuntimeError, match="out of turn"):
            with launch.overrides(group_size=8):
                outer.__exit__(None, None, None)  # as another thread's block would end
    finally:
        del launch._OVERRIDES[1:]  # the outer block, which its error left in place


@pytest.mark.parametrize("d", [64, 256, 6144, 6148, 20000, 29060, 32768])
def test_backward_staged_rows_need_no_more_shared_memory_than_one_row(d):
    """SSpMM and SDDMM stage dY rows in shared memory: two per warp with ``prefetch``, but
    never more than one row needs where that is over the default 48 KiB (CPU: the launch
    plans only). Two rows of d = 32768 (256 KiB) pass every GPU's opt-in limit (227 KiB on
    sm_90, 163 KiB on sm_80), so the launch would fail at a width CBSR allows."""
    from dgl_maxk.backends.cuda import launch
    from dgl_maxk.backends.cuda.runtime import SMEM_DEFAULT
    grad_y = torch.zeros(1, d).expand(3, d)  # stride-0 rows: the plans read no data
    x_values = torch.zeros(1, 32).expand(3, 32)
    x_indices = torch.zeros(1, 32, dtype=torch.uint8 if d <= 256 else torch.int16
                            ).expand(3, 32)
    for name, (defines, warps, smem, _) in (
            ("cbsr_sspmm", launch.sspmm_config(32, d, grad_y, x_indices)),
            ("cbsr_sddmm", launch.sddmm_config(32, d, grad_y, x_values, x_indices))):
        assert smem == warps * (1 + defines["P_PREFETCH"]) * d * 4, name
        assert smem <= max(SMEM_DEFAULT, d * 4), (name, d, smem)
        assert smem <= 227 * 1024, (name, d, smem)  # sm_90's opt-in limit, the largest
        if d <= 1024:  # the widths measured with the prefetch keep it
            assert defines["P_PREFETCH"] == 1, (name, d)


def test_kernel_sources_paste_their_headers_in_full():
    """NVRTC compiles each kernel with no include path: every ``#include "x.cuh"``, a
    header's own included, is pasted in; the shared types stand once in each kernel."""
    from dgl_maxk.backends.cuda import runtime
    kernels = sorted(runtime.kernel_dir().glob("*.cu"))
    assert len(kernels) >= 6
    for kernel in kernels:
        text = runtime.source(kernel.stem)
        assert '#include "' not in text, kernel.name
        if "idx_t" in text:
            assert text.count("typedef unsigned char idx_t;") == 1, kernel.name
