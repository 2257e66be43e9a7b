"""Benchmark the CUDA kernels of dgl_maxk against cuSPARSE and torch.topk, in one run.

For each graph (power-law, dgl_maxk.data.power_law_csr) and each k:

* forward  ``cbsr_spgemm`` (Y = A X, X in CBSR)      vs cuSPARSE SpMM on dense d-wide X
  (``torch.sparse.mm`` on a CSR tensor, the kernel DGL uses on GPUs);
* backward ``cbsr_sspmm`` (A^T dY sampled at X)      vs cuSPARSE A^T dY (transposed CSR);
* top-k    ``maxk_cbsr``  (dense -> CBSR)             vs ``torch.topk``;
* (also ``cbsr_sddmm``, the edge-weight gradient, for information);
* the mean aggregation as the layers run it: A's values are each row's 1 / in-degree, given
  once per row (``row_scale``); the forward and backward again with one value per edge, as
  with edge weights (``fwd_edge_values_ms``, ``bwd_edge_values_ms``), for information;
* the forward again with the CBSR values in bf16 (fp32 accumulation), against fp32 values;
* the forward again on rows whose kept columns are skewed, as trained layers' are (a few
  columns kept by most rows: up to 30x the mean share on the Reddit-sized SAGE model), where
  the uniform random rows of the other timings keep every column alike.

Times are medians of CUDA-event timed runs after warm-up, with the L2 cache flushed before
each run; achieved bandwidth counts the bytes each kernel must move (gathers counted once per
edge) against a measured device-to-device copy. Writes JSON (--out) and prints a markdown table.

Each kernel is also set against its own floor, the least time the hardware allows. Two ceilings
are measured once per run: the DRAM bandwidth (a 1 GiB device-to-device copy, read + write
bytes) and the L2 read bandwidth (one kernel reading a 16 MiB buffer, which fits in L2, 64
times with loads that skip L1). Each kernel's bytes split into

* DRAM bytes, each input and output once: the CSR stream (E x (4 B int32 column + 4 B fp32
  value); the SDDMM reads the columns and writes one fp32 gradient per edge), the CBSR matrix
  (N x k x (value + index bytes)), dense d-wide rows (N x d x 4 B);
* L2 bytes, the per-edge work that hits the cache: the forward and the SDDMM gather one CBSR
  row per edge (E x k x (value + index bytes)); the backward gathers the indices (E x k x index
  bytes) and makes E x k fp32 atomic adds into dX (E x k x 4 B). Top-k has no L2 term.

floor = max(DRAM bytes / DRAM bandwidth, L2 bytes / L2 bandwidth), and "x floor" = time /
floor (1.0 would be at the hardware limit). The L2 figure is what a streaming read reaches;
random gathers of short rows reach less, so the L2 floors are optimistic. A second markdown
table shows each kernel's time, floor and x floor.

A Ctrl-C or SIGTERM prints and writes the graphs and k measured before it (the JSON marked
``"interrupted": true``), then exits 130 or 143.

    python scripts/bench_kernels.py --out bench.json              # Reddit- and products-sized
    python scripts/bench_kernels.py --graphs tiny --reps 3 --device cpu   # smoke test, no GPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # where _common is
from _common import Parser, positive_int, run_script  # noqa: E402

# nodes, edges, max in-degree (Reddit's is about 51k; products' natural draw is ~13k)
GRAPHS = {
    "reddit": (232_965, 114_615_892, 51_000),
    "products": (2_449_029, 123_718_280, None),
    "tiny": (1_000, 20_000, None),
}


def graph_list(text: str) -> str:
    """``--graphs``: names of :data:`GRAPHS` or NODES:EDGES, comma-separated, for argparse."""
    for name in text.split(","):
        sizes = name.split(":")
        if name not in GRAPHS and not (len(sizes) == 2 and all(s.isdigit() and int(s) > 0
                                                                 for s in sizes)):
            raise argparse.ArgumentTypeError(f"{name!r} is neither a graph of "
                                             f"{sorted(GRAPHS)} nor NODES:EDGES")
    return text


def k_list(text: str) -> str:
    """``--ks``: positive integers, comma-separated, for argparse."""
    for k in text.split(","):
        positive_int(k)
    return text


def build_parser():
    """The command line, on the standard library alone (:func:`parse_args` checks the rest)."""
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--graphs", type=graph_list, default="reddit,products",
                   help="comma list of reddit, products, tiny, or NODES:EDGES")
    p.add_argument("--d", type=positive_int, default=256)
    p.add_argument("--ks", type=k_list, default="8,16,32,64", help="comma list, each <= --d")
    p.add_argument("--reps", type=positive_int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tune", action="store_true",
                   help="also time kernel variants and edge-group sizes on the first graph")
    p.add_argument("--tune-only", action="store_true",
                   help="with --tune: skip the main table (faster)")
    p.add_argument("--out", default=None, help="JSON output path")
    return p


if __name__ == "__main__":  # before torch and DGL load: see _common.py
    sys.exit(run_script(__file__, build_parser))

import torch  # noqa: E402

from dgl_maxk import envinfo  # noqa: E402
from dgl_maxk.cli import measure_then_write, run_command  # noqa: E402
from dgl_maxk.backends import cuda, reference  # noqa: E402
from dgl_maxk.backends.cuda import launch  # noqa: E402
from dgl_maxk.data import power_law_csr  # noqa: E402
from dgl_maxk.sparse import GraphPlan  # noqa: E402
from dgl_maxk.training.checkpoint import signals_deferred  # noqa: E402

#: the CPU smoke test's arguments (the reference path on a tiny graph: seconds, not the
#: many minutes of the default, Reddit- and products-sized graphs on a CPU)
CPU_SMOKE_ARGS = "--device cpu --graphs tiny --reps 3"
# (key prefix, name in the tables) of the kernels set against their floors, in table order
FLOOR_KERNELS = (("fwd", "forward"), ("bwd", "backward"), ("topk", "top-k"),
                 ("sddmm", "sddmm"))


def parse_args(argv):
    """The arguments, checked before any work."""
    p = build_parser()
    args = p.parse_args(argv)
    if max(int(k) for k in args.ks.split(",")) > args.d:
        p.error(f"argument --ks: every k must be <= --d {args.d}, got {args.ks}")
    if args.device == "cuda" and not cuda.available():
        p.error(f"no CUDA GPU with CuPy: for a smoke test on the CPU, pass {CPU_SMOKE_ARGS}")
    return args


def timer(fn, reps, warmup, flush, device):
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(device, reps, nbytes=1 << 30):
    """DRAM: GB/s (read + write) of one device-to-device copy of ``nbytes``."""
    a = torch.empty(nbytes // 4, device=device).uniform_()
    b = torch.empty_like(a)
    ms = timer(lambda: b.copy_(a), reps, 2, None, device)
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9


# Reads a buffer ``passes`` times through L2 only (ld.global.cg skips L1): L2 read bandwidth.
L2_READ_SOURCE = r"""
extern "C" __global__ void l2_read(const float4* __restrict__ a, long long n4, int passes,
                                   float* out) {
    float acc = 0.f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int p = 0; p < passes; ++p)
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
            const float4 v = __ldcg(a + i);
            acc += v.x + v.y + v.z + v.w;
        }
    if (acc == 12345.678f) out[0] = acc;  // keeps the loads
}
"""


def l2_bandwidth(device, reps, nbytes=16 << 20, passes=64):
    """L2: GB/s read by one kernel that reads a 16 MiB buffer (it fits in L2) ``passes``
    times, bypassing L1 (CUDA only; on the CPU, a sum over a stride-0 expansion stands in)."""
    a = torch.empty(nbytes // 4, device=device).uniform_()
    if device.type != "cuda":
        rows = a.unsqueeze(0).expand(passes, -1)
        return passes * nbytes / (timer(lambda: rows.sum(0), reps, 2, None, device) * 1e-3) / 1e9
    import cupy  # optional dependency: the GPU path only
    kern = cupy.RawKernel(L2_READ_SOURCE, "l2_read")
    out = torch.empty(1, device=device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    args = (cupy.uint64(a.data_ptr()), cupy.int64(a.numel() // 4), cupy.int32(passes),
            cupy.uint64(out.data_ptr()))
    ms = timer(lambda: kern((sms * 4,), (512,), args), reps, 2, None, device)
    return passes * nbytes / (ms * 1e-3) / 1e9


def build_graph(gname, seed, device):
    """The graph, its plan, edge values and edge groups, each step timed: (g, plan, ev)."""
    gpu = device.type == "cuda"
    n, e, cap = GRAPHS[gname] if gname in GRAPHS else (*map(int, gname.split(":")), None)
    t0 = time.perf_counter()
    indptr, indices = power_law_csr(n, e, seed=seed, device=device, max_degree=cap)
    if gpu:
        torch.cuda.synchronize()
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = GraphPlan(indptr, indices, torch.arange(e, device=device), n, n)
    ev = plan.edge_values("right", None, torch.float32)
    if gpu:
        torch.cuda.synchronize()
    t_plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    if gpu:  # the CPU reference does not use edge groups
        groups = plan.edge_groups(launch.group_size())
        torch.cuda.synchronize()
    t_groups = time.perf_counter() - t0
    g = {"name": gname, "nodes": n, "edges": e, "max_in_degree": int(plan.in_degrees.max()),
         "generate_s": t_gen, "plan_s": t_plan, "edge_groups_s": t_groups,
         "num_groups": int(groups[0].numel()) if gpu else 0,
         "group_size": launch.group_size(), "k": {}}
    print(f"\n{gname}: {n} nodes, {e} edges, max in-degree {g['max_in_degree']}; "
          f"generate {t_gen:.2f} s, plan {t_plan:.2f} s, edge groups {t_groups:.3f} s "
          f"({g['num_groups']} groups)", flush=True)
    return g, plan, ev


def time_cusparse(g, plan, ev, x_dense, dy, reps, args, flush, device):
    """cuSPARSE on dense d-wide features, forward and backward-equivalent (A^T dY), into g."""
    n = g["nodes"]
    adj = torch.sparse_csr_tensor(plan.indptr, plan.indices, ev, (n, n))
    t_indptr, t_indices, perm = plan.transpose()
    adj_t = torch.sparse_csr_tensor(t_indptr, t_indices, ev[perm], (n, n))
    g["cusparse_fwd_ms"] = timer(lambda: torch.sparse.mm(adj, x_dense), reps, args.warmup,
                                 flush, device)
    g["cusparse_bwd_ms"] = timer(lambda: torch.sparse.mm(adj_t, dy), reps, args.warmup,
                                 flush, device)
    print(f"cuSPARSE SpMM d={args.d}: forward {g['cusparse_fwd_ms']:.3f} ms, A^T dY "
          f"{g['cusparse_bwd_ms']:.3f} ms", flush=True)


def skewed_rows(n, d, device, seed):
    """N x d rows whose top k concentrate on a few columns, as trained layers' do: Gaussian
    rows plus a per-column offset (1.5 standard deviations' spread)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)  # its own generator: the same rows whatever ran before
    offsets = 1.5 * torch.randn(d, generator=gen, device=device)
    return torch.randn(n, d, generator=gen, device=device) + offsets


def column_skew(indices, d) -> float:
    """How often the most kept column is kept, against the mean column (1.0: uniform)."""
    counts = torch.bincount(indices.flatten().long(), minlength=d).double()
    return float(counts.max() / counts.mean())


def time_k(k, g, plan, ev, h, dy, impl, args, flush, device, h_skewed):
    """One k: our kernels, torch.topk, the speedups and the achieved bandwidths."""
    d, e, n = args.d, g["edges"], g["nodes"]
    xv, xi = impl.maxk_cbsr(h, k)
    r = {}
    r["topk_ms"] = timer(lambda: impl.maxk_cbsr(h, k), args.reps, args.warmup, flush, device)
    r["torch_topk_ms"] = timer(lambda: torch.topk(h, k, dim=1), args.reps, args.warmup,
                               flush, device)
    rs = plan.node_scale("right", "dst", torch.float32)  # the mean, as the layers run it
    r["fwd_ms"] = timer(lambda: impl.cbsr_spgemm(plan, None, xv, xi, d, rs), args.reps,
                        args.warmup, flush, device)
    r["bwd_ms"] = timer(lambda: impl.cbsr_sspmm(plan, None, dy, xi, rs), args.reps,
                        args.warmup, flush, device)
    r["fwd_edge_values_ms"] = timer(lambda: impl.cbsr_spgemm(plan, ev, xv, xi, d), args.reps,
                                    args.warmup, flush, device)
    r["bwd_edge_values_ms"] = timer(lambda: impl.cbsr_sspmm(plan, ev, dy, xi), args.reps,
                                    args.warmup, flush, device)
    r["sddmm_ms"] = timer(lambda: impl.cbsr_sddmm(plan, dy, xv, xi), args.reps, args.warmup,
                          flush, device)
    xv_bf16 = xv.to(torch.bfloat16)
    r["fwd_bf16_values_ms"] = timer(lambda: impl.cbsr_spgemm(plan, None, xv_bf16, xi, d, rs),
                                    args.reps, args.warmup, flush, device)
    r["bf16_values_speedup"] = r["fwd_ms"] / r["fwd_bf16_values_ms"]
    sv, si = impl.maxk_cbsr(h_skewed, k)
    r["skewed_column_skew"] = column_skew(si, d)
    r["fwd_skewed_ms"] = timer(lambda: impl.cbsr_spgemm(plan, None, sv, si, d, rs), args.reps,
                               args.warmup, flush, device)
    del sv, si
    r["fwd_speedup"] = g["cusparse_fwd_ms"] / r["fwd_ms"]
    r["bwd_speedup"] = g["cusparse_bwd_ms"] / r["bwd_ms"]
    r["topk_speedup"] = r["torch_topk_ms"] / r["topk_ms"]
    # bytes that must move: CSR stream (int32 column + fp32 value), one CBSR row gather per
    # edge (fp32 value + index per entry), dense rows once; the same sums as earlier JSON files
    # so that their GB/s stay comparable (the floors below split them more finely).
    ib = xi.element_size()
    stream = e * 8
    r["fwd_GBps"] = (stream + e * k * (4 + ib) + n * d * 4) / r["fwd_ms"] / 1e6
    r["bwd_GBps"] = (stream + e * k * (4 + ib) + n * d * 4) / r["bwd_ms"] / 1e6
    r["topk_GBps"] = (n * d * 4 + n * k * (4 + ib)) / r["topk_ms"] / 1e6
    r["value_bytes"], r["index_bytes"] = xv.element_size(), ib
    print(f"k={k:3d}: fwd {r['fwd_ms']:.3f} ms ({r['fwd_speedup']:.2f}x), bwd "
          f"{r['bwd_ms']:.3f} ms ({r['bwd_speedup']:.2f}x), sddmm {r['sddmm_ms']:.3f} "
          f"ms, top-k {r['topk_ms']:.3f} ms vs torch.topk {r['torch_topk_ms']:.3f} ms "
          f"({r['topk_speedup']:.2f}x); forward with bf16 values "
          f"{r['fwd_bf16_values_ms']:.3f} ms ({r['bf16_values_speedup']:.2f}x fp32's); on "
          f"skewed columns ({r['skewed_column_skew']:.1f}x the mean share) "
          f"{r['fwd_skewed_ms']:.3f} ms; with a value per edge fwd "
          f"{r['fwd_edge_values_ms']:.3f} ms, bwd {r['bwd_edge_values_ms']:.3f} ms",
          flush=True)
    return r


def kernel_bytes(n, e, d, k, vb, ib):
    """{kernel prefix: (DRAM bytes, L2 bytes)}: each input and output once from DRAM; the
    per-edge gathers (and the backward's atomic adds into dX) through L2."""
    cbsr = n * k * (vb + ib)
    dense = n * d * 4
    return {
        "fwd": (e * 8 + cbsr + dense, e * k * (vb + ib)),  # CSR, X (CBSR) -> Y
        # CSR, dY, X's indices -> dX sampled at X (fp32)
        "bwd": (e * 8 + dense + n * k * (ib + 4), e * k * ib + e * k * 4),
        "topk": (dense + cbsr, 0),  # H -> CBSR
        # columns, dY, X (CBSR) -> one fp32 gradient per edge
        "sddmm": (e * 4 + dense + cbsr + e * 4, e * k * (vb + ib)),
    }


def add_floors(r, n, e, d, k, dram_gbps, l2_gbps):
    """Each kernel's bytes, floor (ms), the term that bounds it and time / floor, into r."""
    for name, (dram, l2) in kernel_bytes(n, e, d, k, r["value_bytes"],
                                         r["index_bytes"]).items():
        dram_ms, l2_ms = dram / dram_gbps / 1e6, l2 / l2_gbps / 1e6
        r[f"{name}_dram_bytes"], r[f"{name}_l2_bytes"] = dram, l2
        r[f"{name}_floor_ms"] = max(dram_ms, l2_ms)
        r[f"{name}_floor_bound"] = "DRAM" if dram_ms >= l2_ms else "L2"
        r[f"{name}_of_floor"] = r[f"{name}_ms"] / r[f"{name}_floor_ms"]


def bench_graph(gname, impl, ceilings, args, flush, device, graphs):
    """One graph: build it, time cuSPARSE, then every k (and --tune); its dict joins
    ``graphs`` once cuSPARSE is timed and takes each k as it is timed, so that a Ctrl-C
    keeps what was measured."""
    g, plan, ev = build_graph(gname, args.seed, device)
    n, d = g["nodes"], args.d
    x_dense = torch.randn(n, d, device=device)
    dy = torch.randn(n, d, device=device)
    time_cusparse(g, plan, ev, x_dense, dy, 2 if args.tune_only else args.reps, args, flush,
                  device)
    graphs.append(g)
    h = torch.randn(n, d, device=device)
    h_skewed = skewed_rows(n, d, device, args.seed)
    for k in ([] if args.tune_only else [int(k) for k in args.ks.split(",")]):
        r = time_k(k, g, plan, ev, h, dy, impl, args, flush, device, h_skewed)
        add_floors(r, n, g["edges"], d, k, *ceilings)
        g["k"][k] = r
    if args.tune and device.type == "cuda" and gname == args.graphs.split(",")[0]:
        g["tune"] = tune(plan, h, dy, d, args, flush, device)


def print_speedup_table(result):
    print(f"\n{result['device']}, d = {result['d']}, copy bandwidth {result['copy_GBps']:.0f} "
          "GB/s; times in ms (median), speedup = baseline / ours\n")
    print("| graph | k | forward | cuSPARSE | speedup | backward | cuSPARSE A^T | speedup "
          "| top-k | torch.topk | speedup | fwd GB/s | bwd GB/s | sddmm | fwd, bf16 values "
          "(vs fp32) | fwd, skewed columns (skew) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for g in result["graphs"]:
        for k, r in g["k"].items():
            print(f"| {g['name']} | {k} | {r['fwd_ms']:.3f} | {g['cusparse_fwd_ms']:.2f} | "
                  f"{r['fwd_speedup']:.1f}x | {r['bwd_ms']:.3f} | {g['cusparse_bwd_ms']:.2f} | "
                  f"{r['bwd_speedup']:.1f}x | {r['topk_ms']:.3f} | {r['torch_topk_ms']:.3f} | "
                  f"{r['topk_speedup']:.1f}x | {r['fwd_GBps']:.0f} | {r['bwd_GBps']:.0f} | "
                  f"{r['sddmm_ms']:.3f} | {r['fwd_bf16_values_ms']:.3f} "
                  f"({r['bf16_values_speedup']:.2f}x) | {r['fwd_skewed_ms']:.3f} "
                  f"({r['skewed_column_skew']:.1f}x) |")


def floor_bounds(result):
    """Which term bounds each kernel's floor: 'forward L2', or, where the rows differ,
    'forward L2 (DRAM at reddit k=8)'."""
    rows = [(g["name"], k, r) for g in result["graphs"] for k, r in g["k"].items()]
    parts = []
    for name, label in FLOOR_KERNELS:
        bounds = [r[f"{name}_floor_bound"] for _, _, r in rows]
        if not bounds:
            continue
        most, other = sorted(("DRAM", "L2"), key=bounds.count, reverse=True)
        odd = [f"{gname} k={k}" for gname, k, r in rows if r[f"{name}_floor_bound"] != most]
        parts.append(f"{label} {most}" + (f" ({other} at {', '.join(odd)})" if odd else ""))
    return "; ".join(parts) if parts else "none timed"


def print_floor_table(result):
    print(f"\nfloors: DRAM copy {result['copy_GBps']:.0f} GB/s, L2 read "
          f"{result['l2_copy_GBps']:.0f} GB/s; floor = max(DRAM bytes / DRAM, "
          f"L2 bytes / L2), bound by: {floor_bounds(result)}; x floor = time / floor\n")
    print("| graph | k | forward ms | floor ms | x floor | backward ms | floor | x floor "
          "| top-k ms | floor | x floor | sddmm ms | floor | x floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for g in result["graphs"]:
        for k, r in g["k"].items():
            cells = " | ".join(f"{r[f'{name}_ms']:.3f} | {r[f'{name}_floor_ms']:.3f} | "
                               f"{r[f'{name}_of_floor']:.1f}x" for name, _ in FLOOR_KERNELS)
            print(f"| {g['name']} | {k} | {cells} |")


def write_outputs(result, args, written, interrupted=False):
    """Both tables, then the JSON (--out, marked ``"interrupted"``: only the graphs and k
    measured before a Ctrl-C or SIGTERM) with its path appended to ``written``; a Ctrl-C or
    SIGTERM meanwhile waits until the file is whole."""
    if interrupted:
        print("\nInterrupted: the graphs and k measured before Ctrl-C (or SIGTERM) only.")
    print_speedup_table(result)
    print_floor_table(result)
    if args.out:
        with signals_deferred():
            Path(args.out).write_text(json.dumps(dict(result, interrupted=interrupted),
                                                 indent=1))
            written.append(args.out)
        print(f"\nwrote {args.out}")


def measure(args, result, device):
    """The two ceilings, then every graph into ``result["graphs"]``."""
    gpu = device.type == "cuda"
    impl = cuda if gpu else reference
    flush = torch.empty(64 << 20, device=device) if gpu else None  # 256 MiB > L2
    reps = max(3, args.reps // 2)
    result["copy_GBps"] = copy_bandwidth(device, reps)
    result["l2_copy_GBps"] = l2_bandwidth(device, reps)
    print(f"device: {result['device']}; device-to-device copy {result['copy_GBps']:.0f} GB/s",
          flush=True)
    print(f"L2 read (16 MiB read 64 times by one kernel): {result['l2_copy_GBps']:.0f} GB/s",
          flush=True)
    for gname in args.graphs.split(","):
        bench_graph(gname, impl, (result["copy_GBps"], result["l2_copy_GBps"]), args, flush,
                    device, result["graphs"])
        if gpu:  # the graph's tensors are gone with bench_graph's frame; return their memory
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    """0; a Ctrl-C or SIGTERM prints and writes (--out) what was measured before it, marked
    ``"interrupted": true``, then exits 130 or 143."""
    args = parse_args(argv)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    result = {"device": torch.cuda.get_device_name(device) if gpu else "cpu",
              "torch": torch.__version__, "environment": envinfo.collect(device),
              "d": args.d, "reps": args.reps, "graphs": []}
    written = []

    def bench():
        measure_then_write(lambda: measure(args, result, device), result["graphs"],
                           lambda interrupted: write_outputs(result, args, written,
                                                             interrupted))
        return 0

    def interrupted():
        if written:
            return f"interrupted; what was measured before it is in {written[0]}"
        if result["graphs"]:
            return "interrupted; what was measured before it is printed above (no --out)"
        return "interrupted before a graph was measured; nothing written"
    return run_command(bench, interrupted)


FWD_VARIANTS = [("base", {}), ("minb1", {"minb": 1}), ("minb4", {"minb": 4}),
                ("minb5", {"minb": 5}), ("minb5-u4", {"minb": 5, "u": 4}),
                ("minb5-u8", {"minb": 5, "u": 8}), ("minb4-qv1", {"minb": 4, "qv": 0}),
                ("minb5-qv1", {"minb": 5, "qv": 0}), ("apart", {"packed": 0})]
BWD_VARIANTS = [("base", {}), ("minb1", {"minb": 1}), ("minb4", {"minb": 4}),
                ("minb5", {"minb": 5}), ("slices1", {"slices": 1}), ("slices2", {"slices": 2}),
                ("slices4", {"slices": 4}), ("minb5-u2", {"minb": 5, "u": 2})]
SDDMM_VARIANTS = [("base", {}), ("minb1", {"minb": 1}), ("minb4", {"minb": 4}),
                  ("minb5", {"minb": 5})]
#: The forward on bf16 values: each entry's value and index in one word, or read apart.
FWD_BF16_VARIANTS = [("packed", {"packed": 1}), ("apart", {"packed": 0})]


def _time_variants(kernel, variants, fn, args, flush, device):
    """{variant name: ms} of ``fn`` under each variant's launch overrides of ``kernel``."""
    out = {}
    for name, values in variants:
        with launch.overrides(**{kernel: values}):
            try:
                out[name] = timer(fn, args.reps, args.warmup, flush, device)
            except Exception as err:  # noqa: BLE001 - report and go on
                out[name] = float("nan")
                print(f"tune {kernel} {name}: {err}", flush=True)
    return out


def tune(plan, h, dy, d, args, flush, device):
    """Kernel variants (launch overrides) and edge-group sizes, timed side by side (the mean
    aggregation, as :func:`time_k` times it)."""
    rs = plan.node_scale("right", "dst", torch.float32)
    out = {"spgemm": {}, "spgemm_bf16": {}, "sspmm": {}, "sddmm": {}, "group_size": {}}
    for k in (int(k) for k in args.ks.split(",")):
        xv, xi = cuda.maxk_cbsr(h, k)
        xb = xv.to(torch.bfloat16)
        timed = {
            "spgemm": _time_variants("cbsr_spgemm", FWD_VARIANTS,
                                     lambda: cuda.cbsr_spgemm(plan, None, xv, xi, d, rs), args,
                                     flush, device),
            "spgemm_bf16": _time_variants("cbsr_spgemm", FWD_BF16_VARIANTS,
                                          lambda: cuda.cbsr_spgemm(plan, None, xb, xi, d, rs),
                                          args, flush, device),
            "sspmm": _time_variants("cbsr_sspmm", BWD_VARIANTS,
                                    lambda: cuda.cbsr_sspmm(plan, None, dy, xi, rs), args,
                                    flush, device),
            "sddmm": _time_variants("cbsr_sddmm", SDDMM_VARIANTS,
                                    lambda: cuda.cbsr_sddmm(plan, dy, xv, xi), args, flush,
                                    device)}
        for table, per_name in timed.items():
            for name, ms in per_name.items():
                out[table].setdefault(name, {})[k] = ms
    for table in ("spgemm", "spgemm_bf16", "sspmm", "sddmm"):
        for name, per_k in out[table].items():
            print(f"tune {table:11s} {name:18s} " +
                  " ".join(f"k={k}: {v:.3f}" for k, v in per_k.items()), flush=True)
    for gs in (128, 256, 512):
        row = {}
        with launch.overrides(group_size=gs):
            for k in (8, 32):
                xv, xi = cuda.maxk_cbsr(h, k)
                row[k] = (timer(lambda: cuda.cbsr_spgemm(plan, None, xv, xi, d, rs), args.reps,
                                args.warmup, flush, device),
                          timer(lambda: cuda.cbsr_sspmm(plan, None, dy, xi, rs), args.reps,
                                args.warmup, flush, device))
        out["group_size"][gs] = row
        print(f"tune group size {gs}: " + " ".join(
            f"k={k}: fwd {f:.3f} bwd {b:.3f}" for k, (f, b) in row.items()), flush=True)
    return out

