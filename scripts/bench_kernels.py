"""Benchmark the CUDA kernels of dgl_maxk against cuSPARSE and torch.topk, in one run.

For each graph (power-law, dgl_maxk.data.power_law_csr) and each k:

* forward  ``cbsr_spgemm`` (Y = A X, X in CBSR)      vs cuSPARSE SpMM on dense d-wide X
  (``torch.sparse.mm`` on a CSR tensor, the kernel DGL uses on GPUs);
* backward ``cbsr_sspmm`` (A^T dY sampled at X)      vs cuSPARSE A^T dY (transposed CSR);
* top-k    ``maxk_cbsr``  (dense -> CBSR)             vs ``torch.topk``;
* (also ``cbsr_sddmm``, the edge-weight gradient, for information).

Times are medians of CUDA-event timed runs after warm-up, with the L2 cache flushed before
each run; achieved bandwidth counts the bytes each kernel must move (gathers counted once per
edge) against a measured device-to-device copy. Writes JSON (--out) and prints a markdown table.

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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dgl_maxk.backends import cuda, reference  # noqa: E402
from dgl_maxk.backends.cuda import launch  # noqa: E402
from dgl_maxk.data import power_law_csr  # noqa: E402
from dgl_maxk.sparse import GraphPlan  # noqa: E402

# nodes, edges, max in-degree (Reddit's is about 51k; products' natural draw is ~13k)
GRAPHS = {
    "reddit": (232_965, 114_615_892, 51_000),
    "products": (2_449_029, 123_718_280, None),
    "tiny": (1_000, 20_000, None),
}


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


def copy_bandwidth(device, reps):
    n = 1 << 28  # 1 GiB of fp32
    a = torch.empty(n, device=device).uniform_()
    b = torch.empty_like(a)
    ms = timer(lambda: b.copy_(a), reps, 2, None, device)
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9  # GB/s, read + write


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graphs", default="reddit,products",
                   help="comma list of reddit, products, tiny, or NODES:EDGES")
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--ks", default="8,16,32,64")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tune", action="store_true",
                   help="also time kernel variants and edge-group sizes on the first graph")
    p.add_argument("--tune-only", action="store_true",
                   help="with --tune: skip the main table (faster)")
    p.add_argument("--floor", action="store_true",
                   help="also time the forward's gathers alone (no accumulation, no output)")
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu and not cuda.available():
        raise SystemExit("no CUDA GPU with CuPy: run with --device cpu for a smoke test")
    impl = cuda if gpu else reference
    ks = [int(k) for k in args.ks.split(",")]
    d = args.d
    flush = torch.empty(64 << 20, device=device) if gpu else None  # 256 MiB > L2
    result = {"device": torch.cuda.get_device_name(device) if gpu else "cpu",
              "torch": torch.__version__, "d": d, "reps": args.reps, "graphs": []}
    bw = copy_bandwidth(device, max(3, args.reps // 2))
    result["copy_GBps"] = bw
    print(f"device: {result['device']}; device-to-device copy {bw:.0f} GB/s", flush=True)
    rows = []
    for gname in args.graphs.split(","):
        n, e, cap = GRAPHS[gname] if gname in GRAPHS else (*map(int, gname.split(":")), None)
        t0 = time.perf_counter()
        indptr, indices = power_law_csr(n, e, seed=args.seed, device=device, max_degree=cap)
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
        if gpu:
            groups = plan.edge_groups(launch.group_size())
            torch.cuda.synchronize()
        t_groups = time.perf_counter() - t0
        deg = plan.in_degrees
        g = {"name": gname, "nodes": n, "edges": e, "max_in_degree": int(deg.max()),
             "generate_s": t_gen, "plan_s": t_plan, "edge_groups_s": t_groups,
             "num_groups": int(groups[0].numel()) if gpu else 0,
             "group_size": launch.group_size(), "k": {}}
        print(f"\n{gname}: {n} nodes, {e} edges, max in-degree {g['max_in_degree']}; "
              f"generate {t_gen:.2f} s, plan {t_plan:.2f} s, edge groups {t_groups:.3f} s "
              f"({g['num_groups']} groups)", flush=True)

        # cuSPARSE on dense d-wide features, forward and backward-equivalent (A^T dY).
        x_dense = torch.randn(n, d, device=device)
        dy = torch.randn(n, d, device=device)
        adj = torch.sparse_csr_tensor(indptr, indices, ev, (n, n))
        t_indptr, t_indices, perm = plan.transpose()
        adj_t = torch.sparse_csr_tensor(t_indptr, t_indices, ev[perm], (n, n))
        reps = 2 if args.tune_only else args.reps
        g["cusparse_fwd_ms"] = timer(lambda: torch.sparse.mm(adj, x_dense), reps,
                                     args.warmup, flush, device)
        g["cusparse_bwd_ms"] = timer(lambda: torch.sparse.mm(adj_t, dy), reps,
                                     args.warmup, flush, device)
        del adj_t
        print(f"cuSPARSE SpMM d={d}: forward {g['cusparse_fwd_ms']:.3f} ms, A^T dY "
              f"{g['cusparse_bwd_ms']:.3f} ms", flush=True)
        h = torch.randn(n, d, device=device)
        for k in ([] if args.tune_only else ks):
            xv, xi = impl.maxk_cbsr(h, k)
            r = {}
            r["topk_ms"] = timer(lambda: impl.maxk_cbsr(h, k), args.reps, args.warmup, flush,
                                 device)
            r["torch_topk_ms"] = timer(lambda: torch.topk(h, k, dim=1), args.reps,
                                       args.warmup, flush, device)
            r["fwd_ms"] = timer(lambda: impl.cbsr_spgemm(plan, ev, xv, xi, d), args.reps,
                                args.warmup, flush, device)
            r["bwd_ms"] = timer(lambda: impl.cbsr_sspmm(plan, ev, dy, xi), args.reps,
                                args.warmup, flush, device)
            r["sddmm_ms"] = timer(lambda: impl.cbsr_sddmm(plan, dy, xv, xi), args.reps,
                                  args.warmup, flush, device)
            if gpu and args.floor:  # the same forward without the accumulation (a floor)
                with launch.overrides(cbsr_spgemm={"noacc": 1}):
                    r["fwd_gather_only_ms"] = timer(
                        lambda: cuda.cbsr_spgemm(plan, ev, xv, xi, d), args.reps, args.warmup,
                        flush, device)
            r["fwd_speedup"] = g["cusparse_fwd_ms"] / r["fwd_ms"]
            r["bwd_speedup"] = g["cusparse_bwd_ms"] / r["bwd_ms"]
            r["topk_speedup"] = r["torch_topk_ms"] / r["topk_ms"]
            # bytes that must move: CSR stream (int32 column + fp32 value), one CBSR row
            # gather per edge (fp32 value + uint8 index per entry), dense rows once.
            ib = xi.element_size()
            stream = e * 8
            r["fwd_GBps"] = (stream + e * k * (4 + ib) + n * d * 4) / r["fwd_ms"] / 1e6
            r["bwd_GBps"] = (stream + e * k * (4 + ib) + n * d * 4) / r["bwd_ms"] / 1e6
            r["topk_GBps"] = (n * d * 4 + n * k * (4 + ib)) / r["topk_ms"] / 1e6
            g["k"][k] = r
            rows.append((gname, k, r, g))
            print(f"k={k:3d}: fwd {r['fwd_ms']:.3f} ms ({r['fwd_speedup']:.2f}x), bwd "
                  f"{r['bwd_ms']:.3f} ms ({r['bwd_speedup']:.2f}x), sddmm {r['sddmm_ms']:.3f} "
                  f"ms, top-k {r['topk_ms']:.3f} ms vs torch.topk {r['torch_topk_ms']:.3f} ms "
                  f"({r['topk_speedup']:.2f}x)" + (f"; forward gathers alone "
                                                    f"{r['fwd_gather_only_ms']:.3f} ms"
                                                    if "fwd_gather_only_ms" in r else ""),
                  flush=True)
        if args.tune and gpu and gname == args.graphs.split(",")[0]:
            g["tune"] = tune(plan, ev, h, dy, d, args, flush, device)
        result["graphs"].append(g)
        del plan, adj, x_dense, dy, h, indptr, indices, ev, perm, t_indptr, t_indices
        if gpu:
            torch.cuda.empty_cache()

    print(f"\n{result['device']}, d = {d}, copy bandwidth {bw:.0f} GB/s; times in ms "
          "(median), speedup = baseline / ours\n")
    print("| graph | k | forward | cuSPARSE | speedup | backward | cuSPARSE A^T | speedup "
          "| top-k | torch.topk | speedup | fwd GB/s | bwd GB/s | sddmm |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for gname, k, r, g in rows:
        print(f"| {gname} | {k} | {r['fwd_ms']:.3f} | {g['cusparse_fwd_ms']:.2f} | "
              f"{r['fwd_speedup']:.1f}x | {r['bwd_ms']:.3f} | {g['cusparse_bwd_ms']:.2f} | "
              f"{r['bwd_speedup']:.1f}x | {r['topk_ms']:.3f} | {r['torch_topk_ms']:.3f} | "
              f"{r['topk_speedup']:.1f}x | {r['fwd_GBps']:.0f} | {r['bwd_GBps']:.0f} | "
              f"{r['sddmm_ms']:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.out}")
    return result


FWD_VARIANTS = [("base", {}), ("minb1", {"minb": 1}), ("minb4", {"minb": 4}),
                ("minb5", {"minb": 5}), ("minb5-u4", {"minb": 5, "u": 4}),
                ("minb5-u8", {"minb": 5, "u": 8}), ("minb4-qv4", {"minb": 4, "qv": 1}),
                ("minb5-qv4", {"minb": 5, "qv": 1}), ("gather-only", {"noacc": 1})]
BWD_VARIANTS = [("base", {}), ("minb1", {"minb": 1}), ("minb4", {"minb": 4}),
                ("minb5", {"minb": 5}), ("minb5-passes1", {"minb": 5, "passes": 1}),
                ("minb5-passes2", {"minb": 5, "passes": 2}), ("minb5-u2", {"minb": 5, "u": 2})]
SDDMM_VARIANTS = [("base", {}), ("minb1", {"minb": 1}), ("minb4", {"minb": 4}),
                  ("minb5", {"minb": 5})]


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


def tune(plan, ev, h, dy, d, args, flush, device):
    """Kernel variants (launch overrides) and edge-group sizes, timed side by side."""
    out = {"spgemm": {}, "sspmm": {}, "sddmm": {}, "group_size": {}}
    for k in (int(k) for k in args.ks.split(",")):
        xv, xi = cuda.maxk_cbsr(h, k)
        timed = {
            "spgemm": _time_variants("cbsr_spgemm", FWD_VARIANTS,
                                     lambda: cuda.cbsr_spgemm(plan, ev, xv, xi, d), args, flush,
                                     device),
            "sspmm": _time_variants("cbsr_sspmm", BWD_VARIANTS,
                                    lambda: cuda.cbsr_sspmm(plan, ev, dy, xi), args, flush,
                                    device),
            "sddmm": _time_variants("cbsr_sddmm", SDDMM_VARIANTS,
                                    lambda: cuda.cbsr_sddmm(plan, dy, xv, xi), args, flush,
                                    device)}
        for table, per_name in timed.items():
            for name, ms in per_name.items():
                out[table].setdefault(name, {})[k] = ms
    for table in ("spgemm", "sspmm", "sddmm"):
        for name, per_k in out[table].items():
            print(f"tune {table:6s} {name:18s} " +
                  " ".join(f"k={k}: {v:.3f}" for k, v in per_k.items()), flush=True)
    for gs in (256, 512):
        row = {}
        with launch.overrides(group_size=gs):
            for k in (8, 32):
                xv, xi = cuda.maxk_cbsr(h, k)
                row[k] = (timer(lambda: cuda.cbsr_spgemm(plan, ev, xv, xi, d), args.reps,
                                args.warmup, flush, device),
                          timer(lambda: cuda.cbsr_sspmm(plan, ev, dy, xi), args.reps,
                                args.warmup, flush, device))
        out["group_size"][gs] = row
        print(f"tune group size {gs}: " + " ".join(
            f"k={k}: fwd {f:.3f} bwd {b:.3f}" for k, (f, b) in row.items()), flush=True)
    return out


if __name__ == "__main__":
    main()
