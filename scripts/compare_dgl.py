"""End-to-end training speed: dgl_maxk against stock DGL, cuSPARSE and PyG, in one run.

For each graph and model (the paper's GraphSAGE / GCN / GIN), times full-graph training epochs
(forward, backward, optimizer step; median over epochs after warm-up, CUDA events on a GPU)
and peak GPU memory of:

- ``dgl-relu``: stock DGL layers with ReLU, on the GPU when the installed DGL has CUDA, on the
  CPU otherwise (the output says which; skipped above ``--dgl-cpu-max-edges`` on the CPU);
  the slowest arm, so it times a third of ``--epochs`` (at least one) after one warm-up epoch
  (each JSON row says what its arm timed: ``epochs_timed``, ``warmup_epochs``);
- ``cusparse-relu``: the same ReLU model with its aggregation through ``torch.sparse.mm`` on a
  CSR adjacency (cuSPARSE, the kernel DGL runs on GPUs): the GPU baseline; on the CPU the same
  model is called ``csr-relu`` (torch's CPU sparse kernels);
- ``pyg-relu``: the PyG model when ``torch_geometric`` is installed;
- ``maxk-k<k>``: dgl_maxk for each k.

Every arm runs the trainer's own full-graph step (``dgl_maxk.training.step.FullGraphStep``:
replayed from a CUDA graph where the arm's step can be captured; the output and JSON say
which arms were) under the same
``--precision`` (default tf32, the paper's setting: TF32 matmuls; bf16 adds bfloat16
autocast). ``--graphs medium`` is a power-law graph of 200,000 nodes with mean in-degree 40
and 128 features, trained 3 x 256: most users' graphs look more like it than like Reddit.

It also times the baseline's aggregations alone (forward and backward of each layer's SpMM),
prints the share of the baseline epoch they take, the Amdahl limit that share implies
(1 / (1 - share)) and the fraction of it each MaxK run reaches. Writes a JSON file (each arm
after the baseline with its ``speedup``, the baseline's epoch over its own), a markdown table
and a PNG plot; ``--profile`` adds a per-operation breakdown of one epoch of each model.

    python scripts/compare_dgl.py --graphs reddit-sized products-sized --out runs/compare
    python scripts/compare_dgl.py --graphs medium --precision bf16
    python scripts/compare_dgl.py --graphs small --device cpu --epochs 3   # a CPU check

As with ``python -m dgl_maxk train``, a failure is one line, ``error: ...``, and the exit
status says what happened: 2 bad arguments (checked before any work), 3 a dataset missing or
unreadable (when its turn comes), 130 Ctrl-C and 143 SIGTERM (the models measured before
it are written, marked ``"interrupted": true``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # where _common is
from _common import (Parser, add_precision_argument, checked, device_name, one_of,  # noqa: E402
                     positive_int, pyplot, run_script)

# name: (nodes, mean in-degree, input features, classes, layers) -- the paper's sizes.
GRAPHS = {
    "reddit-sized": (232_965, 114_615_892 / 232_965, 602, 41, 4),
    "products-sized": (2_449_029, 123_718_280 / 2_449_029, 100, 47, 3),
    "medium": (200_000, 40.0, 128, 47, 3),
    "small": (20_000, 20.0, 64, 10, 2),
}


def build_parser():
    """The command line, on the standard library alone (:func:`parse_args` checks the rest)."""
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["reddit-sized", "products-sized"],
                        help=f"generated graphs {sorted(GRAPHS)} or dataset names in the data root")
    parser.add_argument("--models", nargs="+", default=["sage", "gcn", "gin"],
                        help="of sage, gcn and gin (default: all three)")
    parser.add_argument("--ks", type=positive_int, nargs="+", default=[8, 16, 32, 64],
                        help="MaxK's k values, each <= --hidden")
    parser.add_argument("--hidden", type=positive_int, default=256)
    parser.add_argument("--dropout", type=float, default=0.5, help="in [0, 1)")
    parser.add_argument("--epochs", type=positive_int, default=10,
                        help="timed epochs per run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", type=device_name, default="auto",
                        help="cpu, cuda, cuda:N or auto (GPU when there is one; default)")
    parser.add_argument("--root", default=None, help="data root for real datasets")
    parser.add_argument("--dgl-cpu-max-edges", type=float, default=5e6,
                        help="skip stock DGL on the CPU for graphs with more edges")
    parser.add_argument("--profile", action="store_true", help="add a per-operation breakdown")
    parser.add_argument("--out", default="runs/compare", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    add_precision_argument(parser, "every arm")
    return parser


if __name__ == "__main__":  # before torch and DGL load: see _common.py
    sys.exit(run_script(__file__, build_parser))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import dgl_maxk  # noqa: E402
from dgl_maxk import backends  # noqa: E402
from dgl_maxk._dgl import dgl  # noqa: E402
from dgl_maxk.cli import (check_out_dir, device_argument, flag_error,  # noqa: E402
                          measure_then_write, run_command)
from dgl_maxk.data import canonical_name, dataset_names, load_dataset  # noqa: E402
from dgl_maxk.models import MODELS, aligned_features, build_model  # noqa: E402
from dgl_maxk.training import ConfigError, validate_config  # noqa: E402
from dgl_maxk.training.distributed import resolve_device  # noqa: E402
from dgl_maxk.training.checkpoint import signals_deferred  # noqa: E402
from dgl_maxk.training.report import environment  # noqa: E402
from dgl_maxk.training.precision import (MATMUL_PRECISION, PRECISIONS,  # noqa: E402
                                         precision_scope)
from dgl_maxk.training.step import FullGraphStep, make_optimizer  # noqa: E402


def load_graph(name, root, seed):
    """(graph, features, labels, train_mask, layers) for a generated or real graph."""
    if name in GRAPHS:
        nodes, degree, feats, classes, layers = GRAPHS[name]
        data = load_dataset("powerlaw", self_loops=False, num_nodes=nodes, mean_degree=degree,
                            num_features=feats, num_classes=classes, seed=seed)
    else:
        data = load_dataset(name, root=root)
        layers = 3
    labels = data.labels
    return data.graph, data.features, labels, data.train_mask, layers, data.num_classes


def stock_dgl_has_cuda(device):
    """Whether the installed DGL can put a graph on the GPU (the PyPI wheels cannot)."""
    try:
        dgl.graph(([0], [0])).to(device)
        return True
    except Exception:  # DGLError "Device API cuda is not enabled", or a missing library
        return False


class Timer:
    """Wall time of a region: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def training_step(model, graph, feats, labels, mask, opt, precision, cuda_graph=True):
    """Full-graph training's step as ``python -m dgl_maxk train`` runs it (replayed from a
    CUDA graph on a GPU where it can be captured): call it once per epoch."""
    return FullGraphStep(model, graph, feats, labels[mask], opt, rows=mask,
                         multilabel=labels.dim() == 2, precision=precision,
                         cuda_graph=cuda_graph)


class Timing(NamedTuple):
    """Full-graph training's epochs: median and range (ms), peak memory (GiB, GPU only),
    whether its step ran from a CUDA graph, and how many epochs were timed after how many
    warm-up ones."""
    ms: float
    spread: tuple
    peak: Optional[float]
    graphed: bool
    epochs: int
    warmup: int


def time_training(model, graph, feats, labels, mask, device, epochs, warmup, precision,
                  cuda_graph=True) -> Timing:
    """The :class:`Timing` of ``epochs`` epochs after ``warmup``."""
    model = model.to(device)
    step = training_step(model, graph, feats, labels, mask,
                         make_optimizer(model.parameters(), 0.01), precision, cuda_graph)
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    for epoch in range(warmup + epochs):
        with Timer(device) as t:
            step()
        if epoch >= warmup:
            times.append(t.ms)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return Timing(statistics.median(times), (min(times), max(times)), peak, step.graphed,
                  epochs, warmup)


def time_aggregation(graph, width, norm, layers, device, repeats):
    """Median time (ms) of `layers` dense SpMM forward + backward passes of the given width."""
    plan = dgl_maxk.graph_plan(graph, device)
    x = torch.randn(plan.num_src, width, device=device, requires_grad=True)
    grad = torch.randn(plan.num_dst, width, device=device)
    times = []
    for i in range(repeats + 2):
        with Timer(device) as t:
            for _ in range(layers):
                dgl_maxk.spmm(plan, x, norm=norm).backward(grad)
        if i >= 2:
            times.append(t.ms)
    return statistics.median(times)


AGG_NORM = {"sage": "right", "gcn": "both", "gin": "none"}


class DGLReLU(torch.nn.Module):
    """The paper's ReLU model built from stock dgl.nn layers."""

    def __init__(self, name, in_feats, hidden, classes, layers, dropout):
        super().__init__()
        self.name, self.dropout = name, torch.nn.Dropout(dropout)
        self.lin_in, self.lin_out = torch.nn.Linear(in_feats, hidden), torch.nn.Linear(hidden, classes)
        norm = torch.nn.LayerNorm
        if name == "sage":
            self.convs = torch.nn.ModuleList(
                dgl.nn.SAGEConv(hidden, hidden, "mean", feat_drop=dropout, norm=norm(hidden))
                for _ in range(layers))
        else:
            self.linears = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
            self.norms = torch.nn.ModuleList(norm(hidden) for _ in range(layers))
            self.convs = torch.nn.ModuleList(
                dgl.nn.GraphConv(hidden, hidden, norm="both", weight=False,
                                 allow_zero_in_degree=True) if name == "gcn"
                else dgl.nn.GINConv(None, "sum", learn_eps=True) for _ in range(layers))

    def forward(self, graph, x):
        if self.name == "sage":
            h = self.lin_in(x)
            for conv in self.convs:
                h = conv(graph, F.relu(h))
            return self.lin_out(h)
        h = F.relu(self.lin_in(x))
        for lin, conv, norm in zip(self.linears, self.convs, self.norms):
            h = norm(conv(graph, self.dropout(F.relu(lin(h)))))
        return self.lin_out(h)


def pyg_model(name, in_feats, hidden, classes, layers, dropout):
    """The paper's ReLU model from PyG layers, or None when PyG is not installed."""
    try:
        import torch_geometric.nn as pyg
    except ImportError:
        return None

    class PyGReLU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dropout = torch.nn.Dropout(dropout)
            self.lin_in, self.lin_out = torch.nn.Linear(in_feats, hidden), torch.nn.Linear(hidden, classes)
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden) for _ in range(layers))
            if name == "sage":
                self.convs = torch.nn.ModuleList(pyg.SAGEConv(hidden, hidden, "mean")
                                                 for _ in range(layers))
            else:
                self.linears = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden)
                                                   for _ in range(layers))
                self.convs = torch.nn.ModuleList(
                    pyg.GCNConv(hidden, hidden, add_self_loops=False) if name == "gcn"
                    else pyg.GINConv(torch.nn.Identity(), train_eps=True) for _ in range(layers))

        def forward(self, adj_t, x):
            if name == "sage":
                h = self.lin_in(x)
                for conv, norm in zip(self.convs, self.norms):
                    h = norm(conv(self.dropout(F.relu(h)), adj_t))
                return self.lin_out(h)
            h = F.relu(self.lin_in(x))
            for lin, conv, norm in zip(self.linears, self.convs, self.norms):
                h = norm(conv(self.dropout(F.relu(lin(h))), adj_t))
            return self.lin_out(h)

    return PyGReLU()


def pyg_adjacency(graph, device):
    """The transposed adjacency PyG's layers take: a CSR tensor over destination rows."""
    plan = dgl_maxk.graph_plan(graph, device)
    values = torch.ones(plan.num_edges, device=device)
    return torch.sparse_csr_tensor(plan.indptr, plan.indices, values,
                                   (plan.num_dst, plan.num_src))


BREAKDOWN = (  # (operation, substrings of CUDA kernel names), first match wins
    ("top-k (MaxK)", ("maxk", "topk", "sort", "radix")),
    ("aggregation forward (CBSR)", ("spgemm",)),
    ("aggregation backward (CBSR)", ("sspmm", "sddmm")),
    ("aggregation (cuSPARSE)", ("csrmm", "cusparse", "spmm", "csr")),
    ("linear layers (GEMM)", ("gemm", "cutlass", "sm90_xmma", "ampere_", "matmul")),
    ("layer norm", ("layer_norm", "layernorm")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("dropout", ("dropout", "fused_dropout", "bernoulli")),
)


def profile_epoch(model, graph, feats, labels, mask, device, precision):
    """CUDA time per operation group over one training epoch (ms)."""
    step = training_step(model, graph, feats, labels, mask,
                         make_optimizer(model.parameters(), 0.01), precision)
    step(), step()  # the second call captures the CUDA graph the others replay
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    groups = {}
    for event in prof.key_averages():
        total = getattr(event, "self_device_time_total", 0) / 1e3
        if total <= 0:
            continue
        name = event.key.lower()
        group = next((g for g, keys in BREAKDOWN if any(s in name for s in keys)), "other")
        groups[group] = groups.get(group, 0.0) + total
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def graph_name(text: str) -> str:
    """``--graphs``: a generated graph of :data:`GRAPHS` or a dataset's name, for argparse."""
    if text in GRAPHS:
        return text
    try:
        return canonical_name(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a generated graph ({', '.join(GRAPHS)}) nor a dataset "
            f"({', '.join(dataset_names())})") from None


#: the config keys that the flags fill (``model.k``: the largest of --ks)
CONFIG_FLAGS = {"model.hidden": "--hidden", "model.dropout": "--dropout", "model.k": "--ks",
                "dataset.params.seed": "--seed"}


def as_config(args) -> dict:
    """The arms' settings as a training config, so that the trainer's checks see them (their
    messages name config keys: :data:`CONFIG_FLAGS`)."""
    return {"dataset": {"name": "powerlaw", "params": {"seed": args.seed}},
            "model": {"name": args.models[0], "hidden": args.hidden, "dropout": args.dropout,
                      "k": max(args.ks)}}


def parse_args(argv=None):
    """The arguments, checked (the config's checks too) before any work."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.graphs = checked(parser, "--graphs", graph_name, args.graphs)
    checked(parser, "--models", one_of(sorted(MODELS)), args.models)
    checked(parser, "--device", device_argument, args.device)
    checked(parser, "--precision", one_of(PRECISIONS), args.precision)
    try:
        validate_config(as_config(args))
        check_out_dir(Path(args.out))
    except ConfigError as err:
        parser.error(flag_error(err, CONFIG_FLAGS))
    if args.warmup < 0:
        parser.error(f"argument --warmup: must be >= 0, got {args.warmup}")
    return args


def main(argv=None) -> int:
    """0, or the exit status of ``python -m dgl_maxk train`` for the same failure after one
    line."""
    args = parse_args(argv)
    written = []  # compare.json, where a Ctrl-C came after a model was measured

    def compare():
        with precision_scope(args.precision):
            run(args, written)
        return 0

    def interrupted():
        return (f"interrupted; the models measured before it are in {written[0]}" if written
                else "interrupted before a model was measured; nothing written")
    return run_command(compare, interrupted)


@dataclass
class Setup:
    """Where each arm runs: dgl_maxk and the baselines on ``device``, stock DGL on
    ``dgl_device``."""
    args: argparse.Namespace
    device: torch.device
    dgl_device: torch.device
    baseline: str


@dataclass
class GraphCase:
    """One graph with its data on the host and on the device."""
    name: str
    graph: object
    feats: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    layers: int
    classes: int
    on_device: tuple
    ours: tuple  # on_device with the features padded as the trainer pads them
    plan_ms: float


def run(args, written=None):
    """Every graph x model, then the outputs; on Ctrl-C, the outputs of the models measured
    before it (their compare.json appended to ``written``), then the KeyboardInterrupt."""
    device = resolve_device(args.device)
    dgl_device = device if device.type == "cuda" and stock_dgl_has_cuda(device) else torch.device("cpu")
    backend = backends.for_tensor(torch.empty(0, device=device)).__name__.rsplit(".", 1)[-1]
    setup = Setup(args, device, dgl_device,
                  "cusparse-relu" if device.type == "cuda" else "csr-relu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device, args.precision)  # the trainer's: host, commit, CPU, versions
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else env["cpu"] or "cpu"
    env.update(device_name=name, dgl_maxk_backend=backend, stock_dgl_device=str(dgl_device))
    print(f"device {name}; dgl_maxk backend: {backend}; stock DGL runs on {dgl_device}"
          + ("" if dgl_device == device else " (this DGL has no CUDA)")
          + f"; precision {args.precision} for every arm")
    results = []

    def measure():
        for graph_name in args.graphs:
            case = load_case(graph_name, setup)
            for model_name in args.models:
                results.extend(compare_model(case, model_name, setup))
            del case
            if device.type == "cuda":
                torch.cuda.empty_cache()
    measure_then_write(measure, results, lambda interrupted: write_outputs(
        out, env, args, results, interrupted, written))


def write_outputs(out, env, args, results, interrupted=False, written=None):
    """compare.json, compare.md and compare.png where matplotlib is installed
    (``interrupted``: the arms measured before a Ctrl-C, said in both files), then
    compare.json appended to ``written``; a Ctrl-C or SIGTERM meanwhile waits until all that
    is done."""
    table = markdown_table(results, args.precision)
    if interrupted:
        table = "Interrupted: the arms measured before Ctrl-C (or SIGTERM) only.\n\n" + table
    print("\n" + table)
    with signals_deferred():
        (out / "compare.json").write_text(json.dumps(
            {"environment": env, "args": vars(args), "interrupted": interrupted,
             "results": results}, indent=2))
        (out / "compare.md").write_text(table + "\n")
        files = [out / "compare.json", out / "compare.md"]
        if plot(results, out / "compare.png"):
            files.append(out / "compare.png")
        if written is not None:
            written.append(out / "compare.json")
    print(f"\nwrote {', '.join(map(str, files))}")


def load_case(graph_name, setup) -> GraphCase:
    """Build or load the graph, move its data to the device and time its plan."""
    args, device = setup.args, setup.device
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    graph, feats, labels, mask, layers, classes = load_graph(graph_name, args.root, args.seed)
    print(f"\n## {graph_name}: {graph.num_nodes():,} nodes, {graph.num_edges():,} edges "
          f"(built in {time.perf_counter() - t0:.1f} s), {layers} x {args.hidden}")
    on_device = (feats.to(device), labels.to(device), mask.to(device))
    t0 = time.perf_counter()
    dgl_maxk.graph_plan(graph, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    plan_ms = (time.perf_counter() - t0) * 1e3
    # dgl_maxk's models train on features padded as the trainer pads them (once per graph);
    # the libraries' arms take them as they are
    ours = (aligned_features(on_device[0]), *on_device[1:])
    return GraphCase(graph_name, graph, feats, labels, mask, layers, classes, on_device, ours,
                     plan_ms)


def compare_model(case, model_name, setup) -> list:
    """Rows of every arm of one model on one graph (and its breakdown with --profile)."""
    args, device, baseline = setup.args, setup.device, setup.baseline
    kwargs = dict(in_feats=case.feats.shape[1], hidden_feats=args.hidden,
                  out_feats=case.classes, num_layers=case.layers, dropout=args.dropout,
                  padded_input=True)
    timing = (args.epochs, args.warmup, args.precision)
    rows = []

    def record(variant, timing, where, note=""):
        rows.append({"graph": case.name, "model": model_name, "variant": variant,
                     "epoch_ms": timing.ms, "epoch_ms_range": list(timing.spread),
                     "epochs_timed": timing.epochs, "warmup_epochs": timing.warmup,
                     "peak_gib": timing.peak, "cuda_graph": timing.graphed,
                     "device": str(where), "note": note})
        if len(rows) > 1:  # every arm after the baseline: its epoch ratio to the baseline's
            rows[-1]["speedup"] = rows[0]["epoch_ms"] / timing.ms
        mem = f"{timing.peak:.2f} GiB" if timing.peak is not None else "-"
        launch = "CUDA graph" if timing.graphed else "eager"
        low, high = timing.spread
        print(f"  {model_name:4s} {variant:14s} {timing.ms:9.1f} ms/epoch ({low:.1f}-"
              f"{high:.1f})  peak {mem:>10s}  on {where}, {launch} {note}", flush=True)

    torch.manual_seed(args.seed)
    base = build_model(model_name, nonlinearity="relu", **kwargs)
    base_timing = time_training(base, case.graph, *case.ours, device, *timing)
    record(baseline, base_timing, device)
    ms = base_timing.ms
    agg_ms = time_aggregation(case.graph, args.hidden, AGG_NORM[model_name], case.layers,
                              device, args.epochs)
    share = min(agg_ms / ms, 0.999)
    limit = 1 / (1 - share)
    time_relu_libraries(case, model_name, setup, record)
    for k in args.ks:
        torch.manual_seed(args.seed)
        model = build_model(model_name, nonlinearity="maxk", k=k, **kwargs)
        maxk_timing = time_training(model, case.graph, *case.ours, device, *timing)
        speedup = ms / maxk_timing.ms
        record(f"maxk-k{k}", maxk_timing, device,
               f"{speedup:.2f}x vs {baseline}, {speedup / limit:.0%} of the limit")
        rows[-1]["fraction_of_limit"] = speedup / limit
    for row in rows:
        row.update(aggregation_ms=agg_ms, aggregation_share=share, amdahl_limit=limit,
                   plan_ms=case.plan_ms)
    print(f"  {model_name:4s} baseline aggregation {agg_ms:.1f} ms = {share:.0%} of the "
          f"epoch: Amdahl limit {limit:.2f}x")
    if args.profile and device.type == "cuda":
        for variant, profiled in ((baseline, base), (f"maxk-k{args.ks[-1]}", model)):
            breakdown = profile_epoch(profiled, case.graph, *case.ours, device, args.precision)
            rows.append({"graph": case.name, "model": model_name, "variant": variant,
                         "breakdown_ms": breakdown})
            print(f"  {model_name:4s} {variant} breakdown (ms): "
                  + ", ".join(f"{g} {v:.1f}" for g, v in breakdown.items()))
    return rows


def time_relu_libraries(case, model_name, setup, record):
    """Stock DGL's and PyG's ReLU models (where they can run), through ``record``."""
    args, device, dgl_device = setup.args, setup.device, setup.dgl_device
    if dgl_device.type == "cuda" or case.graph.num_edges() <= args.dgl_cpu_max_edges:
        stock = DGLReLU(model_name, case.feats.shape[1], args.hidden, case.classes,
                        case.layers, args.dropout)
        # stock DGL as its users run it: eagerly (a CUDA build of DGL may synchronise inside
        # its C++ code, which no capture survives)
        record("dgl-relu", time_training(
            stock, case.graph.to(dgl_device), case.feats.to(dgl_device),
            case.labels.to(dgl_device), case.mask.to(dgl_device), dgl_device,
            max(1, args.epochs // 3), 1, args.precision, cuda_graph=False), dgl_device)
    else:
        print(f"  {model_name:4s} dgl-relu       skipped: this DGL has no CUDA and the "
              f"graph has more than {args.dgl_cpu_max_edges:.0e} edges")
    pyg = pyg_model(model_name, case.feats.shape[1], args.hidden, case.classes, case.layers,
                    args.dropout)
    if pyg is not None:
        record("pyg-relu", time_training(pyg, pyg_adjacency(case.graph, device),
                                         *case.on_device, device, args.epochs, args.warmup,
                                         args.precision), device)


def markdown_table(results, precision):
    lines = [f"Precision: {precision} for every arm (float32 matmul precision "
             f"'{MATMUL_PRECISION[precision]}'" + (", bfloat16 autocast" if precision == "bf16"
                                                   else "") + ").", "",
             "| graph | model | variant | device | step | epoch (ms) | peak (GiB) "
             "| speedup vs CSR ReLU | Amdahl limit | fraction of limit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "epoch_ms" not in r:
            continue
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        frac = f"{r['fraction_of_limit']:.0%}" if "fraction_of_limit" in r else ""
        launch = "CUDA graph" if r.get("cuda_graph") else "eager"
        lines.append(f"| {r['graph']} | {r['model']} | {r['variant']} | {r['device']} | "
                     f"{launch} | {r['epoch_ms']:.1f} | {peak} | {speed} | "
                     f"{r['amdahl_limit']:.2f}x | {frac} |")
    if any(r.get("fraction_of_limit", 0) > 1 for r in results):
        lines += ["", "Above 100% of the limit: the limit assumes that only the aggregation gets "
                  "faster, while the MaxK model also does less besides it (the self path on "
                  "CBSR rows), or the baseline's epochs were noisy (more --epochs, --warmup)."]
    return "\n".join(lines)


def plot(results, path) -> bool:
    """Whether the plot was drawn into ``path`` (not without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return False
    timed = [r for r in results if "epoch_ms" in r]
    graphs = list(dict.fromkeys(r["graph"] for r in timed))
    models = list(dict.fromkeys(r["model"] for r in timed))
    fig, axes = plt.subplots(len(graphs), len(models), figsize=(4.5 * len(models),
                                                               3.6 * len(graphs)), squeeze=False)
    for ax, (graph, model) in zip(axes.flat, [(g, m) for g in graphs for m in models]):
        rows = [r for r in results if r["graph"] == graph and r["model"] == model
                and "epoch_ms" in r]
        maxk = [r for r in rows if r["variant"].startswith("maxk-")]
        ks = [int(r["variant"].split("k")[-1]) for r in maxk]
        ax.plot(ks, [r["speedup"] for r in maxk], "o-", label="MaxK speedup vs the CSR ReLU model")
        ax.axhline(rows[0]["amdahl_limit"], color="r", ls="--", label="Amdahl limit")
        ax.axhline(1.0, color="gray", ls=":")
        for r in rows:
            if r["variant"] in ("dgl-relu", "pyg-relu"):
                ax.axhline(r["speedup"], ls="-.", lw=1, label=f"{r['variant']} ({r['device']})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_ylabel("speedup (epoch time ratio)")
        ax.set_title(f"{graph} / {model}\nbaseline {rows[0]['epoch_ms']:.0f} ms/epoch")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True

