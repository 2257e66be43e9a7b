"""Command line of dgl_maxk.

    python -m dgl_maxk train --config configs/quickstart.yaml
    python -m dgl_maxk train --config configs/reddit_sage.yaml --set k=16 model.layers=3 \\
        --device cuda --seeds 0,1,2 --out runs
    python -m dgl_maxk train --resume runs/reddit_sage-20250101-120000
    python -m dgl_maxk validate configs/*.yaml
    python -m dgl_maxk datasets            # names, and where each real dataset goes
    python -m dgl_maxk env                 # versions, CUDA/CuPy, DGL features unavailable

Bad configs fail before any work, with a message naming the key (exit status 2); a missing
dataset fails at once with the files to place and where (exit status 3).
"""
from __future__ import annotations

import argparse
import json
import sys

EXIT_CONFIG, EXIT_DATA = 2, 3


def _seeds(text: str):
    text = text.strip()
    try:
        if "," in text or text.startswith("["):
            seeds = [int(s) for s in text.strip("[]").split(",") if s.strip()]
        else:
            seeds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds must be a count (3) or a comma-separated list (0,1,2), got {text!r}")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dgl_maxk",
                                     description="MaxK-GNN experiments with DGL")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train the models of a config")
    train.add_argument("--config", help="YAML config (configs/<name>.yaml)")
    train.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                       action="extend",
                       help="override config keys, e.g. --set k=16 model.layers=3 "
                            "train.lr=0.003 (short names work when unambiguous)")
    train.add_argument("--device", default="auto",
                       help="cpu, cuda, cuda:N or auto (GPU when there is one; default)")
    train.add_argument("--seeds", type=_seeds, default=None,
                       help="seeds: a count N (0..N-1) or a list 0,1,2 (replaces train.seeds)")
    train.add_argument("--out", default="runs",
                       help="directory in which the run directory is created (default runs)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue an interrupted run from its checkpoints")
    train.add_argument("--stop-after-epochs", type=int, default=None, metavar="N",
                       help="stop (resumably) after N epochs in this call")
    train.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                       help="stop (resumably) at the first epoch end after SECONDS")
    train.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    train.add_argument("--quiet", action="store_true",
                       help="no per-epoch lines on stdout (log.txt still has them)")
    train.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (torch.set_num_threads)")

    val = sub.add_parser("validate", help="check configs without running anything")
    val.add_argument("configs", nargs="+")
    val.add_argument("--set", nargs="+", default=[], dest="overrides", action="extend")

    sub.add_parser("datasets", help="list datasets and where their files go")

    env = sub.add_parser("env", help="versions, CUDA and CuPy status, DGL features unavailable")
    env.add_argument("--json", action="store_true", help="print it as JSON")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .train import ConfigError  # imports torch and DGL; after argument errors

    try:
        if args.command == "validate":
            return _validate(args)
        if args.command == "datasets":
            return _datasets()
        if args.command == "env":
            return _env(args)
        return _train(args)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("interrupted; continue with --resume <run directory>", file=sys.stderr)
        return 130


def _validate(args) -> int:
    from .train import load_config
    for path in args.configs:
        cfg = load_config(path, args.overrides)
        print(f"{path}: ok ({cfg['dataset']['name']}, {cfg['model']['name']}, "
              f"variants: {list(cfg['variants'] or []) or 'none'})")
    return 0


def _datasets() -> int:
    from .data import data_root, dataset_names, layout
    print(f"data root: {data_root()} (--set dataset.root=DIR or $DGL_MAXK_DATA)")
    for name in dataset_names():
        print(f"  {name:14} {layout(name)}")
    return 0


def _env(args) -> int:
    from . import envinfo
    info = envinfo.collect()
    print(json.dumps(info, indent=2) if args.json else envinfo.format_report(info))
    return 0


def _train(args) -> int:
    from .data import DatasetNotFound
    from .train import ConfigError, load_config, run_experiment
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.resume:
        if args.config or args.overrides or args.seeds is not None:
            raise ConfigError("--resume continues a run with its own config; do not pass "
                              "--config, --set or --seeds with it")
        cfg = None
    else:
        if not args.config:
            raise ConfigError("give --config configs/<name>.yaml (or --resume RUN_DIR)")
        cfg = load_config(args.config, args.overrides)
    try:
        results = run_experiment(cfg, device=args.device, out=args.out, resume=args.resume,
                                 seeds=args.seeds, stop_after_epochs=args.stop_after_epochs,
                                 time_limit=args.time_limit, progress=not args.no_progress,
                                 quiet=args.quiet)
    except DatasetNotFound as err:
        print(f"dataset missing: {err}", file=sys.stderr)
        return EXIT_DATA
    return 0 if results["complete"] else 0
