"""GPU tests of the CUDA kernels (dgl_maxk.backends.cuda) against the pure-torch reference in
float64.

Skipped without a CUDA GPU with CuPy. Every test draws a fresh seed (printed in failure
messages: re-run with DGL_MAXK_TEST_SEED=<seed> to reproduce). Outputs are checked for
unwritten entries by poisoning torch's caching allocator with NaN before each kernel call
(the kernels allocate their outputs with torch.empty where they do not need zeros).
"""
import itertools
import math
import os

import pytest
import torch

from dgl_maxk import backends, ops
from dgl_maxk.backends import cuda, reference
from dgl_maxk.backends.cuda import kernels as cuda_kernels, launch
from dgl_maxk.sampling.sampler import _block_rows, block_indptr
from dgl_maxk.sparse import GraphPlan, index_dtype

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA GPU with CuPy")

DEV = "cuda"
TOL = 1e-5
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def fresh_seed() -> int:
    env = os.environ.get("DGL_MAXK_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def poison():
    """Fill freed blocks of torch's caching allocator (small and large pools) with NaN."""
    blocks = [torch.full((n,), float("nan"), device=DEV) for n in
              (1 << 8, 1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)]
    del blocks


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if not torch.isfinite(out).all():
        return float("inf")
    norm = ref.norm()
    if norm == 0:
        return float((out - ref).norm())
    return float((out - ref).norm() / norm)


def make_plan(degrees, num_src, edge_ids=None):
    """A GraphPlan on the GPU with the given in-degrees and uniform random sources.

    (Keep num_edges <= num_dst * num_src: the reference's cuSPARSE CSR rejects more.)"""
    degrees = torch.as_tensor(degrees, dtype=torch.int64)
    indptr = torch.zeros(degrees.numel() + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    e = int(indptr[-1])
    indices = torch.randint(0, max(num_src, 1), (e,), dtype=torch.int64)
    if edge_ids is None:
        edge_ids = torch.randperm(e)
    return GraphPlan(indptr.to(DEV), indices.to(DEV), edge_ids.to(DEV), num_src,
                     degrees.numel())


def mixed_degrees(num_dst, group_size):
    """Empty rows, degree-1 rows, rows at and around the group size, hub rows far above it."""
    deg = torch.randint(0, 24, (num_dst,))
    special = [0, 1, 0, 1, group_size, group_size + 1, 3 * group_size + 7, group_size - 1, 2]
    for i, v in enumerate(special[:num_dst]):
        deg[(i * 7) % num_dst] = v
    return deg


def random_cbsr(n, k, d, dtype=torch.float32):
    values = torch.randn(n, k, device=DEV).to(dtype)
    cols = torch.rand(n, d, device=DEV).argsort(dim=1)[:, :k].sort(dim=1).values
    return values, cols.to(index_dtype(d))


def k_values(d):
    if d <= 384:
        return list(range(1, d + 1))
    ks = set(range(1, 70)) | set(range(70, d, 37)) | {96, 127, 128, 129, 255, 256, 257, d - 1, d}
    return sorted(k for k in ks if 1 <= k <= d)


# --------------------------------------------------------------------------------------------
# maxk_cbsr
# --------------------------------------------------------------------------------------------

def tie_heavy(n, d, dtype):
    """Rows of small integers (many ties), with -0 / +0 / +-inf and some continuous rows."""
    h = torch.randint(-3, 4, (n, d), device=DEV).to(torch.float32)
    h[::3] = torch.randn(h[::3].shape, device=DEV)
    zeros = torch.rand(n, d, device=DEV) < 0.2
    h[zeros] = 0.0
    neg_zero = torch.rand(n, d, device=DEV) < 0.1
    h[neg_zero] = -0.0
    if n > 2 and d > 2:
        h[1, 0], h[1, -1], h[2, 1] = float("inf"), float("-inf"), float("-inf")
    h[-1] = -0.0
    return h.to(dtype)


def same_bits(a, b):
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a, b)


def in_kernel_order(h, k, values, indices):
    """The reference's CBSR (ascending columns) in the order the CUDA kernel writes: the bank
    order of maxk_cbsr.cu where ``launch.maxk_config`` asks for it. Entries ranked by
    (column % L, column) go round the forward's k / L steps: rank m to step m % (k / L),
    lane m // (k / L); step s, lane l is entry (l + (s // QV) * L) * QV + s % QV."""
    defines = launch.maxk_config(h, h.shape[1], k)[1]
    lanes, qv = defines.get("ORDER_L", 0), defines.get("ORDER_QV", 1)
    if not lanes:
        return values, indices
    cols = indices.long()
    rank = torch.argsort((cols % lanes) * h.shape[1] + cols, dim=1, stable=True)
    m = torch.arange(k, device=cols.device)
    step, lane = m % (k // lanes), m // (k // lanes)
    slot = (lane + (step // qv) * lanes) * qv + step % qv
    src = torch.empty_like(rank)
    src[:, slot] = rank
    return values.gather(1, src), indices.gather(1, src)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [32, 64, 256, 384, 1024, 33, 1500, 4096])
def test_maxk_bit_identical(d, dtype):
    seed = fresh_seed()
    n = 67 if d <= 1024 else 13
    h = tie_heavy(n, d, dtype)
    ks = k_values(d) if d <= 1024 else [1, 2, 31, 32, 33, 64, 100, d // 2, d - 1, d]
    for k in ks:
        poison()
        v, i = cuda.maxk_cbsr(h, k)
        rv, ri = in_kernel_order(h, k, *reference.maxk_cbsr(h, k))
        assert i.dtype == ri.dtype and v.dtype == rv.dtype, (seed, k)
        assert torch.equal(i, ri), f"indices differ: seed={seed} d={d} k={k} {dtype}"
        assert same_bits(v, rv), f"values differ: seed={seed} d={d} k={k} {dtype}"


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [33, 256, 1500])
def test_maxk_nan_counters_match_the_reference(d, dtype):
    """The kernel's NaN count and first position (rows in registers, d <= 1024, and in
    shared memory) against the reference's, with the outputs still bit-identical."""
    seed = fresh_seed()
    n = 300
    h = torch.randn(n, d, device=DEV)
    nan_at = torch.rand(n, d, device=DEV) < torch.rand(n, 1, device=DEV) * 0.05
    nan_at[torch.rand(n, device=DEV) < 0.7] = False  # most rows clean
    nan_at[5, :] = True  # a row of NaN
    nan_at[n - 1, d - 1] = True  # the last element
    h[nan_at] = float("nan")
    h = h.to(dtype)
    clean = torch.randn(n, d, device=DEV).to(dtype)
    for x, expect_nan in ((h, True), (clean, False)):
        for k in (1, 7, min(32, d), d):
            got, want = (torch.zeros(2, dtype=torch.int64, device=DEV) for _ in range(2))
            v, i = cuda.maxk_cbsr(x, k, got)
            rv, ri = in_kernel_order(x, k, *reference.maxk_cbsr(x, k, want))
            assert torch.equal(got, want), f"seed={seed} d={d} k={k} {dtype}: {got} vs {want}"
            assert bool(got[0] > 0) == expect_nan, (seed, got)
            assert torch.equal(i, ri) and same_bits(v, rv), (seed, d, k)
    first = int(torch.isnan(h.float()).reshape(-1).nonzero()[0])
    counters = torch.zeros(2, dtype=torch.int64, device=DEV)
    cuda.maxk_cbsr(h, 3, counters)
    assert counters.tolist() == [int(nan_at.sum()), n * d - first], seed


def test_maxk_misaligned_and_strided():
    seed = fresh_seed()
    base = torch.randn(50, 257, device=DEV)
    h = base[:, 1:]  # not contiguous
    for k in (1, 8, 32, 256):
        v, i = cuda.maxk_cbsr(h, k)
        rv, ri = in_kernel_order(h, k, *reference.maxk_cbsr(h, k))
        assert torch.equal(i, ri) and same_bits(v, rv), (seed, k)
    flat = torch.randn(1 + 40 * 64, device=DEV)[1:].view(40, 64)  # rows 4-byte aligned only
    v, i = cuda.maxk_cbsr(flat, 16)
    rv, ri = in_kernel_order(flat, 16, *reference.maxk_cbsr(flat, 16))
    assert torch.equal(i, ri) and same_bits(v, rv), seed


def test_maxk_repeat_and_empty():
    seed = fresh_seed()
    h = torch.randn(1000, 256, device=DEV)
    a = cuda.maxk_cbsr(h, 32)
    b = cuda.maxk_cbsr(h, 32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), seed
    v, i = cuda.maxk_cbsr(torch.empty(0, 64, device=DEV), 5)
    assert v.shape == (0, 5) and i.shape == (0, 5)
    v, i = cuda.maxk_cbsr(h.double(), 7)  # float64: the reference
    rv, ri = reference.maxk_cbsr(h.double(), 7)
    assert torch.equal(v, rv) and torch.equal(i, ri)


# --------------------------------------------------------------------------------------------
# dense-row kernels: cbsr_to_dense, layer_norm
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [1, 3, 8, 33, 36, 256, 384, 1024, 1500])
def test_cbsr_to_dense_bit_identical(d, dtype):
    """Every k from 1 to d (a spread of them for wide rows), N not a multiple of the warps
    of a block, rows built in shared memory (whole 16-byte vectors) and rows that are not,
    and rows wider than the kernel's (the reference)."""
    seed = fresh_seed()
    n = 37
    for k in (k_values(d) if d <= 256 else [1, 2, 31, 32, 33, 255, d - 1, d]):
        values, indices = random_cbsr(n, k, d, dtype)
        poison()
        got = cuda.cbsr_to_dense(values, indices, d)
        want = reference.cbsr_to_dense(values, indices, d)
        assert got.dtype == dtype and same_bits(got, want), f"seed={seed} d={d} k={k} {dtype}"
    empty = cuda.cbsr_to_dense(*random_cbsr(0, 2, 8), 8)
    assert empty.shape == (0, 8)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("d", [4, 8, 36, 100, 256, 384, 1024, 6, 1500])
def test_cbsr_to_dense_sums_against_the_reference(d, dtype):
    """The dense rows bit for bit and the column sums within fp32 rounding of exact ones,
    for a spread of k from 1 to d: N not a multiple of a block's warps, N far above the
    resident warps (each adds up many rows), no rows; what the kernel does not take (bf16,
    d % 4 != 0, d > 1024) goes to the reference."""
    seed = fresh_seed()
    for n in (37, 60_001):
        for k in (k_values(d) if n < 100 and d <= 256 else sorted({1, 3, d // 2 + 1, d})):
            values, indices = random_cbsr(n, k, d, dtype)
            poison()
            dense, sums = cuda.cbsr_to_dense_sums(values, indices, d)
            assert same_bits(dense, reference.cbsr_to_dense(values, indices, d)), \
                f"seed={seed} d={d} k={k} n={n}"
            exact = reference.cbsr_to_dense_sums(values.double(), indices, d)[1]
            scale = reference.cbsr_to_dense(values.double().abs(), indices, d).sum(0)
            assert sums.dtype == torch.float32 and sums.shape == (d,)
            assert ((sums.double() - exact).abs() <= 1e-5 * scale).all(), \
                f"seed={seed} d={d} k={k} n={n}"
    dense, sums = cuda.cbsr_to_dense_sums(*random_cbsr(0, 2, d, dtype), d)
    assert dense.shape == (0, d) and sums.shape == (d,) and not sums.any()


def test_linear_maxk_op_through_the_kernels(monkeypatch):
    """ops.linear_maxk on the GPU: the CBSR of maxk(linear(x)) and the same gradients of x,
    weight and bias, the bias's from the column sums of the dense-rows kernel, and the same
    second derivatives."""
    seed = fresh_seed()
    calls = []
    real = cuda_kernels.cbsr_to_dense_sums
    monkeypatch.setattr(cuda_kernels, "cbsr_to_dense_sums",
                        lambda *a: calls.append(1) or real(*a))
    n, f, d, k = 5003, 104, 256, 32
    x = torch.randn(n, f, device=DEV, requires_grad=True)
    w = torch.randn(d, f, device=DEV, requires_grad=True)
    b = torch.randn(d, device=DEV, requires_grad=True)
    got = ops.linear_maxk(x, k, w, b)
    want = ops.maxk(ops.linear(x, w, b), k)
    assert torch.equal(got.to_dense(), want.to_dense()), seed
    g = torch.randn(n, k, device=DEV, requires_grad=True)
    grads = torch.autograd.grad(got.values, (x, w, b), g, create_graph=True)
    want_grads = torch.autograd.grad(want.values, (x, w, b), g, create_graph=True)
    assert calls == [1]
    for a, r in zip(grads, want_grads):
        assert rel_err(a, r) < 1e-5, seed
    # second derivatives (a gradient penalty) through the kernel's dense rows and sums
    penalty = [sum(t.square().sum() for t in ts) for ts in (grads, want_grads)]
    for a, r in zip(torch.autograd.grad(penalty[0], (w, g)),
                    torch.autograd.grad(penalty[1], (w, g))):
        assert rel_err(a, r) < 1e-5, seed


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [1, 3, 33, 256, 384, 1024])
def test_cbsr_gather_bit_identical(d, dtype):
    """The entries of a dense matrix at a CBSR pattern (uint8 and uint16 indices), as
    torch's gather takes them, for a spread of k from 1 to d, N not a multiple of a block's
    threads, a non-contiguous dense matrix, and no rows."""
    seed = fresh_seed()
    n = 37
    for k in sorted({1, 2, 7, 31, 32, 33, d // 2, d - 1, d} & set(range(1, d + 1))):
        _, indices = random_cbsr(n, k, d, dtype)
        dense = torch.randn(n, d, device=DEV).to(dtype)
        poison()
        got = cuda.cbsr_gather(dense, indices)
        want = reference.cbsr_gather(dense, indices)
        assert got.dtype == dtype and same_bits(got, want), f"seed={seed} d={d} k={k} {dtype}"
        strided = torch.randn(d, n, device=DEV).to(dtype).t()
        assert same_bits(cuda.cbsr_gather(strided, indices),
                         strided.gather(1, indices.long())), f"seed={seed} d={d} k={k}"
    empty = cuda.cbsr_gather(torch.randn(0, d, device=DEV).to(dtype), random_cbsr(0, 1, d)[1])
    assert empty.shape == (0, 1)


def test_second_derivatives_through_the_dense_row_kernels():
    """MaxK's backward and cbsr_addmm's make dense rows with the kernel; under
    create_graph=True the second derivative must match the float64 reference's."""
    seed = fresh_seed()
    x64 = torch.randn(40, 32, dtype=torch.float64)
    w64 = torch.randn(6, 32, dtype=torch.float64)

    def second(x, w):
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        c = torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
        out = (ops.cbsr_addmm(c, ops.maxk(x, 5), w) ** 2).sum() + (ops.maxk(x, 5).values ** 3).sum()
        gx, gw = torch.autograd.grad(out, (x, w), create_graph=True)
        return torch.autograd.grad(gx.sum() + gw.sum(), (x, w))

    for got, want in zip(second(x64.float().to(DEV), w64.float().to(DEV)), second(x64, w64)):
        assert rel_err(got.cpu(), want) < 1e-4, seed


def test_maxk_backward_is_the_dense_gradient():
    seed = fresh_seed()
    h = torch.randn(300, 256, device=DEV, requires_grad=True)
    g = torch.randn(300, 8, device=DEV)
    (got,) = torch.autograd.grad(ops.maxk(h, 8).values, h, g)
    expected = torch.zeros(300, 256, device=DEV).scatter_(
        1, ops.maxk(h, 8).indices.long(), g)
    assert torch.equal(got, expected), seed


@pytest.mark.parametrize("d", [4, 8, 252, 256, 384, 512, 516, 1024, 6, 1028])
def test_layer_norm_matches_torch(d):
    """Forward (y, mean, rstd) and backward against torch's LayerNorm in float64, on rows with
    a large offset (the variance is taken around the mean), N not a multiple of the warps of a
    block and larger than the backward's persistent grid; widths the kernels do not take
    (d % 4 != 0, d > 1024; the backward: d > 512) run torch's. The backward's reference takes
    the forward's fp32 mean and rstd, as the kernel does: at d = 4 some seeds draw a row of
    variance near 1e-3 under its offset of 100, whose gradient the mean's fp32 rounding alone
    moves by 1e-4 of the whole."""
    seed = fresh_seed()
    n = 40_001
    x = (torch.randn(n, d, device=DEV) * 3 + 100).requires_grad_()
    w = torch.randn(d, device=DEV, requires_grad=True)
    b = torch.randn(d, device=DEV, requires_grad=True)
    y, mean, rstd = cuda.layer_norm(x.detach(), w.detach(), b.detach(), 1e-5)
    ry, rmean, rrstd = reference.layer_norm(x.detach().double(), w.detach().double(),
                                            b.detach().double(), 1e-5)
    assert mean.shape == rmean.shape and rstd.shape == rrstd.shape
    for got, want in ((y, ry), (mean, rmean), (rstd, rrstd)):
        assert rel_err(got, want) < TOL, f"seed={seed} d={d}"
    gy = torch.randn(n, d, device=DEV)
    out = ops.layer_norm(x, (d,), w, b)
    grads = torch.autograd.grad(out, (x, w, b), gy)
    want_grads = reference.layer_norm_backward(
        *(t.detach().double() for t in (gy, x, mean, rstd, w, b)), (True, True, True))
    assert rel_err(out, ry) < TOL, seed
    for got, want in zip(grads, want_grads):
        assert rel_err(got, want) < 1e-4, f"seed={seed} d={d}"
    mask = (True, False, True)
    _, mean, rstd = cuda.layer_norm(x.detach(), w.detach(), b.detach(), 1e-5)
    parts = cuda.layer_norm_backward(gy, x.detach(), mean, rstd, w.detach(), b.detach(), mask)
    assert parts[1] is None and rel_err(parts[2], want_grads[2]) < 1e-4, seed
    empty = cuda.layer_norm_backward(gy[:0], x.detach()[:0], mean[:0], rstd[:0], w.detach(),
                                     b.detach(), (True, True, True))
    assert empty[0].shape == (0, d) and not empty[1].any() and not empty[2].any()


@pytest.mark.parametrize("d", [4, 8, 100, 256, 384, 512, 516, 1024])
def test_layer_norm_backward_from_cbsr_gradient(d):
    """The LayerNorm backward taking MaxK's gradient as CBSR (never dense) against the
    reference (the dense gradient, then torch's backward), for k from 1 to d, N not a
    multiple of a block's warps and larger than the persistent grid; widths the kernel does
    not take (d > 512) go through the dense path; empty input."""
    seed = fresh_seed()
    n = 20_003
    x = torch.randn(n, d, device=DEV) * 3 + 50
    w, b = torch.randn(d, device=DEV), torch.randn(d, device=DEV)
    _, mean, rstd = cuda.layer_norm(x, w, b, 1e-5)
    for k in sorted({1, 3, max(1, d // 8), d // 2 + 1, d}):
        gv = torch.randn(n, k, device=DEV)
        gi = torch.rand(n, d, device=DEV).argsort(1)[:, :k].to(index_dtype(d))
        got = cuda.layer_norm_backward_cbsr(gv, gi, x, mean, rstd, w, b, (True, True, True))
        want = reference.layer_norm_backward_cbsr(gv, gi, x, mean, rstd, w, b,
                                                  (True, True, True))
        for g, r in zip(got, want):
            assert rel_err(g, r) < 1e-4, f"seed={seed} d={d} k={k}"
    part = cuda.layer_norm_backward_cbsr(gv, gi, x, mean, rstd, w, b, (False, True, False))
    assert part[0] is None and part[2] is None and rel_err(part[1], want[1]) < 1e-4, seed
    empty = cuda.layer_norm_backward_cbsr(gv[:0], gi[:0], x[:0], mean[:0], rstd[:0], w, b,
                                          (True, True, True))
    assert empty[0].shape == (0, d) and not empty[1].any() and not empty[2].any()


@pytest.mark.parametrize("d", [4, 100, 128, 256, 260, 1024, 1028, 6])
def test_layer_norm_maxk_kernel_is_the_two_kernels(d):
    """The one-kernel LayerNorm + top-k against layer_norm then maxk_cbsr: the same bits
    (values, indices in the same order, mean, rstd, NaN counters) for k from 1 to d, N not a
    multiple of a block's warps, rows holding NaN; widths it does not take (d % 4 != 0,
    d > 1024) go through the two kernels."""
    seed = fresh_seed()
    n = 1_001
    x = torch.randn(n, d, device=DEV) * 2 + 7
    x[5, d // 2] = float("nan")
    w, b = torch.randn(d, device=DEV), torch.randn(d, device=DEV)
    y, mean, rstd = cuda.layer_norm(x, w, b, 1e-5)
    for k in sorted({1, 2, max(1, d // 8), d // 2 + 1, d}):
        counters, want_counters = (torch.zeros(2, dtype=torch.int64, device=DEV)
                                   for _ in range(2))
        got = cuda.layer_norm_maxk(x, w, b, 1e-5, k, counters)
        want = (*cuda.maxk_cbsr(y, k, want_counters), mean, rstd)
        for g, r in zip(got, want):
            assert torch.equal(g.view(torch.int8) if g.is_floating_point() else g,
                               r.view(torch.int8) if r.is_floating_point() else r), \
                f"seed={seed} d={d} k={k}"
        assert torch.equal(counters, want_counters) and counters[0] == d, seed
    empty = cuda.layer_norm_maxk(x[:0], w, b, 1e-5, 3, None)
    assert [t.shape[0] for t in empty] == [0, 0, 0, 0]


def test_layer_norm_maxk_op_through_the_kernels():
    """ops.layer_norm_maxk on the GPU: the CBSR of maxk(layer_norm(x)) and the same
    gradients of x, weight and bias, with the top-k kernel's NaN check on the normalised
    rows (a NaN of x makes its whole row NaN)."""
    seed = fresh_seed()
    d, k = 256, 32
    x = torch.randn(3001, d, device=DEV, requires_grad=True)
    w = torch.randn(d, device=DEV, requires_grad=True)
    b = torch.randn(d, device=DEV, requires_grad=True)
    got = ops.layer_norm_maxk(x, k, w, b)
    want = ops.maxk(ops.layer_norm(x, (d,), w, b), k)
    assert torch.equal(got.to_dense(), want.to_dense()), seed
    g = torch.randn(3001, k, device=DEV)
    order = want.indices.long().argsort(1)  # match the entries column by column
    g_want = torch.empty_like(g).scatter_(1, order, g.gather(1, got.indices.long().argsort(1)))
    grads = torch.autograd.grad(got.values, (x, w, b), g)
    want_grads = torch.autograd.grad(want.values, (x, w, b), g_want)
    for a, r in zip(grads, want_grads):
        assert rel_err(a, r) < 1e-4, seed
    bad = x.detach().clone()
    bad[17, 5] = float("nan")
    with pytest.raises(ValueError, match=r"features contains 256 NaN value\(s\), the first at "
                                         r"index \(17, 0\)"):
        ops.layer_norm_maxk(bad, k, w, b)


def test_layer_norm_weight_of_another_width_is_torchs_error():
    """The kernel reads weight and bias at every column of x: weights of another width get
    torch's error, not a read past their end."""
    x = torch.randn(37, 8, device=DEV)
    with pytest.raises(RuntimeError, match="same shape as normalized_shape"):
        cuda.layer_norm(x, torch.randn(4, device=DEV), torch.randn(4, device=DEV), 1e-5)
    torch.cuda.synchronize()


def test_layer_norm_misaligned_and_empty_rows():
    """Contiguous x, weight and bias that start off a 16-byte boundary (the kernel's float4
    loads), and rows of width 0, give torch's result."""
    seed = fresh_seed()
    n, d = 37, 256
    x = torch.randn(n * d + 1, device=DEV)[1:].view(n, d)
    w, b = (torch.randn(d + 1, device=DEV)[1:] for _ in range(2))
    for args in ((x, w, b), (x.clone(), w, b), (x, w.clone(), b.clone())):
        for got, want in zip(cuda.layer_norm(*args, 1e-5), reference.layer_norm(*args, 1e-5)):
            assert rel_err(got, want) < TOL, seed
    empty = torch.empty(5, 0, device=DEV)
    y, _, _ = cuda.layer_norm(empty, torch.empty(0, device=DEV), torch.empty(0, device=DEV), 1e-5)
    assert y.shape == (5, 0)
    torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# aggregation kernels
# --------------------------------------------------------------------------------------------

def a_values(plan):
    """A's values in each form the aggregation kernels take, as (name, edge values, row
    scales): one per edge; one per destination row (no edge values); none (all 1)."""
    return (("edge values", torch.randn(plan.num_edges, device=DEV), None),
            ("row scales", None, torch.randn(plan.num_dst, device=DEV)),
            ("ones", None, None))


def double(t):
    return None if t is None else t.double()


def check_all_three(plan, k, d, dtype=torch.float32, seed=None, tag=""):
    check_kernels_on(plan, *random_cbsr(plan.num_src, k, d, dtype), d, seed, tag)


def check_spgemm(plan, ev, rs, xv, xi, d, what):
    """The forward on CBSR (xv, xi), A's values ev or row scales rs, against the reference."""
    poison()
    y = cuda.cbsr_spgemm(plan, ev, xv, xi, d, rs)
    y_ref = reference.cbsr_spgemm(plan, double(ev), xv.double(), xi, d, double(rs))
    assert y.dtype == torch.promote_types(xv.dtype, torch.float32)
    err = rel_err(y, y_ref)
    assert err < TOL, f"spgemm err={err} k={xv.shape[1]} d={d} {xv.dtype} {what}"


def check_kernels_on(plan, xv, xi, d, seed, tag):
    """The forward, the SSpMM and the SDDMM on CBSR (xv, xi) against the reference."""
    k, dtype = xv.shape[1], xv.dtype
    gy = torch.randn(plan.num_dst, d, device=DEV)
    for name, ev, rs in a_values(plan):
        check_spgemm(plan, ev, rs, xv, xi, d, f"seed={seed} {name} {tag}")
        poison()
        gx = cuda.cbsr_sspmm(plan, ev, gy, xi, rs)
        gx_ref = reference.cbsr_sspmm(plan, double(ev), gy.double(), xi, double(rs))
        err = rel_err(gx, gx_ref)
        assert err < TOL, f"sspmm err={err} seed={seed} k={k} d={d} {name} {tag}"
    poison()
    ge = cuda.cbsr_sddmm(plan, gy, xv, xi)
    ge_ref = reference.cbsr_sddmm(plan, gy.double(), xv.double(), xi)
    err = rel_err(ge, ge_ref)
    assert err < TOL, f"sddmm err={err} seed={seed} k={k} d={d} {dtype} {tag}"


@pytest.fixture(params=[32, None], ids=["group32", "group_default"])
def group_size(request):
    with launch.overrides(group_size=request.param):
        yield launch.group_size()


@pytest.mark.parametrize("d", [32, 64, 256, 384, 1024])
def test_every_k(d, group_size):
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(37, group_size), num_src=200)
    for k in k_values(d):
        check_all_three(plan, k, d, seed=seed, tag=f"G={group_size}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [256, 384, 36, 33])
def test_dtypes_and_widths(d, dtype, group_size):
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(101, group_size), num_src=80)
    for k in sorted(k for k in {1, 3, 4, 8, 16, 17, 32, 64, min(d, 100), d} if k <= d):
        check_all_three(plan, k, d, dtype, seed=seed, tag=f"G={group_size}")


@pytest.mark.parametrize("packed", [1, 0], ids=["one_load", "apart"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [64, 384])
def test_spgemm_entries_in_one_load_or_apart(d, dtype, packed):
    """The forward's ways to gather CBSR entries, each value with its index in one load
    (half-precision values packed in a 32-bit word; fp32 ones paired, here at every k) or
    values and indices apart, against the reference: every k at d = 64 (8-bit indices), the
    forward's load widths at d = 384 (16-bit indices), each A form."""
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(61, launch.group_size()), num_src=90)
    ks = k_values(d) if d <= 64 else [1, 3, 4, 8, 16, 20, 32, 48, 64, 100, 128, 256, d]
    if not packed:
        form = launch.ENTRIES_APART
    else:
        form = launch.ENTRIES_PAIRED if dtype == torch.float32 else launch.ENTRIES_PACKED
    with launch.overrides(cbsr_spgemm={"packed": packed, "pairs_max_k": d}):
        for k in ks:
            xv, xi = random_cbsr(plan.num_src, k, d, dtype)
            assert launch.spgemm_config(k, d, xv, xi)[0]["P_PACKED"] == form
            for name, ev, rs in a_values(plan):
                check_spgemm(plan, ev, rs, xv, xi, d, f"seed={seed} {name}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_misaligned_cbsr_rows(dtype):
    """CBSR tensors at an odd storage offset (views into a larger buffer) cannot be read 4
    entries at a time: the SSpMM and the SDDMM take 1-entry loads, the forward too with fp32
    values of wide rows (half values and short fp32 rows it writes afresh, packed or
    paired), and all match the reference."""
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(50, launch.group_size()), num_src=70)
    for k in (8, 32):
        xv, xi = (torch.cat([t.new_zeros(1), t.flatten()])[1:].view_as(t)
                  for t in random_cbsr(plan.num_src, k, 256, dtype))
        gy = torch.randn(plan.num_dst, 256, device=DEV)
        assert launch.sddmm_config(k, 256, gy, xv, xi)[0]["P_QV"] == 1
        assert launch.sspmm_config(k, 256, gy, xi)[0]["P_QV"] == 1
        check_kernels_on(plan, xv, xi, 256, seed, f"misaligned k={k}")


@pytest.mark.parametrize("shape", [(37, 200), (61, 150), (1, 3000), (300, 30), (203, 203)])
def test_rectangular_blocks(shape, group_size):
    seed = fresh_seed()
    num_dst, num_src = shape
    plan = make_plan(mixed_degrees(num_dst, group_size), num_src=num_src)
    for k in (1, 8, 16, 32, 64):
        check_all_three(plan, k, 256, seed=seed, tag=f"shape={shape}")


def test_empty_graphs():
    seed = fresh_seed()
    for num_dst, num_src in ((5, 7), (0, 4), (4, 0)):
        plan = make_plan(torch.zeros(num_dst, dtype=torch.int64), num_src=num_src)
        xv, xi = random_cbsr(num_src, 8, 64)
        for _, ev, rs in a_values(plan):
            poison()
            y = cuda.cbsr_spgemm(plan, ev, xv, xi, 64, rs)
            assert y.shape == (num_dst, 64) and torch.equal(y, torch.zeros_like(y)), seed
            gx = cuda.cbsr_sspmm(plan, ev, torch.randn(num_dst, 64, device=DEV), xi, rs)
            assert gx.shape == (num_src, 8) and not gx.any(), seed
        ge = cuda.cbsr_sddmm(plan, torch.randn(num_dst, 64, device=DEV), xv, xi)
        assert ge.shape == (0,)


@pytest.mark.parametrize("hubs", [2, 30])
def test_spgemm_zeroes_the_rows_of_several_groups(hubs):
    """Rows split over several groups meet by atomic adds into zeros, zeroed first (and
    only they): few or most of the rows, on recycled NaN memory, every row comes out as the
    reference's."""
    seed = fresh_seed()
    g = launch.group_size()
    degrees = torch.randint(0, g + 1, (40,))
    degrees[:hubs] = torch.randint(g + 1, 3 * g, (hubs,))
    plan = make_plan(degrees[torch.randperm(40)], num_src=5 * g)
    multi_rows = plan.edge_groups(g)[3]
    assert multi_rows.numel() == hubs
    for k in (1, 8, 32):
        check_all_three(plan, k, 64, seed=seed, tag=f"hubs={hubs}")


def test_power_law_graph_multi_group():
    from dgl_maxk.data import power_law_csr
    seed = fresh_seed()
    indptr, indices = power_law_csr(3001, 400_000, seed=seed, device=DEV)
    assert int((indptr[1:] - indptr[:-1]).max()) > 2 * launch.group_size()
    plan = GraphPlan(indptr, indices, torch.arange(indices.numel(), device=DEV), 3001, 3001)
    for k in (8, 16, 32, 64):
        check_all_three(plan, k, 256, seed=seed, tag="power-law")


@pytest.mark.parametrize("slices", [2, 3, 7])
def test_sspmm_source_slices(slices, group_size):
    """The backward walking the edges source slice by source slice (rows sorted by source):
    the reference's result, with hubs, empty rows and rectangular blocks."""
    seed = fresh_seed()
    for num_dst, num_src in ((101, 150), (300, 30), (7, 2000)):
        plan = make_plan(mixed_degrees(num_dst, group_size), num_src=num_src)
        order = torch.argsort(plan.dst_of_edge * num_src + plan.indices, stable=True)
        plan = GraphPlan(plan.indptr, plan.indices[order], plan.edge_ids[order], num_src,
                         num_dst)
        assert plan.rows_sorted_by_source()
        d = 64 if num_dst != 300 else 33  # d % 4 != 0: rows staged without the prefetch
        gy = torch.randn(num_dst, d, device=DEV)
        for k, (name, ev, rs) in itertools.product((1, 3, 8, 32, 64), a_values(plan)):
            if k > d:
                continue
            _, xi = random_cbsr(num_src, k, d)
            poison()
            with launch.overrides(cbsr_sspmm={"slices": slices}):
                gx = cuda.cbsr_sspmm(plan, ev, gy, xi, rs)
            assert (launch.group_size(), slices) in plan._source_slices  # the sliced walk ran
            err = rel_err(gx, reference.cbsr_sspmm(plan, double(ev), gy.double(), xi,
                                                   double(rs)))
            assert err < TOL, (f"sliced sspmm err={err} seed={seed} k={k} {num_dst}x{num_src} "
                               f"{name}")


def test_determinism():
    seed = fresh_seed()
    plan = make_plan(torch.randint(0, launch.group_size() + 1, (500,)), num_src=500)
    xv, xi = random_cbsr(500, 32, 256)
    ev = torch.rand(plan.num_edges, device=DEV)
    gy = torch.randn(500, 256, device=DEV)
    # rows of at most group_size entries: the forward promises bit-identical repeats
    for _, ev_, rs in a_values(plan):
        y1 = cuda.cbsr_spgemm(plan, ev_, xv, xi, 256, rs)
        y2 = cuda.cbsr_spgemm(plan, ev_, xv, xi, 256, rs)
        assert torch.equal(y1, y2), seed
    e1 = cuda.cbsr_sddmm(plan, gy, xv, xi)
    e2 = cuda.cbsr_sddmm(plan, gy, xv, xi)
    assert torch.equal(e1, e2), seed
    # sspmm uses atomics: equal up to rounding only
    g1 = cuda.cbsr_sspmm(plan, ev, gy, xi)
    g2 = cuda.cbsr_sspmm(plan, ev, gy, xi)
    assert rel_err(g1, g2) < 1e-6, seed


# --------------------------------------------------------------------------------------------
# through the operators (weightings computed by the ops layer)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["none", "left", "right", "both"])
@pytest.mark.parametrize("weighted", [False, True])
def test_ops_cbsr_spgemm_weightings(norm, weighted, monkeypatch):
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(83, 32), num_src=90)
    d, k = 256, 16
    h = torch.randn(90, d, device=DEV)
    w = torch.rand(plan.num_edges, device=DEV) + 0.1 if weighted else None

    g = torch.randn(plan.num_dst, d, device=DEV, dtype=torch.float64)

    def run(h_in, w_in):
        h_in = h_in.clone().requires_grad_(True)
        w_in = None if w_in is None else w_in.clone().requires_grad_(True)
        x = ops.maxk(h_in, k)
        y = ops.cbsr_spgemm(plan, x, edge_weight=w_in, norm=norm)
        (y * g.to(y.dtype)).sum().backward()
        return y, h_in.grad, None if w_in is None else w_in.grad

    assert backends.for_tensor(h) is cuda
    with launch.overrides(group_size=32):
        out = run(h, w)
    monkeypatch.setattr(backends, "for_tensor", lambda tensor: reference)
    ref = run(h.double(), None if w is None else w.double())
    for name, a, b in zip(("y", "grad_h", "grad_w"), out, ref):
        if b is None:
            assert a is None
            continue
        err = rel_err(a, b)
        assert err < TOL, f"{name} err={err} seed={seed} norm={norm} weighted={weighted}"


# --------------------------------------------------------------------------------------------
# neighbour sampling
# --------------------------------------------------------------------------------------------

def _in_edge_csr(degrees, index_dtype_):
    """A graph's in-edge CSR on the GPU: node i has ``degrees[i]`` random in-neighbours."""
    degrees = torch.as_tensor(degrees, dtype=torch.int64)
    indptr = torch.zeros(len(degrees) + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    indices = torch.randint(0, len(degrees), (int(indptr[-1]),), dtype=index_dtype_)
    return indptr.to(DEV), indices.to(DEV)


@pytest.mark.parametrize("fanout", [-1, 1, 2, 5, 15, 64, 65])
@pytest.mark.parametrize("index_dtype_, eid_dtype", [(torch.int32, torch.int32),
                                                     (torch.int64, torch.int64),
                                                     (torch.int32, None)])
def test_sample_edges_match_reference(fanout, index_dtype_, eid_dtype):
    """The kernels give each row the reference's entry count, and pick and read what the
    reference picks from the same draws: rows of degree 0, at the fan-out, just above it,
    and hubs far above it; the graph's source and edge ids of either width, or no edge ids;
    the fan-out above the kernel's limit goes to the reference."""
    seed = fresh_seed()
    n = 3001  # not a multiple of the block
    degrees = torch.randint(0, 40, (n,))
    degrees[torch.randperm(n)[:50]] = 0
    degrees[torch.randperm(n)[:5]] = torch.randint(2000, 5000, (5,))
    degrees[:3] = max(fanout, 1) + torch.arange(3)  # at and just above the fan-out
    g_indptr, g_indices = _in_edge_csr(degrees, index_dtype_)
    # edge ids that are the CSR positions: the picks themselves
    eids = (None if eid_dtype is None else
            torch.arange(g_indices.numel(), device=DEV, dtype=eid_dtype))
    dst = torch.randperm(n, device=DEV)[:1700]
    counts = cuda.block_degrees(g_indptr, dst, fanout)
    assert torch.equal(counts, reference.block_degrees(g_indptr, dst, fanout)), seed
    b_indptr, num_edges = block_indptr(g_indptr, dst, fanout)
    assert torch.equal(b_indptr.diff(), counts), seed
    draws = (torch.rand(dst.numel(), fanout, dtype=torch.float64, device=DEV)
             if fanout > 0 else None)
    args = (g_indptr, g_indices, eids, dst, b_indptr, num_edges, fanout, draws)
    poison()
    got_src, got_eid = cuda.sample_edges(*args)
    want_src, want_eid = reference.sample_edges(*args)
    assert got_src.dtype == index_dtype_ and torch.equal(got_src, want_src), seed
    if eid_dtype is None:
        assert got_eid is None and want_eid is None
        return
    assert got_eid.dtype == torch.int64 and torch.equal(got_eid, want_eid), seed
    # every pick is an in-edge of its row, without repeats
    row = torch.repeat_interleave(torch.arange(dst.numel(), device=DEV), b_indptr.diff())
    assert bool(((got_eid >= g_indptr[dst][row]) & (got_eid < g_indptr[dst + 1][row])).all())
    assert got_eid.unique().numel() == got_eid.numel(), seed
    assert torch.equal(got_src, g_indices[got_eid]), seed


@pytest.mark.parametrize("num_nodes", [10, 3001, 200_000])
@pytest.mark.parametrize("index_dtype_", [torch.int32, torch.int64])
def test_relabel_sources_match_reference(num_nodes, index_dtype_):
    """The hash-table relabelling gives the reference's source nodes and local ids: sources
    that repeat many times (10 nodes) or rarely, that are destination nodes or new, a block
    whose rows hold nothing, and room past the edge count holding ids that must be skipped;
    n not a multiple of the block."""
    seed = fresh_seed()
    n = min(1001, num_nodes)
    dst = torch.randperm(num_nodes, device=DEV)[:n]
    degrees = torch.randint(0, 8, (n,), device=DEV)
    degrees[torch.randperm(n, device=DEV)[:n // 3]] = 0
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=DEV)
    torch.cumsum(degrees, 0, out=indptr[1:])
    num_edges = int(indptr[-1])
    capacity = num_edges + 777
    poison()
    sources = torch.randint(0, num_nodes, (capacity,), device=DEV, dtype=index_dtype_)
    src_nodes, local, counts = cuda_kernels.relabel_sources(dst, sources, indptr)
    want_nodes, want_local = reference.relabel_sources(dst, sources[:num_edges])
    assert counts.tolist() == [num_edges, want_nodes.numel()], seed
    assert torch.equal(src_nodes[:want_nodes.numel()], want_nodes), seed
    assert torch.equal(local[:num_edges], want_local), seed
    assert torch.equal(want_nodes[want_local], sources[:num_edges].long()), seed
    empty = torch.zeros(n + 1, dtype=torch.int64, device=DEV)
    src_nodes, _, counts = cuda_kernels.relabel_sources(dst, sources, empty)
    assert counts.tolist() == [0, n] and torch.equal(src_nodes[:n], dst), seed
    # the same rows followed by room (ids the kernels must skip), their count on the device;
    # the table bounded by the graph's node count
    real = int(torch.randint(0, n + 1, ()))
    room = torch.cat([dst[:real], torch.randint(-2 ** 40, 2 ** 40, (n - real,), device=DEV)])
    flat = torch.cat([indptr[:real + 1], indptr[real].expand(n - real)])
    num_edges = int(indptr[real])
    src_nodes, local, counts = cuda_kernels.relabel_sources(
        room, sources, flat, torch.tensor(real, device=DEV), num_nodes)
    want_nodes, want_local = reference.relabel_sources(dst[:real], sources[:num_edges])
    assert counts.tolist() == [num_edges, want_nodes.numel()], seed
    assert torch.equal(src_nodes[:want_nodes.numel()], want_nodes), seed
    assert torch.equal(local[:num_edges], want_local), seed


@pytest.mark.parametrize("fanout", [1, 5, 15])
def test_sample_block_edges_match_reference(fanout):
    """A block sampled into room for the most the fan-out allows is the reference's block
    (exact sizes, the same source nodes, local ids and edge ids) from the same draws."""
    seed = fresh_seed()
    g_indptr, g_indices, eids = _graph_with_hubs(2000)
    dst = torch.randperm(2000, device=DEV)[:777]
    b_indptr, _ = block_indptr(g_indptr, dst, fanout)
    draws = torch.rand(dst.numel(), fanout, dtype=torch.float64, device=DEV)
    args = (g_indptr, g_indices, eids, dst, b_indptr, dst.numel() * fanout, fanout, draws)
    assert_same_block(cuda.sample_block_edges(*args), reference.sample_block_edges(*args),
                      seed)


def _graph_with_hubs(n):
    """(indptr, indices, edge ids) of an in-edge CSR of ``n`` nodes of in-degree 0 to 29 and
    three hubs of 3,000 in-edges, its edge ids a random order."""
    degrees = torch.randint(0, 30, (n,))
    degrees[torch.randperm(n)[:3]] = 3000
    g_indptr, g_indices = _in_edge_csr(degrees, torch.int32)
    return g_indptr, g_indices, torch.randperm(g_indices.numel(), device=DEV)


def assert_same_block(got, want, seed):
    """Two backends' (src_nodes, local, edge_ids, counts): the same counts, and the same
    tensors up to them (the kernels' are sized for the most the fan-out allows)."""
    num_edges, num_src = want[3].tolist()
    assert got[3].tolist() == [num_edges, num_src], seed
    for g, w, size in zip(got[:3], want[:3], (num_src, num_edges, num_edges)):
        assert g.dtype == w.dtype == torch.int64 and torch.equal(g[:size], w[:size]), seed


@pytest.mark.parametrize("real", [0, 1, 700, 777])
@pytest.mark.parametrize("fanout", [4, -1])
def test_a_block_over_room_is_the_block_of_the_real_rows(real, fanout):
    """Destination rows whose count is on the device (the hop before's): the rows past it
    hold anything (ids out of range, negative) and add nothing; the block is the one of the
    real rows, in either backend, and its row pointers are theirs, then flat."""
    seed = fresh_seed()
    g_indptr, g_indices, eids = _graph_with_hubs(2000)
    room = torch.randint(-2 ** 40, 2 ** 40, (1001,), device=DEV)  # n not a multiple of a block
    room[:real] = torch.randperm(2000, device=DEV)[:real]
    rows = torch.tensor(real, device=DEV)
    want_indptr, num_edges = block_indptr(g_indptr, room[:real], fanout)
    for backend in (cuda, reference):
        got = backend.block_degrees(g_indptr, room, fanout, rows)
        assert torch.equal(got[:real], want_indptr.diff()), (seed, backend.__name__)
        assert not got[real:].any(), (seed, backend.__name__)
        # a count past the rows given: all of them, none past them
        past = torch.tensor(real + 5, device=DEV)
        assert torch.equal(backend.block_degrees(g_indptr, room[:real], fanout, past),
                           want_indptr.diff()), (seed, backend.__name__)
    indptr = _block_rows(g_indptr, room, fanout, rows)
    assert torch.equal(indptr[:real + 1], want_indptr) and bool((indptr[real:] == num_edges).all())
    draws = torch.rand(room.numel(), max(fanout, 1), dtype=torch.float64, device=DEV)
    capacity = num_edges if fanout < 0 else room.numel() * fanout
    want = reference.sample_block_edges(g_indptr, g_indices, eids, room[:real], want_indptr,
                                        num_edges, fanout, draws[:real] if fanout > 0 else None)
    for backend in (cuda, reference):
        poison()
        got = backend.sample_block_edges(g_indptr, g_indices, eids, room, indptr, capacity,
                                         fanout, draws if fanout > 0 else None, rows)
        assert_same_block(got, want, (seed, backend.__name__))


@pytest.mark.parametrize("dtype, shape", [(torch.float32, (128,)), (torch.float32, (3,)),
                                          (torch.uint8, (32,)), (torch.float16, (5, 3)),
                                          (torch.int64, ())])
def test_gather_rows_reads_device_and_pinned_host_rows(dtype, shape, monkeypatch):
    """The kernel reads the rows of a device table and, directly, of a pinned host table:
    index_select's rows, bit for bit, for rows of whole 16-byte words and odd widths, a
    table starting off a word boundary, repeated and unordered ids; unpinned host tables
    take the reference, with the same rows."""
    seed = fresh_seed()
    table = (torch.randn((5001,) + shape) * 100).to(dtype)
    index = torch.randint(0, 5000, (3001,), device=DEV)
    launches = []
    kernel = cuda_kernels.gather_rows
    monkeypatch.setattr(cuda_kernels, "gather_rows",
                        lambda *args: launches.append(1) or kernel(*args))
    stored_tables = (table.pin_memory(), table.pin_memory()[1:], table.to(DEV),
                     table.to(DEV)[1:])
    for stored in stored_tables:
        poison()
        got = cuda.gather_rows(stored, index)
        want = stored.index_select(0, index.to(stored.device)).to(DEV)
        assert got.device == index.device and torch.equal(got, want), seed
    assert len(launches) == len(stored_tables)
    assert torch.equal(cuda.gather_rows(table, index), table[index.cpu()].to(DEV)), seed
    assert len(launches) == len(stored_tables)  # an unpinned host table: the reference
    assert cuda.gather_rows(table.pin_memory(), index[:0]).shape == (0,) + shape


def with_nan(x, count):
    """``x`` with ``count`` NaN at random flat positions (repeats allowed), and infinities,
    which are not NaN, elsewhere."""
    flat = x.view(-1)
    if flat.numel():
        flat[torch.randint(0, flat.numel(), (3,), device=x.device)] = float("inf")
        flat[torch.randint(0, flat.numel(), (count,), device=x.device)] = float("nan")
    return x


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_counters_are_the_reference_in_one_read(dtype):
    """Count and first position of NaN, as the reference's: tensors of whole 16-byte words
    and of odd sizes, views starting off a word boundary, one large enough that each thread
    strides several times, none, one or many NaN (the first and last elements included),
    every element NaN, none at all."""
    seed = fresh_seed()
    n = int(torch.randint(1, 3000, ()))
    # (shape of a fresh tensor, the view of it scanned)
    cases = [((n, 256), lambda t: t), ((7, 13), lambda t: t),
             ((n * 64 + 1,), lambda t: t[1:]), ((n * 64 + 3,), lambda t: t[3:-2]),
             ((900_000, 33), lambda t: t)]
    for shape, view in cases:
        for count in (0, 1, int(torch.randint(2, 500, ()))):
            scanned = with_nan(view(torch.randn(shape, device=DEV, dtype=dtype)), count)
            want = reference.nan_counters(scanned)
            assert torch.equal(cuda.nan_counters(scanned), want), (seed, shape, count)
        edges = view(torch.randn(shape, device=DEV, dtype=dtype))
        edges.view(-1)[0], edges.view(-1)[-1] = float("nan"), float("nan")
        assert cuda.nan_counters(edges).tolist() == [2, edges.numel()], seed
        edges.view(-1)[0] = 1.0
        assert cuda.nan_counters(edges).tolist() == [1, 1], seed
        every = view(torch.full(shape, float("nan"), device=DEV, dtype=dtype))
        assert cuda.nan_counters(every).tolist() == [every.numel()] * 2, seed
    assert cuda.nan_counters(torch.empty(0, 5, device=DEV, dtype=dtype)).tolist() == [0, 0]


def test_a_layer_names_the_first_nan_of_its_gpu_input_as_on_the_cpu(monkeypatch):
    """The layers' NaN check of dense GPU input (the kernel's one read, once a call): the
    CPU's error, eagerly and inside deferred_checks, on the same block (all in-edges of 120
    nodes)."""
    import dgl
    from dgl_maxk import deferred_checks, library
    from dgl_maxk.nn import SAGEConv
    scans = []
    scan = library.nan_counters
    monkeypatch.setattr(library, "nan_counters", lambda x: scans.append(1) or scan(x))
    from dgl_maxk.sampling import DeviceGraph
    from dgl_maxk.sampling.sampler import sample_block
    seed = fresh_seed()
    g = dgl.rand_graph(300, 2000)
    block = sample_block(DeviceGraph.from_dgl(g, "cpu"), torch.arange(120), -1)
    x = with_nan(torch.randn(block.num_src_nodes(), 16), int(torch.randint(1, 40, ())))
    conv = SAGEConv(16, 8, "mean")
    with pytest.raises(ValueError) as on_cpu:
        conv(block, x)
    block = sample_block(DeviceGraph.from_dgl(g, DEV), torch.arange(120, device=DEV), -1)
    conv, x = conv.to(DEV), x.to(DEV)
    with pytest.raises(ValueError) as on_gpu:
        conv(block, x)
    assert "NaN" in str(on_cpu.value) and str(on_gpu.value) == str(on_cpu.value), seed
    with pytest.raises(ValueError) as deferred:
        with deferred_checks():
            conv(block, x)
    assert str(deferred.value) == str(on_cpu.value), seed
    assert len(scans) == 2, seed  # the GPU calls' scans; the CPU's is torch's


# --------------------------------------------------------------------------------------------
# torch.library / torch.compile
# --------------------------------------------------------------------------------------------

#: opcheck's comparisons of two calls: the atomic adds of long rows and of the backward sum
#: in an order that differs from call to call (fp32), then round to the features' dtype.
OPCHECK_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def test_opcheck_on_rows_of_several_edge_groups():
    """The aggregation ops of dgl_maxk.library (tests/test_compile.py checks every op on
    short rows) on rows longer than the kernels' edge groups, hubs and empty rows, in each
    value dtype."""
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(40, launch.group_size()), num_src=200)
    graph = (plan.indptr, plan.indices, plan.num_src)
    ops_ = torch.ops.dgl_maxk
    for dtype in FLOATS:
        xv, xi = random_cbsr(200, 8, 64, dtype)
        gy = torch.randn(40, 64, device=DEV).to(dtype)
        tol = {"rtol": OPCHECK_TOL[dtype], "atol": OPCHECK_TOL[dtype]}
        for weight, norm in ((None, "both"), (torch.rand(plan.num_edges, device=DEV), "right")):
            torch.library.opcheck(ops_.cbsr_spgemm.default,
                                  (*graph, weight, norm, xv.requires_grad_(), xi, 64), **tol)
            torch.library.opcheck(ops_.cbsr_sspmm.default, (*graph, weight, norm, gy, xi),
                                  **tol)
        torch.library.opcheck(ops_.cbsr_sddmm.default, (*graph, "left", gy, xv.detach(), xi),
                              **tol)
    del seed


def test_torch_compile():
    seed = fresh_seed()
    plan = make_plan(mixed_degrees(50, launch.group_size()), num_src=200)
    h = torch.randn(200, 64, device=DEV)

    def f(h_in):
        x = ops.maxk(h_in, 8)
        return ops.cbsr_spgemm(plan, x, norm="right").relu().sum(1)

    expected = f(h)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(h)
    assert rel_err(got, expected) < TOL, seed


# --------------------------------------------------------------------------- ReLU, dropout

def philox_bits(words: int, seed: int) -> torch.Tensor:
    """Philox4x32-10 of counters (w, 0, 0, 0) for w < words, key seed, in int64 torch ops:
    the bits relu_dropout.cu draws for each element (words x 4, each in [0, 2^32))."""
    low = 0xFFFFFFFF
    w = torch.arange(words, dtype=torch.int64, device=DEV)
    c = [w & low, w >> 32, torch.zeros_like(w), torch.zeros_like(w)]
    k0, k1 = seed & low, (seed >> 32) & low
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + 0x9E3779B9) & low, (k1 + 0xBB67AE85) & low
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]  # wraps mod 2^64 (two's complement)
        c = [((p1 >> 32) & low) ^ c[1] ^ k0, p1 & low, ((p0 >> 32) & low) ^ c[3] ^ k1, p0 & low]
    return torch.stack(c, 1)


def expected_relu_dropout(x, seed, p):
    """dropout(relu(x)) with relu_dropout.cu's mask, in torch."""
    scale = reference.dropout_scale(p, torch.float32)
    bits = philox_bits(x.numel() // 4, seed).reshape(x.shape)
    kept = bits >= min(math.ceil(p * 2 ** 32), 2 ** 32)
    relu = torch.where((x > 0) | x.isnan(), x, torch.zeros_like(x))
    return relu * torch.where(kept, scale, 0.0).to(x.dtype)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_relu_dropout_is_its_philox_mask_bit_for_bit(p):
    """Each element as the torch Philox of its word under the seed says: rows not a multiple
    of the block, a head of no rows, some and all, no rows at all; NaN counted and kept
    (as torch's dropout keeps them), a second seed another mask, the kept share 1 - p."""
    seed = fresh_seed()
    for n, d, num_head in ((1, 4, 0), (1000, 256, 37), (333, 36, 333), (0, 8, 0),
                           (70_001, 100, 5000)):
        x = torch.randn(n, d, device=DEV)
        if n:
            x.view(-1)[torch.randint(0, x.numel(), (5,))] = float("nan")
        key = int(torch.randint(0, 2 ** 62, ()))
        counters, want_counters = (torch.zeros(2, dtype=torch.int64, device=DEV)
                                   for _ in range(2))
        poison()
        out, head = cuda.relu_dropout(x, torch.tensor(key, device=DEV), p, num_head, counters)
        reference.relu_dropout(x, None, 0.0, 0, want_counters)
        want = expected_relu_dropout(x, key, p)
        assert same_bits(out, want), (seed, n, d, p)
        assert same_bits(head, out[:num_head]), (seed, n, d, num_head)
        assert torch.equal(counters, want_counters), (seed, counters, want_counters)
        other, _ = cuda.relu_dropout(x, torch.tensor(key ^ 1, device=DEV), p, 0)
        positive = x > 0
        if 0 < p < 1 and positive.sum() > 10_000:
            kept = float((out[positive] != 0).double().mean())
            spread = 5 * (p * (1 - p) / float(positive.sum())) ** 0.5
            assert abs(kept - (1 - p)) < spread, (seed, kept, p)
            assert not torch.equal((other != 0), (out != 0)), seed


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_relu_dropout_backward_is_the_reference(p):
    """The gradient from out's and head's gradients (head of no rows, some, all), as the
    reference's, bit for bit; fp32 of rows not a multiple of 4, and bf16, go to the
    reference."""
    seed = fresh_seed()
    for n, d, num_head in ((1000, 256, 37), (333, 36, 333), (5, 8, 0), (0, 8, 0)):
        x = torch.randn(n, d, device=DEV)
        out, _ = cuda.relu_dropout(x, torch.tensor(seed, device=DEV), p, num_head)
        grad = torch.randn(n, d, device=DEV)
        grad_head = torch.randn(num_head, d, device=DEV)
        poison()
        got = cuda.relu_dropout_backward(out, grad, grad_head, p)
        assert same_bits(got, reference.relu_dropout_backward(out, grad, grad_head, p)), seed
    for x in (torch.randn(40, 6, device=DEV), torch.randn(40, 8, device=DEV).bfloat16()):
        out, head = cuda.relu_dropout(x, torch.tensor(seed, device=DEV), 0.5, 3)
        assert torch.equal(head, out[:3]) and ((out == 0) | (out == 2 * x)).all(), seed
        grad, grad_head = torch.randn_like(out), torch.randn_like(head)
        assert torch.equal(cuda.relu_dropout_backward(out, grad, grad_head, 0.5),
                           reference.relu_dropout_backward(out, grad, grad_head, 0.5)), seed


def test_relu_dropout_second_derivatives_through_the_kernels():
    """A gradient penalty through the fused operator (kernels both ways, p = 0.5, a head)
    matches the same model written with its mask (read off the output) in torch: the
    second pass goes through the backward's gradient inputs."""
    seed = fresh_seed()
    a = torch.randn(300, 12, device=DEV)
    w1 = torch.randn(12, 64, device=DEV, requires_grad=True)
    w2 = torch.randn(64, 8, device=DEV, requires_grad=True)

    def penalty(out, head):
        y = (out @ w2).square().sum() + (head @ w2).sum()
        grad, = torch.autograd.grad(y, w1, create_graph=True)
        return torch.autograd.grad(grad.square().sum(), (w1, w2))
    out, head = ops.relu_dropout(a @ w1, 0.5, num_head=40)
    want = (a @ w1) * ((out != 0).float() * 2)
    for got, expected in zip(penalty(out, head), penalty(want, want[:40])):
        assert rel_err(got, expected) < TOL, seed


def test_relu_dropout_draws_a_new_mask_each_graph_replay():
    """Under a CUDA graph the op's seed comes from torch's generator at each replay: new
    masks each replay, and the same sequence again after the same torch.manual_seed."""
    seed = fresh_seed()
    x = torch.rand(512, 64, device=DEV) + 0.5
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.relu_dropout(x, 0.5)  # warm-up: compile, allocate
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = ops.relu_dropout(x, 0.5, check_nan=False)

    def masks():
        torch.manual_seed(seed)
        taken = []
        for _ in range(3):
            graph.replay()
            taken.append(out != 0)
        return taken
    first, again = masks(), masks()
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2]), seed
    assert all(torch.equal(a, b) for a, b in zip(first, again)), seed
