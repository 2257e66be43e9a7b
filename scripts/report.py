"""Render BENCHMARKS.md from the measurements in benchmarks/.

Every figure on the page is read from the JSON that the benchmark scripts wrote (the files
of :data:`SOURCES`); only the prose around the tables is this script's. To publish a new
measurement, put the script's JSON under that name and render the page again.

    python scripts/report.py            # writes BENCHMARKS.md
    python scripts/report.py --check    # exit status 1 where BENCHMARKS.md differs from it
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What each section reads, in benchmarks/.
SOURCES = {"compare": "compare_h200.json",
           "kernels": ("kernels_h200_reddit.json", "kernels_h200_products.json"),
           "minibatch": "minibatch_h200.json",
           "papers": "minibatch_papers100m_h200.json",
           "profile": "profile_minibatch_h200.json"}
#: The kernels of bench_kernels.py's floors: (key, name on the page).
KERNELS = (("fwd", "forward"), ("bwd", "backward"), ("topk", "top-k"), ("sddmm", "SDDMM"))
#: torch's float32 matmul precision as the trainer's precision names call it.
MATMULS = {"highest": "fp32", "high": "tf32", "medium": "bf16"}


def load(bench: Path) -> dict:
    """Each section's JSON (the kernels' a list, one per file), with its file name."""
    def read(name):
        return dict(json.loads((bench / name).read_text()), file=name)
    return {key: [read(n) for n in names] if isinstance(names, tuple) else read(names)
            for key, names in SOURCES.items()}


def para(*parts: str) -> list:
    """One paragraph of prose, wrapped, then a blank line."""
    return textwrap.wrap("".join(parts), 90, break_long_words=False,
                         break_on_hyphens=False) + [""]


def table(header: list, rows: list) -> list:
    """A markdown table, then a blank line."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""])


def code(*commands: str) -> list:
    """Commands as an indented block, then a blank line; a long one continues on the next
    lines (with a backslash) before one of its flags."""
    lines = []
    for cmd in commands:
        head, *flags = cmd.split(" --")
        line = "    " + head
        for flag in flags:
            if len(line) + len(flag) + 3 > 92:
                lines.append(line + " \\")
                line = "        --" + flag
            else:
                line += " --" + flag
        lines.append(line)
    return lines + [""]


def command(script: str, flags: list, out: str) -> str:
    """A run's command line; ``flags`` as (flag, value): a list, True (a switch), or
    None / False (left out)."""
    parts = [f"python scripts/{script}"]
    for flag, value in flags:
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts.append(f"{flag} {' '.join(map(str, value))}")
        elif value is not None and value is not False:
            parts.append(f"{flag} {value}")
    return " ".join(parts + [f"--out {out}"])


def ratio(x: float) -> str:
    return f"{x:.2f}x"


# --------------------------------------------------------------------------- environment

def software_row(label: str, data: dict) -> list:
    env = data["environment"]
    cuda = env.get("cuda") or {}
    cpu = f"{env['cpu']}, {env['cpu_count']} cores" if env.get("cpu") else "not recorded"
    matmuls = env.get("float32_matmul_precision")
    return [label, f"`{data['file']}`", ", ".join(sorted(set(cuda.get("gpus") or ["none"]))),
            cpu, env.get("python"), f"{env.get('torch')} (CUDA {cuda.get('torch_cuda')})",
            (env.get("cupy") or {}).get("version"), env.get("dgl"), env.get("numpy"),
            data.get("args", {}).get("precision") or MATMULS.get(matmuls, matmuls)]


def environment_section(src: dict) -> list:
    rows = [software_row("end to end", src["compare"]),
            *(software_row(f"kernels, {graph_label(k['graphs'][0]['name'])}", k)
              for k in src["kernels"]),
            software_row("mini-batch", src["minibatch"]),
            software_row("mini-batch, papers100M-sized", src["papers"]),
            software_row("mini-batch profile", src["profile"])]
    return ["## Hardware and software", "",
            *para("As each run recorded it (`python -m dgl_maxk env` prints the same for a "
                  "machine). \"matmuls\" is the precision of the matrix products in every "
                  "arm of that run; the aggregation kernels compute in fp32 whatever it is."),
            *table(["table", "file", "GPU", "CPU", "Python", "torch", "CuPy", "DGL", "NumPy",
                    "matmuls"], rows)]


# --------------------------------------------------------------------------- end to end

def compare_cases(data: dict) -> dict:
    """{(graph, model): {variant: row}}, in the run's order."""
    cases = {}
    for r in data["results"]:
        cases.setdefault((r["graph"], r["model"]), {})[r["variant"]] = r
    return cases


def timed(row, base) -> str:
    """An arm's epoch ms with its speedup over ``base``'s."""
    if row is None:
        return "not run"
    return f"{row['epoch_ms']:.1f} ({ratio(base['epoch_ms'] / row['epoch_ms'])})"


def peak(row, base) -> str:
    """An arm's peak GiB with its ratio to ``base``'s."""
    if row is None:
        return "not run"
    return f"{row['peak_gib']:.2f} ({row['peak_gib'] / base['peak_gib']:.2f})"


def compare_section(data: dict) -> list:
    args = data["args"]
    arms = ["pyg-relu", *(f"maxk-k{k}" for k in args["ks"])]
    heads = ["PyG ReLU", *(f"MaxK k={k}" for k in args["ks"])]
    speed, memory = [], []
    for (graph, model), case in compare_cases(data).items():
        base = case["cusparse-relu"]
        speed.append([graph, model.upper(), f"{base['epoch_ms']:.1f}",
                      f"{base['aggregation_share']:.0%}", f"{base['amdahl_limit']:.1f}x",
                      *(timed(case.get(arm), base) for arm in arms)])
        memory.append([graph, model.upper(), f"{base['peak_gib']:.2f}",
                       *(peak(case.get(arm), base) for arm in arms)])
    return [
        "## End-to-end training, full graph", "",
        *code(command("compare_dgl.py", [
            ("--graphs", args["graphs"]), ("--models", args["models"]), ("--ks", args["ks"]),
            ("--epochs", args["epochs"]), ("--warmup", args["warmup"]),
            ("--precision", args["precision"]), ("--profile", args["profile"])], "OUT"),
            f"cp OUT/compare.json benchmarks/{data['file']}"),
        *para("Epochs of full-graph training (forward, backward and Adam step over the whole "
              "graph) of the paper's models on generated power-law graphs of Reddit's and "
              "ogbn-products' sizes and on a medium one (`GRAPHS` in `scripts/compare_dgl.py` "
              f"gives their sizes and depths), hidden width {args['hidden']}, dropout "
              f"{args['dropout']}, random features and labels. Every arm runs the trainer's "
              f"own step, all under {args['precision']}. The baseline, ReLU (cuSPARSE), is "
              "the same model with its aggregation through `torch.sparse.mm` on a CSR "
              "adjacency: cuSPARSE, the kernel DGL runs on GPUs (the package index's DGL has "
              "no CUDA, so stock DGL layers cannot run on this GPU). PyG ReLU is the model "
              "built from `torch_geometric`'s layers. Each time is the median of "
              f"{args['epochs']} epochs after {args['warmup']} warm-up ones (CUDA events), "
              "in brackets the baseline's epoch over the arm's. \"aggregation\" is the share "
              "of the baseline's epoch that its aggregations take (forward and backward, "
              "timed alone), and the Amdahl limit, 1 / (1 - share), the speedup a free "
              "aggregation would give if nothing else changed; a MaxK model also does less "
              "dense work (dropout and the self terms act on the k kept values of a row; "
              "SAGE's LayerNorm and top-k are one kernel), so it can pass the limit. Times "
              "to 0.1 ms, ratios to 0.01."),
        *table(["graph", "model", "ReLU (cuSPARSE) ms", "aggregation", "Amdahl limit",
                *heads], speed),
        "### Peak memory, full graph", "",
        *para("`torch.cuda.max_memory_allocated` in the same runs, GiB to 0.01; in brackets "
              "the ratio to the baseline's peak."),
        *table(["graph", "model", "ReLU (cuSPARSE)", *heads], memory)]


# --------------------------------------------------------------------------- kernels

def graph_label(name: str) -> str:
    """bench_kernels.py's graph names as the page calls them (reddit: reddit-sized)."""
    return f"{name}-sized" if name in ("reddit", "products") else name


def bounds(graphs: list) -> str:
    """Which term bounds each kernel's floor over every graph and k, as
    'forward L2 (DRAM at products-sized k=8); ...'."""
    parts = []
    for key, name in KERNELS:
        cases = [(g["name"], k, r[f"{key}_floor_bound"]) for g in graphs
                 for k, r in g["k"].items()]
        terms = [term for *_, term in cases]
        most = max(sorted(set(terms)), key=terms.count)
        odd = [f"{term} at {graph_label(g)} k={k}" for g, k, term in cases if term != most]
        parts.append(f"{name} {most}" + (f" ({', '.join(odd)})" if odd else ""))
    return "; ".join(parts)


def kernel_rows(g: dict) -> list:
    rows = []
    for k, r in sorted(g["k"].items(), key=lambda item: int(item[0])):
        rows.append([graph_label(g["name"]), k,
                     *(f"{r[f'{key}_ms']:.2f} | {r[f'{key}_speedup']:.1f}x | "
                       f"{r[f'{key}_of_floor']:.1f}x" for key in ("fwd", "bwd", "topk")),
                     f"{r['sddmm_ms']:.2f} | {r['sddmm_of_floor']:.1f}x",
                     f"{r['fwd_bf16_values_ms']:.2f} ({ratio(r['bf16_values_speedup'])})"])
    return rows


def kernel_graph_line(data: dict, g: dict) -> str:
    return (f"- {graph_label(g['name'])}: {g['nodes']:,} nodes, {g['edges']:,} edges, the "
            f"largest in-degree {g['max_in_degree']:,}; cuSPARSE {g['cusparse_fwd_ms']:.2f} "
            f"ms forward, {g['cusparse_bwd_ms']:.2f} ms A^T dY; DRAM copy "
            f"{data['copy_GBps']:,.0f} GB/s, L2 read {data['l2_copy_GBps']:,.0f} GB/s; "
            f"medians of {data['reps']} runs (`{data['file']}`).")


def kernels_section(runs: list) -> list:
    d = runs[0]["d"]
    graphs = [g for data in runs for g in data["graphs"]]
    return [
        "## Kernels against cuSPARSE and against their floors", "",
        *code(*(command("bench_kernels.py", [
            ("--graphs", ",".join(g["name"] for g in data["graphs"])), ("--d", data["d"]),
            ("--ks", ",".join(sorted(data["graphs"][0]["k"], key=int))),
            ("--reps", data["reps"])], f"benchmarks/{data['file']}") for data in runs)),
        *para(f"Each CUDA kernel alone on a generated power-law graph, d = {d}, fp32 values "
              "and accumulation, A's values the mean's scale of each destination row (as "
              "SAGE runs them), the L2 cache flushed before each timed run; times are "
              "medians of CUDA-event timed runs. The forward `cbsr_spgemm` (Y = A X, X in "
              f"CBSR) is set against cuSPARSE's SpMM on the dense {d}-wide X, the backward "
              "`cbsr_sspmm` against cuSPARSE's A^T dY, the top-k `maxk_cbsr` against "
              "`torch.topk`; the SDDMM (the edge-weight gradient) has no baseline. \"x "
              "floor\" is the time over the kernel's floor, the least the hardware allows: "
              "max(DRAM bytes / DRAM copy bandwidth, L2 bytes / L2 read bandwidth), both "
              "bandwidths measured in the same run, each input and output counted once in "
              "DRAM and the per-edge gathers and atomic adds in L2 (the script's docstring "
              "counts the bytes); random gathers of short rows reach less than a streaming "
              f"read, so the floors are optimistic. The floors' bound: {bounds(graphs)}. The "
              "last column is the forward on bf16 CBSR values (fp32 accumulation), in "
              "brackets its speedup over fp32 values. Times to 0.01 ms, ratios to 0.1 "
              "(0.01 for bf16)."),
        *(line for data in runs for g in data["graphs"]
          for line in textwrap.wrap(kernel_graph_line(data, g), 90, subsequent_indent="  ",
                                    break_on_hyphens=False)), "",
        *table(["graph", "k", "forward ms", "x cuSPARSE", "x floor", "backward ms",
                "x cuSPARSE", "x floor", "top-k ms", "x torch.topk", "x floor", "SDDMM ms",
                "x floor", "forward, bf16 values"],
               [row for g in graphs for row in kernel_rows(g)]),
        *para("What bounds each kernel, measured with Nsight Compute, and the designs tried "
              "against those bounds are in [docs/performance.md](docs/performance.md).")]


# --------------------------------------------------------------------------- mini-batch

def _relu_of(r: dict, results: list):
    """The ReLU row measured like ``r`` (sampler, GPUs, --cuda-graph, feature memory)."""
    return next((o for o in results if o["variant"] == "relu" and all(
        o.get(key) == r.get(key) for key in ("gpus", "sampler", "cuda_graph", "features"))),
        None)


def _vs_relu(r: dict, results: list) -> str:
    relu = _relu_of(r, results)
    return (ratio(r["throughput_seeds_per_s"] / relu["throughput_seeds_per_s"]) if relu
            else "no ReLU arm")


def _split(r: dict, breakdown: bool) -> str:
    """Sampling wait / copy / compute, ms per step."""
    if not breakdown:
        return "not measured"
    steps = r.get("breakdown_steps") or r["steps"]  # the breakdown's own pass
    return " / ".join(f"{r[key] / steps * 1e3:.1f}"
                      for key in ("sample_s", "copy_s", "compute_s"))


def _passes(data: dict) -> int:
    return data["args"].get("passes", 1)


def _seeds_per_s(r: dict) -> str:
    """The row's seeds/s, and the slowest and fastest of its passes where it timed several."""
    spread = r.get("pass_seeds_per_s", [])
    return f"{r['throughput_seeds_per_s']:,.0f}" + (
        f" ({min(spread):,.0f}-{max(spread):,.0f})" if len(spread) > 1 else "")


def minibatch_rows(data: dict) -> list:
    results, breakdown = data["results"], data["args"]["breakdown"]
    return [[r["sampler"], r.get("step", "eager"), r["variant"], r["gpus"], _seeds_per_s(r),
             f"{r['step_ms']:.1f}", _split(r, breakdown), _vs_relu(r, results)]
            for r in results]


def _timed_steps(data: dict) -> str:
    """How many steps the rows timed: ``--steps``, or fewer where a pass over the seeds (an
    epoch) ended first; ``--passes`` times."""
    passes = _passes(data)
    wanted = data["args"]["steps"]
    steps = sorted({r["steps"] // passes for r in data["results"]})
    if steps == [wanted]:
        timed = f"{wanted} timed steps"
    elif len(steps) == 1:
        timed = f"{steps[0]:,} timed steps (one epoch)"
    else:
        timed = f"{wanted} timed steps, or one epoch where shorter"
    return timed if passes == 1 else f"{passes} passes of {timed}"


def bench_minibatch_code(data: dict) -> list:
    """The command of a bench_minibatch.py run, every flag as its JSON recorded it."""
    args = data["args"]
    return code(command("bench_minibatch.py", [
        ("--graph", args["graph"]), ("--gpus", args["gpus"]),
        ("--samplers", args["samplers"]), ("--variants", args["variants"]),
        ("--feature-memory", args["feature_memory"]), ("--cuda-graph", args.get("cuda_graph")),
        ("--prefetch", args.get("prefetch")), ("--batch-size", args["batch_size"]),
        ("--fanouts", args["fanouts"]), ("--steps", args["steps"]),
        ("--passes", _passes(data) if _passes(data) > 1 else None),
        ("--warmup", args["warmup"]), ("--breakdown", args["breakdown"]),
        ("--precision", args["precision"])], "OUT"),
        f"cp OUT/minibatch.json benchmarks/{data['file']}")


def minibatch_section(data: dict) -> list:
    args = data["args"]
    return [
        "## Mini-batch training", "",
        *bench_minibatch_code(data),
        *para(f"GraphSAGE {args['layers']} x {args['hidden']} on a generated graph of "
              f"ogbn-products' size ({args['nodes']:,} nodes, mean in-degree "
              f"{args['degree']:.1f}, {args['features']} features, {args['classes']} "
              f"classes, {args['train_fraction']:.0%} of the nodes training seeds), fan-outs "
              f"{'/'.join(map(str, args['fanouts']))}, batches of {args['batch_size']:,} "
              f"seeds, {args['precision']} in every arm. Each step is the trainer's "
              "(`SampledStep`) on blocks that dgl_maxk's device sampler makes a batch ahead "
              "(by default in the training thread, full batches replayed from a CUDA graph; "
              "with `--prefetch`, on that many threads): eager, or \"graphed\", replayed "
              "from a CUDA graph over blocks padded to fixed sizes (the first full batch's, with headroom; a "
              "batch that does not fit grows them), \"mixed\" where some steps of the pass "
              "ran eagerly (after each sizing, and the last, smaller batch). The trainer's default "
              "(`sampling.cuda_graph: auto`) graphs the steps of models trained by one "
              f"process. Seeds per second over {_timed_steps(data)} after "
              f"{args['warmup']} warm-up ones; the "
              "split of a step (waiting for the sampler / gathering and copying features / "
              "forward, backward and optimizer) comes from one more pass that synchronises "
              "at each boundary. \"vs ReLU\" is the throughput over ReLU's, its step run "
              "the same way (the same `--cuda-graph`). "
              + ("In brackets the slowest and the fastest pass. " if _passes(data) > 1 else "")
              + "Seeds/s to 1, ms to 0.1, ratios to 0.01."),
        *table(["sampler", "step", "variant", "GPUs", "seeds/s", "ms/step",
                "wait / copy / compute ms", "vs ReLU"], minibatch_rows(data))]


def papers_rows(data: dict) -> list:
    results, breakdown = data["results"], data["args"]["breakdown"]
    return [[r["variant"], r["features"], r.get("step", "eager"),
             f"{r['throughput_seeds_per_s']:,.0f}", f"{r['step_ms']:.1f}",
             f"{r['epoch_s_estimate']:.2f}", _split(r, breakdown),
             "not measured" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.1f}",
             _vs_relu(r, results)] for r in results]


def papers_section(data: dict) -> list:
    args = data["args"]
    seeds = round(args["nodes"] * args["train_fraction"])
    return [
        "### papers100M-sized on one GPU", "",
        *bench_minibatch_code(data),
        *para(f"GraphSAGE {args['layers']} x {args['hidden']}, the same step, on a "
              "generated graph of ogbn-papers100M's size "
              f"({args['nodes']:,} nodes, mean in-degree {args['degree']:.1f}, "
              f"{args['features']} features, {args['classes']} classes, {seeds:,} training "
              "seeds), built on the GPU as the sampler's CSR, with no DGL graph on the host. "
              "The input features stay in GPU memory, or in pinned host memory, whence the "
              "CPU gathers each batch's rows and a copy engine carries them over. Fan-outs "
              f"{'/'.join(map(str, args['fanouts']))}, batches of {args['batch_size']:,}; "
              f"{_timed_steps(data)} after {args['warmup']} warm-up ones. \"epoch\" is the "
              "seconds a pass over the training seeds takes at that pace; peak GPU memory is "
              "torch's, for the whole process (graph, features, model and step)."),
        *table(["variant", "features", "step", "seeds/s", "ms/step", "epoch (s)",
                "wait / copy / compute ms", "peak GPU GiB", "vs ReLU"], papers_rows(data))]


def phase_group(name: str) -> str:
    """The row of the profile table a phase of profile_minibatch.py falls in."""
    if name.startswith("sample"):
        return "sampling, " + (name.split(":")[0].removeprefix("sample ") if "hop" in name
                               else "seeds")
    if name.startswith(("forward: between", "forward: after", "backward: between",
                        "backward: rest")):
        return name.split(":")[0] + ": between modules"
    return name


#: Parts of kernel names that say nothing about the kernel.
_NAME_NOISE = re.compile(r"void |std::enable_if<!\(false\), void>::type |at::native::|"
                         r"\(anonymous namespace\)::|at_cuda_detail::cub::detail::|"
                         r"internal::|cutlass::")


def kernel_label(name: str, width: int = 64) -> str:
    """A kernel's name, template arguments kept (they name torch's functors), without its
    parameter list or namespaces, cut to ``width`` characters."""
    name, depth = _NAME_NOISE.sub("", name), 0
    for i, char in enumerate(name):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "(" and depth == 0 and i:
            name = name[:i]
            break
    return name if len(name) <= width else name[:width - 3] + "..."


def longest_kernels(results: list) -> list:
    """Paragraph and table of the longest kernels of the last variant's graphed step, where
    the profile lists them."""
    graphed = [(r["variant"], t) for r in results for t in r["trainer_step"].values()
               if t["graphed"] and t.get("top_kernels")]
    if not graphed:
        return []
    variant, trace = graphed[-1]
    rows = [[f"`{kernel_label(k['name'])}`", f"{k['calls_per_step']:.1f}",
             f"{k['ms_per_step']:.3f}"] for k in trace["top_kernels"][:10]]
    return [*para(f"The longest kernels of the graphed {variant} step, by name (the "
                  "sampler's included), per step:"),
            *table(["kernel", "calls", "ms"], rows)]


def profile_section(data: dict) -> list:
    args, results = data["args"], data["results"]
    variants = [r["variant"] for r in results]
    groups: dict = {}
    for r in results:
        for name, ms in r["phases_ms"].items():
            groups.setdefault(phase_group(name), {}).setdefault(r["variant"], 0.0)
            groups[phase_group(name)][r["variant"]] += ms
    phase_rows = [[name] + [f"{groups[name].get(v, 0.0):.2f}" for v in variants]
                  for name in groups]
    phase_rows.append(["sum"] + [f"{sum(r['phases_ms'].values()):.2f}" for r in results])
    step_rows = []
    for r in results:
        for mode, t in r["trainer_step"].items():
            kinds = sorted(t["kernel_ms_per_step"].items(), key=lambda kv: -kv[1])
            step_rows.append([
                r["variant"], "graphed" if t["graphed"] else "eager",
                f"{t['ms_per_step']:.2f}", f"{t['seeds_per_s']:,.0f}",
                f"{t['gpu_busy']:.0%}", f"{t['per_step'].get('kernels', 0):.0f}",
                f"{t['per_step'].get('synchronisations', 0):.0f}",
                f"{sum(t['kernel_ms_per_step'].values()):.2f}",
                ", ".join(f"{k} {ms:.2f}" for k, ms in kinds[:4])])
    return [
        "### Where a sampled step goes", "",
        *code(command("profile_minibatch.py", [
            ("--variants", variants), ("--cuda-graph", args["cuda_graph"]),
            ("--batch-size", args["batch_size"]), ("--fanouts", args["fanouts"]),
            ("--steps", args["steps"]), ("--precision", args["precision"])], "OUT"),
            f"cp OUT/profile_minibatch.json benchmarks/{data['file']}"),
        *para("The same graph, model and batches. First the eager step taken apart, the GPU "
              "synchronised at every phase boundary (ms per step; the sum exceeds an "
              "unsynchronised step, since each phase waits for the GPU, but it shows which "
              "phases hold the time): sampling is per hop, the output layer's first; "
              "\"between modules\" is the work outside the hooked modules (MaxK and "
              "dropout of the next layer's input, autograd's bookkeeping). The hooks keep "
              "each Linear and LayerNorm apart from the MaxK after it, which the models "
              "otherwise fuse, so this is the unfused step."),
        *table(["phase"] + variants, phase_rows),
        *para("Then the trainer's own step under `torch.profiler`, the sampler ahead "
              "as in training: wall time and throughput, the share of the wall time the GPU "
              "was running kernels (past 100% where the sampler's kernels run beside the "
              "step's), kernel launches and host "
              "synchronisations per step (the sampler's included), and the GPU's kernel "
              "time per step, with the four largest kinds of kernel."),
        *table(["variant", "step", "ms/step", "seeds/s", "GPU busy", "launches",
                "synchronisations", "kernel ms", "largest kinds (ms)"], step_rows),
        *longest_kernels(results)]


# --------------------------------------------------------------------------- the page

def render(bench: Path) -> str:
    """The page, from the JSON in ``bench``."""
    src = load(bench)
    lines = [
        "# Benchmarks", "",
        "<!-- Rendered by scripts/report.py from the JSON in benchmarks/:",
        "     edit those or the script, not this page. -->", "",
        *para("Speed and memory of dgl_maxk on one GPU against the same models on cuSPARSE "
              "and on PyG: whole training epochs, the CUDA kernels alone, and sampled "
              "mini-batch steps. Each table gives the command that measured it and the file "
              "that holds its figures; `python scripts/report.py` renders this page from "
              "those files."),
        *environment_section(src),
        *compare_section(src["compare"]),
        *kernels_section(src["kernels"]),
        *minibatch_section(src["minibatch"]),
        *papers_section(src["papers"]),
        *profile_section(src["profile"]),
        "## Accuracy", "",
        *para("MaxK against ReLU, and the CUDA kernels against the pure-torch path, on real "
              "datasets: [RESULTS.md](RESULTS.md)."),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv=None) -> int:
    """0; with --check, 1 where the page differs; 2 where the JSON cannot be read."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 where the page differs from the rendering")
    parser.add_argument("--benchmarks", type=Path, default=REPO / "benchmarks",
                        help="the folder of the JSON files (default: benchmarks/)")
    parser.add_argument("--page", type=Path, default=REPO / "BENCHMARKS.md",
                        help="the page to write or check (default: BENCHMARKS.md)")
    args = parser.parse_args(argv)
    try:
        text = render(args.benchmarks)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: cannot render from {args.benchmarks}: {err!r}", file=sys.stderr)
        return 2
    if args.check:
        if not args.page.exists() or args.page.read_text() != text:
            print(f"error: {args.page} is not what scripts/report.py renders from "
                  f"{args.benchmarks}: run python scripts/report.py", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(text)
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
