"""Where a sampled training step's time goes, phase by phase, on the device sampler.

Two passes per variant over a graph of ``bench_minibatch.py`` (the same ``--graph``,
generator, sizes and model; products-sized by default):

- **phases**: the eager step taken apart, the GPU synchronised at every boundary: each
  hop's sampling (row pointers, the picks with their sources and edge ids and the
  relabelling, queued a batch ahead; then the seeds, the read of the sizes and the blocks),
  the feature gather, each module's forward, the loss,
  each module's backward, the optimizer. The sum exceeds an unsynchronised step (every
  phase waits for the GPU), but it says which phase holds the time.
- **trace**: ``torch.profiler`` over unsynchronised steps of the trainer's own step
  (``SampledStep``, graphed or eager as ``--cuda-graph`` says, sampling ahead on its
  thread): kernel launches and graph replays per step, GPU kernel time per step by kind of
  kernel and for the longest kernels by name, and how busy the GPU was over the steps'
  wall time (``--chrome-trace`` also writes the timeline).

Prints a table per variant and writes ``profile_minibatch.json`` under ``--out``.

    python scripts/profile_minibatch.py --variants relu maxk-k32 --out runs/profile
"""
from __future__ import annotations

import collections
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # where _common is
from _common import (GRAPH_SETTINGS, Parser, add_graph_and_model_arguments,  # noqa: E402
                     add_precision_argument, checked, graph_defaults, one_of, positive_int,
                     run_script, variant_k, variant_name)


def build_parser():
    """The command line, on the standard library alone (:func:`parse_args` checks the rest)."""
    parser = Parser(description=__doc__.split("\n")[0])
    add_graph_and_model_arguments(parser)
    parser.add_argument("--fanouts", type=positive_int, nargs="+", default=[15, 10, 5])
    parser.add_argument("--batch-size", type=positive_int, default=1024)
    parser.add_argument("--variants", type=variant_name, nargs="+",
                        default=["relu", "maxk-k8", "maxk-k32"])
    parser.add_argument("--cuda-graph", nargs="+", choices=tuple(GRAPH_SETTINGS),
                        default=["off", "auto"])
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--warmup", type=positive_int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    add_precision_argument(parser, "every variant")
    parser.add_argument("--top-kernels", type=positive_int, default=15,
                        help="the kernels listed by name in each trace, longest first")
    parser.add_argument("--chrome-trace", action="store_true",
                        help="also write each trace for chrome://tracing or Perfetto "
                             "(trace_<variant>_<cuda-graph>.json under --out)")
    parser.add_argument("--out", default="runs/profile")
    return parser


if __name__ == "__main__":  # before torch and DGL load: see _common.py
    sys.exit(run_script(__file__, build_parser))

import torch  # noqa: E402

from bench_minibatch import build_data  # noqa: E402
from dgl_maxk import envinfo  # noqa: E402
from dgl_maxk.cli import run_command  # noqa: E402
from dgl_maxk.models import aligned_features, build_model  # noqa: E402
from dgl_maxk.sampling import sampler as sampler_module  # noqa: E402
from dgl_maxk.training.precision import PRECISIONS, autocast, precision_scope  # noqa: E402
from dgl_maxk.training.sampled_step import SampledStep, resolve_cuda_graph  # noqa: E402
from dgl_maxk.training.sampling import epoch_loader, train_epoch  # noqa: E402
from dgl_maxk.training.step import loss_fn, make_optimizer  # noqa: E402

#: kinds of GPU kernel, by name (first match wins)
KERNEL_KINDS = [
    ("sampling picks", r"sample_edges|block_degrees|uniform|philox|rand"),
    ("sort / unique", r"radix|sort|unique|scan|cub::"),
    ("CBSR aggregation", r"cbsr_|spgemm|sspmm|sddmm|dense_rows"),
    ("MaxK top-k", r"maxk"),
    ("cuSPARSE", r"cusparse|csrmm|spmm"),
    ("GEMM", r"gemm|cutlass|sm90_|nvjet|ampere|Kernel2"),
    ("gather / scatter", r"index|gather|scatter"),
    ("optimizer", r"adam|multi_tensor"),
    ("layer norm", r"layer_norm|layernorm"),
]


#: Characters of a kernel's name kept in the list of the longest (the rest of a templated
#: name is mostly its parameters).
_NAME_CHARS = 120


class Laps:
    """Synchronised laps: each :meth:`lap` adds the time since the previous one to a name."""

    def __init__(self, device):
        self.device, self.seconds = device, collections.defaultdict(float)
        self.last = None

    def start(self):
        torch.cuda.synchronize(self.device)
        self.last = time.perf_counter()

    def lap(self, name):
        torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name] += now - self.last
        self.last = now


def timed_sampler(laps):
    """Wrap the sampler's internals so that each hop's parts lap under their names; returns
    a function that undoes it."""
    originals = {n: getattr(sampler_module, n) for n in ("_block_rows", "start_block")}
    hop = [0]

    def wrap(name, label):
        def inner(*args, **kwargs):
            out = originals[name](*args, **kwargs)
            laps.lap(f"sample hop {hop[0]}: {label}")
            return out
        return inner

    def start_block(*args, **kwargs):
        hop[0] += 1
        out = originals["start_block"](*args, **kwargs)
        laps.lap(f"sample hop {hop[0]}: picks, relabel")
        return out

    sampler_module._block_rows = wrap("_block_rows", "row pointers")
    sampler_module.start_block = start_block

    def undo():
        for name, fn in originals.items():
            setattr(sampler_module, name, fn)

    def next_batch():
        hop[0] = 0
    return undo, next_batch


def timed_modules(model, laps):
    """Forward and backward hooks that lap each top-level module and hidden layer."""
    handles = []
    named = [(f"layers.{i}", m) for i, m in enumerate(model.layers)]
    named += [(n, m) for n, m in model.named_children() if n != "layers"]
    for name, module in named:
        handles.append(module.register_forward_pre_hook(
            lambda *_: laps.lap("forward: between modules")))
        handles.append(module.register_forward_hook(
            lambda *_, n=name: laps.lap(f"forward: {n}")))
        handles.append(module.register_full_backward_pre_hook(
            lambda *_: laps.lap("backward: between modules")))
        handles.append(module.register_full_backward_hook(
            lambda *_, n=name: laps.lap(f"backward: {n}")))
    return handles


def phase_pass(model, graph, train_idx, feats, labels, device, args):
    """Seconds per step of each phase of the eager step, synchronised at each boundary."""
    laps = Laps(device)
    undo, next_batch = timed_sampler(laps)
    handles = timed_modules(model, laps)
    opt = make_optimizer(model.parameters(), 0.003)
    # the sampler itself, eagerly in this thread, each hop lapped (the loader's replay of a
    # captured sampler holds every hop in one launch)
    sampler = sampler_module.NeighborSampler(args.fanouts)
    shuffled = torch.Generator().manual_seed(args.seed)
    batches = train_idx[torch.randperm(len(train_idx), generator=shuffled)].split(
        args.batch_size)
    generator = torch.Generator(device).manual_seed(args.seed)
    model.train()
    try:
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                laps.seconds.clear()
            next_batch()
            laps.start()
            seeds = batches[step % len(batches)].to(device)
            input_nodes, output_nodes, blocks = sampler.sample(graph, seeds, generator)
            laps.lap("sample: seeds, sizes read, blocks")
            x, y = feats[input_nodes], labels[output_nodes]
            laps.lap("feature and label gather")
            opt.zero_grad(set_to_none=True)
            with autocast(args.precision, "cuda"):
                logits = model(blocks, x)
                laps.lap("forward: after last module")
                loss = loss_fn(logits.float(), y, False)
            laps.lap("loss")
            loss.backward()
            laps.lap("backward: rest")
            opt.step()
            laps.lap("optimizer")
    finally:
        undo()
        for handle in handles:
            handle.remove()
    return {name: s / args.steps for name, s in laps.seconds.items()}


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS
                 if re.search(pattern, name, re.IGNORECASE)), "other elementwise")


def trace_pass(model, graph, train_idx, feats, labels, device, args, graphed, trace_name):
    """Launches, replays and kernel time per step of the trainer's own step."""
    opt = make_optimizer(model.parameters(), 0.003)
    step = SampledStep(model, opt, args.fanouts, args.batch_size, graph.num_nodes,
                       precision=args.precision, cuda_graph=graphed)
    sampling = {"sampler": "device", "fanouts": args.fanouts, "batch_size": args.batch_size,
                "prefetch": None}
    # the trainer's loader: each batch's feature rows gathered by the sampler threads
    loader = epoch_loader(None, train_idx, sampling, args.seed, 2, graph, feats)
    train_epoch(step, loader, feats, labels, device, max_steps=args.warmup)
    loader = epoch_loader(None, train_idx, sampling, args.seed, 3, graph, feats)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        stats = train_epoch(step, loader, feats, labels, device, max_steps=args.steps)
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    steps = stats["steps"]
    if args.chrome_trace:
        prof.export_chrome_trace(str(Path(args.out) / f"trace_{trace_name}.json"))
    launches = collections.Counter()
    kinds = collections.defaultdict(float)
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                          "cuLaunchKernelEx"):
            launches["kernels"] += 1
        elif event.name in ("cudaGraphLaunch",):
            launches["graph replays"] += 1
        elif event.name.startswith("cudaMemcpy"):
            launches["copies"] += 1
        elif event.name == "cudaStreamSynchronize" or event.name == "cudaDeviceSynchronize":
            launches["synchronisations"] += 1
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            kinds[kernel_kind(event.name)] += event.device_time / 1e6
            kernel = kernels[event.name]
            kernel[0] += 1
            kernel[1] += event.device_time / 1e6
    busy = sum(kinds.values())
    longest = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top_kernels]
    return {"steps": steps, "ms_per_step": 1e3 * wall / steps,
            "seeds_per_s": stats["seeds"] / wall,
            "per_step": {k: v / steps for k, v in launches.items()},
            "kernel_ms_per_step": {k: 1e3 * v / steps for k, v in sorted(kinds.items())},
            "top_kernels": [{"name": name[:_NAME_CHARS], "calls_per_step": calls / steps,
                             "ms_per_step": 1e3 * seconds / steps}
                            for name, (calls, seconds) in longest],
            "gpu_busy": busy / wall, "graphed": step.replays > 0}


def print_variant(name, phases, traces):
    print(f"\n== {name}: phases of the eager step (ms per step, synchronised)")
    total = sum(phases.values())
    for phase, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
        print(f"  {phase:42s} {1e3 * seconds:8.3f}  {100 * seconds / total:5.1f}%")
    print(f"  {'sum':42s} {1e3 * total:8.3f}")
    for mode, trace in traces.items():
        print(f"-- trainer's step ({mode}, {'graphed' if trace['graphed'] else 'eager'}): "
              f"{trace['ms_per_step']:.2f} ms/step, {trace['seeds_per_s']:,.0f} seeds/s, "
              f"GPU busy {100 * trace['gpu_busy']:.0f}%")
        per_step = ", ".join(f"{k} {v:.0f}" for k, v in trace["per_step"].items())
        print(f"   per step: {per_step}")
        for kind, ms in sorted(trace["kernel_ms_per_step"].items(), key=lambda kv: -kv[1]):
            print(f"   {kind:40s} {ms:8.3f} ms")
        print("   longest kernels (calls a step, ms a step):")
        for kernel in trace["top_kernels"]:
            print(f"     {kernel['calls_per_step']:5.1f} {kernel['ms_per_step']:7.3f}  "
                  f"{kernel['name']}")


def parse_args(argv=None):
    """The arguments, checked before any work."""
    parser = build_parser()
    args = graph_defaults(parser.parse_args(argv))
    checked(parser, "--precision", one_of(PRECISIONS), args.precision)
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU: the profile times GPU kernels")
    return args


def main(argv=None) -> int:
    """0, or the exit status of ``python -m dgl_maxk train`` for the same failure after one
    line; a Ctrl-C writes nothing."""
    args = parse_args(argv)
    return run_command(lambda: profile(args), "interrupted; nothing written")


def profile(args) -> int:
    """Both passes of every variant, printed, then written to profile_minibatch.json."""
    device = torch.device("cuda")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    _, graph, feats, labels, train_idx = build_data(args, device)
    feats, labels = aligned_features(feats.to(device)), labels.to(device)
    train_idx = train_idx.to(device)
    results = []
    with precision_scope(args.precision):
        for variant in args.variants:
            k = variant_k(variant)
            torch.manual_seed(args.seed)
            model = build_model("sage", args.features, args.hidden, args.classes, args.layers,
                                k=k or 32, dropout=0.5, padded_input=True,
                                nonlinearity="relu" if k is None else "maxk").to(device)
            phases = phase_pass(model, graph, train_idx, feats, labels, device, args)
            traces = {}
            for mode in args.cuda_graph:
                graphed = resolve_cuda_graph(GRAPH_SETTINGS[mode], device=device,
                                             sampler="device", world=1, fanouts=args.fanouts)
                traces[mode] = trace_pass(model, graph, train_idx, feats, labels, device,
                                          args, graphed, f"{variant}_{mode}")
            print_variant(variant, phases, traces)
            results.append({"variant": variant, "phases_ms": {
                k: 1e3 * v for k, v in phases.items()}, "trainer_step": traces})
    path = Path(args.out) / "profile_minibatch.json"
    path.write_text(json.dumps({"args": vars(args), "environment": envinfo.collect(),
                                "graph": [graph.num_nodes, int(graph.indices.numel())],
                                "results": results}, indent=1))
    print(f"wrote {path}")
    return 0
