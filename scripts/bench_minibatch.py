"""Mini-batch training throughput: ReLU vs MaxK on sampled blocks, on 1 and N GPUs.

On an ogbn-products-sized generated graph (2,449,029 nodes, ~123.7M edges, 100 features, 47
classes, 8% training seeds as in ogbn-products; ``--graph papers100m-sized``: the
``papers100m-sized`` dataset, 111,059,956 nodes, 1,615,685,872 edges, 128 features, 172
classes, 1,207,179 training seeds, built on the GPU with no DGL graph, device sampler only),
GraphSAGE 3 x 256 with fan-outs 15,10,5 and batches of 1024 seeds: for each variant and GPU
count, the time of ``--steps`` training steps per process after warm-up (``--passes``
times), the throughput in seed nodes per second (all processes together), the epoch time it
implies, and where the time goes (waiting for the sampler, feature gathering and copying,
compute; the device sampler gathers each batch's feature rows itself, ahead of the step, so
its wait holds what that gather did not hide), with dgl_maxk's device sampler and DGL's CPU
sampler side by side.
The ReLU model is dgl_maxk's SAGE with ``k=None``: the computation of ``dgl.nn.SAGEConv``
with its aggregation on cuSPARSE (stock DGL layers cannot run on a GPU with the DGL wheels
of the package index). Processes are spawned, one per GPU, and joined through NCCL (the
gradients averaged by DistributedDataParallel, or by the graphed step itself). Each step is
the trainer's own (``dgl_maxk.training.sampled_step.SampledStep``), with ``--cuda-graph`` as
the trainer's ``sampling.cuda_graph``: where it is on (or auto, the default, in one
process) the device sampler's full batches replay a CUDA graph over padded blocks. The column
"step" says what ran; "scaling vs 1 GPU" compares like steps only. Every variant runs under
``--precision`` (default tf32, the paper's setting). An epoch with fewer batches than
``--steps`` times all of them (the output says how many). ``--feature-memory host`` keeps
the features in pinned host memory, each batch's rows gathered by the CPU and carried over
by a copy engine (the trainer's ``sampling.features: host``); each row records the peak GPU
memory allocated while it ran (graph and features included).

The arguments are checked (through the trainer's config checks) before any process starts:
bad ones give one line, ``error: ...``, and exit status 2. A process that fails stops the
others and ends the benchmark with its error, after its traceback. A Ctrl-C or SIGTERM stops
the processes and writes the rows measured before it, marked ``"interrupted": true`` (exit
status 130 or 143).

    python scripts/bench_minibatch.py --gpus 1 2 --out runs/minibatch
    python scripts/bench_minibatch.py --graph papers100m-sized --gpus 1 --samplers device \
        --feature-memory device host --variants maxk-k32 --out runs/papers
    python scripts/bench_minibatch.py --device cpu --gpus 1 --nodes 20000 --degree 10 \\
        --batch-size 256 --steps 5                                  # a CPU smoke run
"""
from __future__ import annotations

import json
import os
import queue as queues
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # where _common is
from _common import (GRAPH_SETTINGS, GRAPHS, VARIANT_RULE, Parser,  # noqa: E402
                     add_graph_and_model_arguments, add_precision_argument, checked,
                     graph_defaults, one_of, positive_int, run_script, variant_k,
                     variant_name)


def build_parser():
    """The command line, on the standard library alone (:func:`parse_args` checks the rest)."""
    parser = Parser(description=__doc__.split("\n")[0])
    add_graph_and_model_arguments(parser)
    parser.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5],
                        help="one per layer, input layer first (-1: all neighbours)")
    parser.add_argument("--batch-size", type=positive_int, default=1024)
    parser.add_argument("--variants", type=variant_name, nargs="+",
                        default=["relu", "maxk-k8", "maxk-k32"], help=VARIANT_RULE)
    parser.add_argument("--samplers", nargs="+",
                        help="device: dgl_maxk's sampler on the GPU, ahead of the step; dgl: "
                             "DGL's NeighborSampler on the CPU (default: both, side by side; "
                             "papers100m-sized: device)")
    parser.add_argument("--feature-memory", nargs="+", choices=("device", "host"),
                        default=["device"],
                        help="where the features stay: device, or host (pinned host memory, "
                             "as sampling.features: host); give both to time them side by "
                             "side")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="the device sampler's producer threads, each sampling a batch "
                             "ahead (default: the trainer's, 2 on a GPU, 0 on a CPU)")
    parser.add_argument("--cuda-graph", nargs="+", choices=tuple(GRAPH_SETTINGS),
                        default=["auto"],
                        help="the trainer's sampling.cuda_graph: on replays the device "
                             "sampler's full batches from a CUDA graph over padded blocks; "
                             "off runs them eagerly under DDP; auto (the trainer's default) "
                             "graphs every model in one process; give several to time them side "
                             "by side")
    parser.add_argument("--gpus", type=positive_int, nargs="+", default=[1, 2],
                        help="process counts to time (with --device cpu: CPU processes)")
    parser.add_argument("--steps", type=positive_int, default=40,
                        help="timed steps per process, at most one pass over the "
                             "training seeds (the JSON records how many ran)")
    parser.add_argument("--passes", type=positive_int, default=1,
                        help="timed passes of --steps steps each: the seeds/s of them all, "
                             "and each pass's in the JSON (the run's spread)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--breakdown", action="store_true",
                        help="one more pass of --steps steps, synchronising at phase "
                             "boundaries to split the time")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/minibatch")
    add_precision_argument(parser, "every variant")
    return parser


if __name__ == "__main__":  # before torch and DGL load: see _common.py
    sys.exit(run_script(__file__, build_parser))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dgl_maxk import envinfo  # noqa: E402
from dgl_maxk.cli import (check_out_dir, flag_error, measure_then_write,  # noqa: E402
                          run_command)
from dgl_maxk.data import load_dataset  # noqa: E402
from dgl_maxk.models import aligned_features, build_model  # noqa: E402
from dgl_maxk.training import ConfigError, distributed, validate_config  # noqa: E402
from dgl_maxk.training.checkpoint import signals_deferred  # noqa: E402
from dgl_maxk.training.precision import MATMUL_PRECISION, PRECISIONS, precision_scope  # noqa: E402
from dgl_maxk.sampling import DeviceGraph, pinned  # noqa: E402
from dgl_maxk.training.sampling import SAMPLERS, epoch_loader, train_epoch  # noqa: E402
from dgl_maxk.training.sampled_step import SampledStep, resolve_cuda_graph  # noqa: E402
from dgl_maxk.training.step import make_optimizer  # noqa: E402

# NVLink multicast stays off on shared GPU hosts (see docs/minibatch.md).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


#: papers100M's validation and test shares (the papers100m-sized dataset's splits).
PAPERS_EVAL_SHARES = {"num_valid": 125_265 / 111_059_956, "num_test": 214_338 / 111_059_956}


def dataset_params(args) -> dict:
    """The generator's parameters of ``--graph`` at the flags' sizes."""
    params = {"num_nodes": args.nodes, "num_features": args.features,
              "num_classes": args.classes, "seed": args.seed}
    if args.graph == "products-sized":
        return dict(params, mean_degree=args.degree)
    return dict(params, num_edges=round(args.nodes * args.degree),
                num_train=max(1, round(args.nodes * args.train_fraction)),
                **{key: max(1, round(args.nodes * share))
                   for key, share in PAPERS_EVAL_SHARES.items()})


def build_data(args, device):
    """(DGL graph or None, DeviceGraph or None, features on the host, labels, training seeds)
    of ``--graph``, from the seed, so every process builds the same: the products-sized
    graph on the host, with DGL's; the papers100m-sized one on ``device``, a DeviceGraph."""
    data = load_dataset(GRAPHS[args.graph]["dataset"], self_loops=False, device=device,
                        **dataset_params(args))
    if args.graph == "papers100m-sized":
        return None, data.graph, data.features, data.labels, data.train_mask.nonzero()[:, 0]
    gen = torch.Generator().manual_seed(args.seed)
    train_idx = torch.randperm(args.nodes, generator=gen)[:int(args.nodes * args.train_fraction)]
    device_graph = DeviceGraph.from_dgl(data.graph, device) if "device" in args.samplers else None
    return data.graph, device_graph, data.features, data.labels, train_idx


def placed_features(features, memory, device):
    """The features padded for lin_in as the trainer pads them, on ``device``, or with
    ``memory`` 'host' in pinned host memory (the loader carries each batch's rows over)."""
    if memory == "device":
        return aligned_features(features.to(device))
    rows = aligned_features(features)
    return pinned(rows) if device.type == "cuda" else rows


def worker(rank, world, args, port, queue):
    """One process: build the data, then time every variant; rank 0 reports each. A failure
    goes on ``queue`` too (its traceback to stderr), so that the parent stops waiting."""
    # Each process builds the graph itself: forking after torch's OpenMP pool exists can hang
    # DGL's sampler in the child, and pickling a 100M-edge graph to each process is slower.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        rank, world, device = distributed.init_distributed(torch.device(args.device))
        with precision_scope(args.precision):
            time_variants(rank, world, device, args, queue)
        if world > 1:
            torch.distributed.destroy_process_group()
    except BaseException as err:
        queue.put({"failed_rank": rank, "error": f"{type(err).__name__}: {err}"})
        raise


def time_variant(model, loader, feats, labels, device, args, world, cuda_graph):
    """Warm up, then time ``args.passes`` passes of ``args.steps`` steps (throughput, no
    extra synchronisation; each pass's seeds and seconds in ``passes``); with ``--breakdown`` one
    more pass of as many steps splits the time into sampling wait, copy and compute
    (synchronising at each boundary). The step is the trainer's (``sampling.cuda_graph`` as
    ``cuda_graph``)."""
    opt = make_optimizer(model.parameters(), 0.003)
    step = SampledStep(model, opt, args.fanouts, args.batch_size, args.nodes,
                       precision=args.precision, cuda_graph=cuda_graph)
    train_epoch(step, loader, feats, labels, device, max_steps=args.warmup)
    if world > 1:
        torch.distributed.barrier()
    distributed.synchronize(device)
    replays, captures = step.replays, step.captures
    passes = []
    for _ in range(args.passes):
        start = time.perf_counter()
        passes.append(train_epoch(step, loader, feats, labels, device, max_steps=args.steps))
        distributed.synchronize(device)
        passes[-1]["wall_s"] = time.perf_counter() - start
    stats = {key: sum(p[key] for p in passes)
             for key in ("seeds", "steps", "wall_s", "sample_s", "copy_s", "compute_s")}
    stats["passes"] = [(p["seeds"], p["wall_s"]) for p in passes]
    stats["replayed_steps"] = step.replays - replays
    stats["captures"] = step.captures - captures
    if args.breakdown:
        split = train_epoch(step, loader, feats, labels, device, max_steps=args.steps,
                            timed=True)
        stats.update({key: split[key] for key in ("sample_s", "copy_s", "compute_s")},
                     breakdown_steps=split["steps"])
    return stats


def arms(args):
    """(sampler, --cuda-graph) pairs to time; DGL's blocks run eagerly whatever the mode, so
    they are timed once."""
    dgl_mode = next(m for m in GRAPH_SETTINGS if m in args.cuda_graph)
    return [(sampler, graph_mode) for sampler in args.samplers for graph_mode in args.cuda_graph
            if sampler != "dgl" or graph_mode == dgl_mode]


def time_variants(rank, world, device, args, queue):
    """Time every feature memory x sampler x variant on this process; rank 0 puts each one's
    numbers on ``queue``."""
    t0 = time.perf_counter()
    graph, device_graph, feats, labels, train_idx = build_data(args, device)
    build_s = time.perf_counter() - t0
    labels_d = labels.to(device)
    for memory in args.feature_memory:
        feats_x = placed_features(feats, memory, device)
        for sampler, graph_mode in arms(args):
            for variant in args.variants:
                stats = time_arm(args, world, device, graph, device_graph, feats_x, labels_d,
                                 train_idx, sampler, graph_mode, variant)
                stats.update(features=memory, graph=(args.nodes, num_edges(graph, device_graph),
                                                     len(train_idx), build_s))
                if rank == 0:
                    queue.put(stats)
        del feats_x


def num_edges(graph, device_graph) -> int:
    return device_graph.num_edges if graph is None else graph.num_edges()


def time_arm(args, world, device, graph, device_graph, feats, labels, train_idx, sampler,
             graph_mode, variant):
    """One variant's numbers (averaged over the processes), with this process's peak GPU
    memory while it ran (GiB; None on a CPU)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(args.seed)
    k = variant_k(variant)
    model = build_model("sage", args.features, args.hidden, args.classes, args.layers,
                        k=k or 32, dropout=0.5, padded_input=True,
                        nonlinearity="relu" if k is None else "maxk").to(device)
    graphed = resolve_cuda_graph(GRAPH_SETTINGS[graph_mode], device=device, sampler=sampler,
                                 world=world, fanouts=args.fanouts)
    if not graphed:  # as the trainer: DDP, unless the step is graphed
        model = distributed.data_parallel(model, device)
    sampling = {"sampler": sampler, "fanouts": args.fanouts, "batch_size": args.batch_size,
                "prefetch": args.prefetch}
    loader = epoch_loader(graph, train_idx, sampling, args.seed, 0, device_graph, feats)
    stats = time_variant(model, loader, feats, labels, device, args, world, graphed)
    seeds, passes = stats["seeds"], stats.pop("passes")
    stats = distributed.all_reduce_mean(stats, device)
    walls = distributed.all_reduce_mean({i: wall for i, (_, wall) in enumerate(passes)}, device)
    stats["pass_seeds_per_s"] = [n * world / walls[i] for i, (n, _) in enumerate(passes)]
    step = "graphed" if stats["replayed_steps"] == stats["steps"] else (
        "eager" if stats["replayed_steps"] == 0 else "mixed")
    stats.update(sampler=sampler, cuda_graph=graph_mode, step=step, variant=variant,
                 seeds_total=seeds * world,
                 peak_gpu_gib=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None)
    return stats


#: the config keys that the flags fill (each of --variants sets ``model.k``)
CONFIG_FLAGS = {"dataset.params.num_nodes": "--nodes", "dataset.params.mean_degree": "--degree",
                "dataset.params.num_edges": "--degree",
                "dataset.params.num_train": "--train-fraction",
                "dataset.params.num_features": "--features",
                "dataset.params.num_classes": "--classes", "dataset.params.seed": "--seed",
                "model.hidden": "--hidden", "model.layers": "--layers",
                "sampling.fanouts": "--fanouts", "sampling.batch_size": "--batch-size",
                "sampling.prefetch": "--prefetch", "model.k": "--variants"}


def as_config(args) -> dict:
    """The benchmark as the trainer's mini-batch config, so that the trainer's checks see
    every setting (their messages name config keys: :data:`CONFIG_FLAGS`)."""
    variants = {name: {"model.nonlinearity": "relu"} if variant_k(name) is None
                else {"model.nonlinearity": "maxk", "model.k": variant_k(name)}
                for name in args.variants}
    return {"name": "bench_minibatch", "mode": "minibatch",
            "dataset": {"name": GRAPHS[args.graph]["dataset"], "self_loops": False,
                        "params": dataset_params(args)},
            "model": {"name": "sage", "hidden": args.hidden, "layers": args.layers,
                      "nonlinearity": "relu"},
            "sampling": {"fanouts": args.fanouts, "batch_size": args.batch_size,
                         "prefetch": args.prefetch},
            "train": {"precision": args.precision}, "variants": variants}


def parse_args(argv=None):
    """The arguments, checked before any process starts."""
    parser = build_parser()
    args = graph_defaults(parser.parse_args(argv))
    checked(parser, "--samplers", one_of(SAMPLERS), args.samplers)
    checked(parser, "--precision", one_of(PRECISIONS), args.precision)
    problem = argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def argument_problem(args) -> str | None:
    """What is wrong with ``args`` before any process starts, in one line (None: nothing)."""
    try:
        validate_config(as_config(args))
        check_out_dir(Path(args.out))
    except ConfigError as err:
        return flag_error(err, CONFIG_FLAGS)
    if args.graph == "papers100m-sized" and "dgl" in args.samplers:
        return ("argument --samplers: the papers100m-sized graph is built on the device, "
                "without the DGL graph that DGL's sampler needs; give --samplers device")
    if args.warmup < 0:
        return f"argument --warmup: must be >= 0, got {args.warmup}"
    if not 0 < args.train_fraction <= 1:
        return f"argument --train-fraction: must be in (0, 1], got {args.train_fraction:g}"
    seeds = int(args.nodes * args.train_fraction)
    if seeds < max(args.gpus):
        return (f"argument --train-fraction: {args.train_fraction:g} of --nodes {args.nodes} "
                f"gives {seeds} training seeds; each of the {max(args.gpus)} processes needs "
                "one at least")
    if args.device == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible == 0:
            return "no CUDA GPU: pass --device cpu for a CPU smoke run"
        if min(args.gpus) > visible:
            return f"argument --gpus: only {visible} CUDA GPU(s) visible"
    return None


def run_world(ctx, world, args, first, rows):
    """Time every variant on ``world`` processes; one result row per variant, appended to
    ``rows`` as it comes. A Ctrl-C or SIGTERM meanwhile stops the processes too."""
    # One share of the cores per process: DGL's sampler (OpenMP) in every process using
    # all cores oversubscribes them. Spawned processes inherit the variable.
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world))
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, args, 29500 + world, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        _collect(procs, queue, world, args, first, rows)
    except KeyboardInterrupt:  # the workers must not outlive the parent
        stop(procs)
        raise
    for p in procs:
        p.join()
    failed = next((rank for rank, p in enumerate(procs) if p.exitcode != 0), None)
    if failed is not None:
        raise SystemExit(f"error: process {failed} of {world} exited with status "
                         f"{procs[failed].exitcode}")


def _collect(procs, queue, world, args, first, rows):
    """Rank 0's results as rows of ``rows``, each printed as it comes."""
    count = len(args.feature_memory) * len(arms(args)) * len(args.variants)
    for stats in worker_results(procs, queue, count):
        sampler, step, variant = stats["sampler"], stats["step"], stats["variant"]
        graph_mode = stats["cuda_graph"]
        nodes, edges, seeds, build_s = stats.pop("graph")
        if first and not rows:
            print(f"precision: {args.precision} for every variant")
            print(f"graph: {nodes:,} nodes, {edges:,} edges, {seeds:,} training seeds "
                  f"(built in {build_s:.1f} s per process)", flush=True)
        throughput = stats["seeds_total"] / stats["wall_s"]
        row = {"sampler": sampler, "cuda_graph": graph_mode, "step": step, "variant": variant,
               "gpus": world, "steps": stats["steps"],
               "replayed_steps": stats["replayed_steps"], "captures": stats["captures"],
               "throughput_seeds_per_s": throughput,
               "step_ms": stats["wall_s"] / stats["steps"] * 1e3,
               "epoch_s_estimate": seeds / throughput,
               "sample_s": stats["sample_s"], "copy_s": stats["copy_s"],
               "compute_s": stats["compute_s"], "wall_s": stats["wall_s"],
               "breakdown_steps": stats.get("breakdown_steps", 0),
               "pass_seeds_per_s": stats["pass_seeds_per_s"],
               "features": stats["features"], "peak_gpu_gib": stats["peak_gpu_gib"]}
        rows.append(row)
        peak = row["peak_gpu_gib"]
        print(f"{sampler:6s} graph {graph_mode:4s} ({step}) {variant:9s} x{world} features "
              f"{row['features']:6s}: {throughput:10.0f} seeds/s, "
              f"{row['step_ms']:.1f} ms/step over {row['steps']:g} steps, "
              f"epoch ~{row['epoch_s_estimate']:.1f} s"
              + (f", peak GPU memory {peak:.1f} GiB" if peak is not None else "")
              + (f" (sample {stats['sample_s']:.2f} s, copy {stats['copy_s']:.2f} s, "
                 f"compute {stats['compute_s']:.2f} s)" if args.breakdown else ""),
              flush=True)


def worker_results(procs, queue, count):
    """The ``count`` results rank 0 puts on ``queue``, as they come. The first process to
    fail stops the others (which would wait in their next collective, and the parent on the
    queue, for ever) and ends the benchmark with its error."""
    received = 0
    while received < count:
        try:
            item = queue.get(timeout=1.0)
        except queues.Empty:
            dead = [rank for rank, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if not dead:
                continue
            item = last_error(queue) or {"failed_rank": dead[0], "error": "exit status "
                                         f"{procs[dead[0]].exitcode}"}
        if "failed_rank" in item:
            procs[item["failed_rank"]].join(30)  # it is printing its traceback
            stop(procs)
            raise SystemExit(f"error: process {item['failed_rank']} of {len(procs)} failed: "
                             f"{item['error']} (its traceback is above)")
        received += 1
        yield item


def last_error(queue):
    """The first failure left on ``queue`` by a process that has exited, or None."""
    while True:
        try:
            item = queue.get(timeout=0.5)
        except queues.Empty:
            return None
        if "failed_rank" in item:
            return item


def stop(procs):
    """Terminate the processes still running (killed if they ignore it for 10 s)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


def markdown_table(results, args) -> str:
    lines = [f"Precision: {args.precision} for every variant (float32 matmul precision "
             f"'{MATMUL_PRECISION[args.precision]}'"
             + (", bfloat16 autocast" if args.precision == "bf16" else "") + ").", "",
             "| sampler | cuda_graph (step run) | variant | GPUs | seeds/s | ms/step | "
             "epoch (s, est.) | "
             "sampling wait / copy / compute (ms/step) | scaling vs 1 GPU | speedup vs ReLU | "
             "features | peak GPU memory (GiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        def same(o, **kw):
            return (o["sampler"] == r["sampler"] and o["cuda_graph"] == r["cuda_graph"]
                    and o["features"] == r["features"]
                    and all(o[k] == v for k, v in kw.items()))
        # scaling compares like steps (auto graphs on one GPU, not under DDP)
        one = next((o for o in results
                    if same(o, variant=r["variant"], gpus=1, step=r["step"])), None)
        relu = next((o for o in results if same(o, variant="relu", gpus=r["gpus"])), None)
        split = " / ".join(f"{r[key] / (r.get('breakdown_steps') or r['steps']) * 1e3:.1f}"
                           for key in ("sample_s", "copy_s", "compute_s"))
        scale = f"{r['throughput_seeds_per_s'] / one['throughput_seeds_per_s']:.2f}x" if one else ""
        vs = (f"{r['throughput_seeds_per_s'] / relu['throughput_seeds_per_s']:.2f}x"
              if relu else "")
        lines.append(f"| {r['sampler']} | {r['cuda_graph']} ({r['step']}) | {r['variant']} | "
                     f"{r['gpus']} | "
                     f"{r['throughput_seeds_per_s']:.0f} | {r['step_ms']:.1f} | "
                     f"{r['epoch_s_estimate']:.1f} | {split if args.breakdown else ''} | "
                     f"{scale} | {vs} | {r['features']} | "
                     + (f"{r['peak_gpu_gib']:.1f} |" if r["peak_gpu_gib"] is not None else " |"))
    return "\n".join(lines)


def main(argv=None) -> int:
    """0, or the trainer's exit status for the same failure; a Ctrl-C or SIGTERM writes the
    rows measured before it (marked ``"interrupted": true``), then exits 130 or 143."""
    args = parse_args(argv)
    results, written = [], []

    def measure():
        ctx = mp.get_context("spawn")
        for world in args.gpus:
            if args.device == "cuda" and world > torch.cuda.device_count():
                print(f"skip {world} GPUs: only {torch.cuda.device_count()} visible")
                continue
            run_world(ctx, world, args, not results, results)

    def bench():
        measure_then_write(measure, results, lambda interrupted: write_outputs(
            args, results, written, interrupted))
        return 0

    def interrupted():
        return (f"interrupted; the rows measured before it are in {written[0]}" if written
                else "interrupted before a variant was measured; nothing written")
    return run_command(bench, interrupted)


def write_outputs(args, results, written, interrupted=False):
    """minibatch.json and minibatch.md, then the JSON's path appended to ``written``; a
    Ctrl-C or SIGTERM meanwhile waits until both are whole."""
    table = markdown_table(results, args)
    if interrupted:
        table = "Interrupted: the rows measured before Ctrl-C (or SIGTERM) only.\n\n" + table
    print("\n" + table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    environment = envinfo.collect(torch.device(args.device))
    with signals_deferred():
        (out / "minibatch.json").write_text(json.dumps(
            {"environment": environment, "args": vars(args), "interrupted": interrupted,
             "results": results}, indent=2))
        (out / "minibatch.md").write_text(table + "\n")
        written.append(out / "minibatch.json")
    print(f"\nwrote {out / 'minibatch.json'}, {out / 'minibatch.md'}")

