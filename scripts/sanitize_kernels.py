"""Small runs of every CUDA kernel variant (the neighbour sampler's, the row gather's and the
dense-row kernels' too), for compute-sanitizer (memcheck, racecheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python scripts/sanitize_kernels.py
    compute-sanitizer --tool racecheck python scripts/sanitize_kernels.py

Prints one line per case with the relative error against the float64 reference, and exits
non-zero if any case is off.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # where _common is
from _common import Parser, run_script  # noqa: E402


def build_parser():
    """There are no options: --help, else an error for any argument."""
    return Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


if __name__ == "__main__":  # before torch and DGL load: see _common.py
    sys.exit(run_script(__file__, build_parser))

import torch  # noqa: E402

from dgl_maxk.backends import cuda, reference  # noqa: E402
from dgl_maxk.backends.cuda import launch  # noqa: E402
from dgl_maxk.cli import run_command  # noqa: E402
from dgl_maxk.sampling.sampler import _block_rows, block_indptr  # noqa: E402
from dgl_maxk.sparse import GraphPlan, index_dtype  # noqa: E402


def rel(a, b):
    a, b = a.double(), b.double()
    n = b.norm()
    return float((a - b).norm() / n) if n > 0 else float((a - b).norm())


def same_bits(a, b):
    """Bit-equal floats (NaN included, which torch.equal never calls equal)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def by_column(values, indices):
    """A CBSR's rows in ascending column order (the kernel may write them in its bank order)."""
    order = indices.long().argsort(dim=1)
    return values.gather(1, order), indices.gather(1, order)


def check_arguments(argv=None):
    """--help, else an error for any argument, or without a GPU."""
    parser = build_parser()
    parser.parse_args(argv)
    if not cuda.available():
        parser.error("no CUDA GPU with CuPy: these are checks of the CUDA kernels")


def main(argv=None) -> int:
    """The number of cases off (0: all fine); 130 / 143 after a Ctrl-C / SIGTERM."""
    check_arguments(argv)
    return run_command(check_kernels, "interrupted; the cases above ran")


def check_kernels() -> int:
    """Every case, a line each; the number of cases off."""
    torch.manual_seed(0)
    dev = "cuda"
    bad = 0
    for d, dtype in ((256, torch.float32), (64, torch.bfloat16), (384, torch.float16),
                     (1500, torch.float32), (33, torch.float32)):
        h = torch.randint(-3, 4, (37, d), device=dev).to(dtype)
        h[3, d // 2] = h[20, 0] = float("nan")
        for k in (1, 5, 32, d):
            counters, want = (torch.zeros(2, dtype=torch.int64, device=dev) for _ in range(2))
            v, i = cuda.maxk_cbsr(h, k, counters)
            rv, ri = reference.maxk_cbsr(h, k, want)
            v, i = by_column(v, i)
            dense = cuda.cbsr_to_dense(v, i, d)
            ok = (torch.equal(i, ri) and same_bits(v, rv) and torch.equal(counters, want)
                  and same_bits(dense, reference.cbsr_to_dense(rv, ri, d)))
            bad += not ok
            print(f"maxk, to_dense d={d} k={k} {dtype}: {'ok' if ok else 'MISMATCH'}")
    for d in (4, 256, 500, 1000):
        x = torch.randn(37, d, device=dev)
        w, b = torch.randn(d, device=dev), torch.randn(d, device=dev)
        y, mean, rstd = cuda.layer_norm(x, w, b, 1e-5)
        gy, mask = torch.randn_like(x), (True, True, True)
        gv = torch.randn(37, 3, device=dev)  # MaxK's gradient as CBSR, 3 entries a row
        gi = torch.rand(37, d, device=dev).argsort(1)[:, :3].to(index_dtype(d))
        err = max(rel(a, r) for a, r in zip(
            (y, mean, rstd, *cuda.layer_norm_backward(gy, x, mean, rstd, w, b, mask),
             *cuda.layer_norm_backward_cbsr(gv, gi, x, mean, rstd, w, b, mask)),
            (*reference.layer_norm(x, w, b, 1e-5),
             *reference.layer_norm_backward(gy, x, mean, rstd, w, b, mask),
             *reference.layer_norm_backward_cbsr(gv, gi, x, mean, rstd, w, b, mask))))
        sums_err = max(rel(a, r) for a, r in zip(cuda.cbsr_to_dense_sums(gv, gi, d),
                                                  reference.cbsr_to_dense_sums(gv, gi, d)))
        err = max(err, sums_err)
        fv, fi, fmean, frstd = cuda.layer_norm_maxk(x, w, b, 1e-5, 3, None)  # one kernel
        rv, ri = reference.maxk_cbsr(reference.layer_norm(x, w, b, 1e-5)[0], 3)
        err = max(err, rel(fmean, mean), rel(frstd, rstd),
                  rel(cuda.cbsr_to_dense(fv, fi, d), reference.cbsr_to_dense(rv, ri, d)))
        bad += not err < 1e-5
        print(f"layer_norm d={d}: {'ok' if err < 1e-5 else 'MISMATCH'} ({err:.1e})")
    for group_size in (8, launch.group_size()):
        with launch.overrides(group_size=group_size):
            bad += check_graph_kernels(group_size, dev)
    bad += check_sampler(dev)
    bad += check_gather_rows(dev)
    bad += check_nan_counters(dev)
    bad += check_relu_dropout(dev)
    torch.cuda.synchronize()
    print("all ok" if bad == 0 else f"{bad} case(s) off")
    return 1 if bad else 0


def check_graph_kernels(group_size, dev) -> int:
    """The three graph kernels on a small graph of awkward degrees; the number of bad cases."""
    bad = 0
    deg = torch.tensor([0, 1, 3, 40, 0, 2, 17, 9, 1, 25, 5], dtype=torch.int64)
    indptr = torch.zeros(deg.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    num_src = 13
    rows = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    indices = torch.randint(0, num_src, (int(indptr[-1]),))
    indices = indices[torch.argsort(rows * num_src + indices, stable=True)]  # source slices
    plan = GraphPlan(indptr.to(dev), indices.to(dev), torch.arange(indices.numel(),
                     device=dev), num_src, deg.numel())
    for d, k, dtype in ((256, 8, torch.float32), (256, 16, torch.float32),
                        (256, 32, torch.float32), (256, 24, torch.bfloat16),
                        (256, 64, torch.bfloat16), (33, 5, torch.float32),
                        (384, 16, torch.float16), (64, 3, torch.float32)):
        xv = torch.randn(num_src, k, device=dev).to(dtype)
        xi = torch.rand(num_src, d, device=dev).argsort(1)[:, :k].sort(1).values
        xi = xi.to(index_dtype(d))
        gy = torch.randn(plan.num_dst, d, device=dev)
        for values, ev, rs in (("edge values", torch.randn(plan.num_edges, device=dev), None),
                               ("row scales", None, torch.randn(plan.num_dst, device=dev))):
            ev64, rs64 = (None if t is None else t.double() for t in (ev, rs))
            want = reference.cbsr_sspmm(plan, ev64, gy.double(), xi, rs64)
            want_y = reference.cbsr_spgemm(plan, ev64, xv.double(), xi, d, rs64)
            errs = (
                rel(cuda.cbsr_spgemm(plan, ev, xv, xi, d, rs), want_y),
                rel(spgemm_apart(plan, ev, xv, xi, d, rs), want_y),
                rel(cuda.cbsr_sspmm(plan, ev, gy, xi, rs), want),
                rel(sliced_sspmm(plan, ev, gy, xi, rs), want),
                rel(cuda.cbsr_sddmm(plan, gy, xv, xi),
                    reference.cbsr_sddmm(plan, gy.double(), xv.double(), xi)),
            )
            ok = all(e < 1e-5 for e in errs)
            bad += not ok
            print(f"G={group_size} d={d} k={k} {dtype} {values}: spgemm/spgemm with entries "
                  f"apart/sspmm/sspmm in 3 source slices/sddmm rel err "
                  f"{' '.join(f'{e:.2e}' for e in errs)} {'ok' if ok else 'BAD'}")
    return bad


def spgemm_apart(plan, ev, xv, xi, d, rs):
    """The forward reading values and indices apart (neither packed nor paired)."""
    with launch.overrides(cbsr_spgemm={"packed": 0}):
        return cuda.cbsr_spgemm(plan, ev, xv, xi, d, rs)


def sliced_sspmm(plan, ev, gy, xi, rs):
    with launch.overrides(cbsr_sspmm={"slices": 3}):
        return cuda.cbsr_sspmm(plan, ev, gy, xi, rs)


def check_sampler(dev) -> int:
    """The neighbour sampler on rows of degree 0, at the fan-out, above it and far above it;
    the number of bad cases."""
    bad = 0
    deg = torch.tensor([0, 5, 6, 300, 1, 0, 4, 77, 2], dtype=torch.int64)
    indptr = torch.zeros(deg.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    dst = torch.tensor([3, 0, 1, 2, 7, 8, 4], device=dev)
    sources = torch.randint(0, 9, (int(indptr[-1]),), dtype=torch.int32, device=dev)
    edge_ids = torch.randperm(sources.numel(), device=dev)
    for fanout in (-1, 1, 5):
        rows, num_edges = block_indptr(indptr.to(dev), dst, fanout)
        draws = (torch.rand(dst.numel(), fanout, dtype=torch.float64, device=dev)
                 if fanout > 0 else None)
        args = (indptr.to(dev), sources, edge_ids, dst, rows, num_edges, fanout, draws)
        ok = all(torch.equal(a, b) for a, b in zip(cuda.sample_edges(*args),
                                                    reference.sample_edges(*args)))
        bad += not ok
        print(f"sample_edges fanout={fanout}: {'ok' if ok else 'MISMATCH'}")
    # the same rows then room holding ids out of range, their count on the device: the
    # kernels must read none of the room
    room = torch.cat([dst, torch.tensor([-5, 10 ** 12, 9], device=dev)])
    real = torch.tensor(dst.numel(), device=dev)
    rows = _block_rows(indptr.to(dev), room, 5, real)
    draws = torch.rand(room.numel(), 5, dtype=torch.float64, device=dev)
    args = (indptr.to(dev), sources, edge_ids, room, rows, room.numel() * 5, 5, draws, real)
    got, want = cuda.sample_block_edges(*args), reference.sample_block_edges(*args)
    num_edges, num_src = want[3].tolist()
    ok = got[3].tolist() == [num_edges, num_src] and all(
        torch.equal(g[:n], w[:n]) for g, w, n in zip(got, want, (num_src, num_edges, num_edges)))
    bad += not ok
    print(f"sample_block_edges over room: {'ok' if ok else 'MISMATCH'}")
    return bad


def check_gather_rows(dev) -> int:
    """Rows of pinned host tables read by the GPU (16-byte words, odd widths, an offset
    start); the number of bad cases."""
    bad = 0
    index = torch.tensor([4, 0, 8, 4, 7], device=dev)
    for shape in ((128,), (3,), (5, 3)):
        table = torch.randn((10,) + shape).pin_memory()
        for host in (table, table[1:]):
            ok = torch.equal(cuda.gather_rows(host, index), host[index.cpu()].to(dev))
            bad += not ok
            print(f"gather_rows {tuple(host.shape)}: {'ok' if ok else 'MISMATCH'}")
    return bad


def check_nan_counters(dev) -> int:
    """The NaN scan on tensors of whole 16-byte words, odd sizes and an offset start, fp32
    and fp16; the number of bad cases."""
    bad = 0
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(1001, device=dev, dtype=dtype)
        x[[3, 500, 999]] = float("nan")
        for scanned in (x[:1000], x[:999], x[1:]):
            ok = torch.equal(cuda.nan_counters(scanned), reference.nan_counters(scanned))
            bad += not ok
            print(f"nan_counters {scanned.numel()} {dtype}: {'ok' if ok else 'MISMATCH'}")
    return bad


def check_relu_dropout(dev) -> int:
    """ReLU and dropout forward (NaN counted, a head of some rows) and backward, on rows
    that end mid-block; the number of bad cases (the backward against the reference, the
    forward's kept values against the ReLU's)."""
    bad = 0
    for n, num_head, p in ((1001, 300, 0.5), (37, 37, 0.0), (5, 0, 1.0)):
        x = torch.randn(n, 36, device=dev)
        x[0, 3] = float("nan")
        counters = torch.zeros(2, dtype=torch.int64, device=dev)
        out, head = cuda.relu_dropout(x, torch.tensor(7, device=dev), p, num_head, counters)
        scale = reference.dropout_scale(p, torch.float32)
        kept = (out == 0) | (out == torch.relu(x) * scale) | x.isnan()
        grad, grad_head = torch.randn_like(out), torch.randn_like(head)
        ok = (bool(kept.all()) and same_bits(head, out[:num_head])
              and counters.tolist() == [1, n * 36 - 3]
              and torch.equal(cuda.relu_dropout_backward(out, grad, grad_head, p),
                              reference.relu_dropout_backward(out, grad, grad_head, p)))
        bad += not ok
        print(f"relu_dropout {n} x 36, head {num_head}, p {p}: {'ok' if ok else 'MISMATCH'}")
    return bad
