"""Command line of dgl_maxk.

    python -m dgl_maxk train --config configs/quickstart.yaml
    python -m dgl_maxk train --config configs/reddit_sage.yaml --set k=16 model.layers=3 \\
        --device cuda --seeds 0,1,2 --out runs
    python -m dgl_maxk train --resume runs/reddit_sage-20250101-120000
    python -m dgl_maxk validate configs/*.yaml
    python -m dgl_maxk datasets            # names, and where each real dataset goes
    python -m dgl_maxk env                 # versions, CUDA/CuPy, DGL features unavailable

Bad arguments, configs and run files fail before any work with one line naming the thing
(exit status 2); missing or unreadable data with the files to place and where (3); a run that
stops before finishing (--stop-after-epochs, --time-limit, SIGINT, SIGTERM) says how to
continue it (4). Exit status 1 means a bug in dgl_maxk.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import stat
import sys
import threading
from pathlib import Path

import torch

from . import envinfo
from .data import DatasetError, data_root, dataset_names, layout
from .training import (CheckpointError, ConfigError, RunInterrupted, TrainingDiverged,
                       load_config, run_experiment)
from .training.config import TrainConfig, parse_seeds, resolve_key

EXIT_OK, EXIT_CONFIG, EXIT_DATA, EXIT_STOPPED, EXIT_DIVERGED = 0, 2, 3, 4, 5
#: exit status when SIGINT (SIGTERM) arrives before a run could save anything to resume
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers send), raised as a Ctrl-C is, so that a script keeps what it
    measured before it."""


def _raise_terminated(signum, frame):
    raise _Terminated


class Parser(argparse.ArgumentParser):
    """Argument errors in one line, like every other error of the command line."""

    def error(self, message):
        self.exit(EXIT_CONFIG, f"error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argument that must be a positive integer, for argparse."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def seeds_argument(text: str):
    """``--seeds``: :func:`~dgl_maxk.training.config.parse_seeds` for argparse."""
    try:
        return parse_seeds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def device_argument(text: str) -> str:
    """``--device``: auto, cpu, cuda or cuda:N of this machine, for argparse."""
    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device dgl_maxk trains on; "
                                         "use cpu, cuda, cuda:N or auto")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= available:
        raise argparse.ArgumentTypeError(f"{text}: this machine has {available} CUDA "
                                         "device(s); use --device cpu or auto")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m dgl_maxk", description="MaxK-GNN experiments with DGL")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train the models of a config")
    train.add_argument("--config", help="YAML config (configs/<name>.yaml)")
    train.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                       action="extend",
                       help="override config keys, e.g. --set k=16 model.layers=3 "
                            "train.lr=0.003 (short names work when unambiguous)")
    train.add_argument("--device", type=device_argument, default="auto",
                       help="cpu, cuda, cuda:N or auto (GPU when there is one; default)")
    train.add_argument("--seeds", type=seeds_argument, default=None,
                       help="seeds: a count N (0..N-1) or a list 0,1,2 (replaces train.seeds; "
                            "seed 0 alone: 0,)")
    train.add_argument("--out", default="runs",
                       help="directory in which the run directory is created (default runs)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue an interrupted run from its checkpoints")
    train.add_argument("--restart-corrupt", action="store_true",
                       help="with --resume: restart from scratch each seed whose checkpoint "
                            "cannot be read (default: stop and name the file)")
    train.add_argument("--stop-after-epochs", type=positive_int, default=None, metavar="N",
                       help="stop (resumably) after N epochs in this call")
    train.add_argument("--time-limit", type=_positive_seconds, default=None,
                       metavar="SECONDS",
                       help="stop (resumably) at the first epoch end after SECONDS")
    train.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    train.add_argument("--quiet", action="store_true",
                       help="no per-epoch lines on stdout (log.txt still has them)")
    train.add_argument("--threads", type=positive_int, default=None,
                       help="torch CPU threads (torch.set_num_threads)")

    val = sub.add_parser("validate", help="check configs without running anything")
    val.add_argument("configs", nargs="+", metavar="CONFIG",
                     help="YAML configs to check (e.g. configs/*.yaml)")
    val.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                     action="extend", help="overrides applied to each config, as for train")

    sub.add_parser("datasets", help="list datasets and where their files go")

    env = sub.add_parser("env", help="versions, CUDA and CuPy status, DGL features unavailable")
    env.add_argument("--json", action="store_true", help="print it as JSON")
    parser.commands = sub.choices
    return parser


def _unrecognized(extra) -> str:
    """argparse's message for arguments no option takes, with the --set spelling of any
    that names a config key (``--epochs 3``: ``--set epochs=3``)."""
    message = f"unrecognized arguments: {' '.join(extra)}"
    flag = next((e for e in extra if e.startswith("--")), None)
    if flag is not None:
        key = flag[2:].split("=")[0]
        with contextlib.suppress(ConfigError):
            key = resolve_key(key)
            message += f"; config keys go through --set, e.g. --set {key}=..."
    return message


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's parser (argparse's own names the top level's)
        parser.commands[args.command].error(_unrecognized(extra))
    commands = {"train": _train, "validate": _validate, "datasets": _datasets, "env": _env}
    return run_command(lambda: commands[args.command](args),
                       "interrupted before training started; nothing to resume (run the "
                       "command again)")


def flag_error(err: Exception, flags: dict) -> str:
    """A config check's message for a script whose flags fill the config (``flags``: config
    key -> flag), led by the flags of the keys it names, in the message's order, as argparse
    names its own."""
    message = str(err)
    found = {}  # flag -> where its key first stands in the message
    for key, flag in flags.items():
        match = re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message)
        if match:
            found[flag] = min(found.get(flag, match.start()), match.start())
    named = sorted(found, key=found.get)
    return f"argument {' / '.join(named)}: {message}" if named else message


def measure_then_write(measure, results: list, write):
    """``measure()``, which appends to ``results``, then ``write(interrupted=False)``; a
    Ctrl-C, or a SIGTERM under :func:`run_command`, first has ``write(interrupted=True)``
    keep the results measured before it (where there are any), then goes on."""
    try:
        measure()
    except KeyboardInterrupt:
        if results:
            write(interrupted=True)
        raise
    write(interrupted=False)


def run_command(command, on_sigint) -> int:
    """``command()``'s exit status, or a known failure's after its one line on stderr
    (:func:`known_failure`), or 130 (143) after ``on_sigint`` (a line, or a function that
    says it then) for a Ctrl-C (SIGTERM) that no run turned into a stop: SIGTERM is raised
    as a Ctrl-C while the command runs. The scripts report their failures through it too."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        return command()
    except KeyboardInterrupt as stop:
        print(on_sigint() if callable(on_sigint) else on_sigint, file=sys.stderr)
        return EXIT_SIGTERM if isinstance(stop, _Terminated) else EXIT_SIGINT
    except Exception as err:
        failure = known_failure(err)
        if failure is None:  # a bug in dgl_maxk: its traceback shows
            raise
        status, line = failure
        print(line, file=sys.stderr)
        return status
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def known_failure(err: Exception):
    """(exit status, the line that says it) for the failures every command reports alike;
    None for the others."""
    if isinstance(err, (ConfigError, CheckpointError)):
        return EXIT_CONFIG, f"error: {err}"
    if isinstance(err, DatasetError):
        return EXIT_DATA, f"error: {err}"
    if isinstance(err, TrainingDiverged):
        return EXIT_DIVERGED, f"error: {err}"
    if isinstance(err, RunInterrupted):
        return EXIT_STOPPED, f"stopped by {err.signal_name}; {_resume_hint(err.run_dir)}"
    if isinstance(err, OSError) and err.filename is not None:  # a full disk, a lost mount
        return EXIT_CONFIG, f"error: {err.filename}: {err.strerror}"
    return None


def _resume_hint(run_dir) -> str:
    return f"continue with: python -m dgl_maxk train --resume {run_dir}"


def _validate(args) -> int:
    failed = 0
    for path in args.configs:
        try:
            cfg = load_config(path, args.overrides)
        except ConfigError as err:
            print(f"error: {path}: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: ok ({cfg['dataset']['name']}, {cfg['model']['name']}, "
              f"variants: {list(cfg['variants'] or []) or 'none'})")
    return EXIT_CONFIG if failed else EXIT_OK


def _datasets(args) -> int:
    print(f"data root: {data_root()} (--set dataset.root=DIR or $DGL_MAXK_DATA)")
    for name in dataset_names():
        print(f"  {name:14} {layout(name)}")
    return EXIT_OK


def _env(args) -> int:
    info = envinfo.collect()
    info["train_precision_default"] = TrainConfig.model_fields["precision"].default
    text = envinfo.format_report(info) + (
        f"\ntraining precision default (train.precision): {info['train_precision_default']}")
    print(json.dumps(info, indent=2) if args.json else text)
    return EXIT_OK


def _train(args) -> int:
    cfg = _train_config(args)
    if args.resume is None:
        check_out_dir(Path(args.out))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results = run_experiment(cfg, device=args.device, out=args.out, resume=args.resume,
                             stop_after_epochs=args.stop_after_epochs,
                             time_limit=args.time_limit, progress=not args.no_progress,
                             quiet=args.quiet, restart_corrupt=args.restart_corrupt)
    if results["complete"]:
        return EXIT_OK
    print(f"stopped before finishing; {_resume_hint(results['run_dir'])}", file=sys.stderr)
    return EXIT_STOPPED


def _train_config(args) -> dict | None:
    """The validated config of ``train`` (None with --resume: the run's own is used)."""
    if args.resume:
        if args.config or args.overrides or args.seeds is not None:
            raise ConfigError("--resume continues a run with its own config; do not pass "
                              "--config, --set or --seeds with it")
        return None
    if args.restart_corrupt:
        raise ConfigError("--restart-corrupt applies to --resume RUN_DIR only")
    if not args.config:
        raise ConfigError("give --config configs/<name>.yaml (or --resume RUN_DIR)")
    if args.seeds is None:
        return load_config(args.config, args.overrides)
    try:
        return load_config(args.config, [*args.overrides, f"train.seeds={args.seeds}"])
    except ConfigError as err:  # the seeds' range and count are the config's to check
        raise ConfigError(flag_error(err, {"train.seeds": "--seeds"})) from None


def check_out_dir(out: Path):
    """--out must be, or be creatable in, a directory we may write to. The mode bits are
    checked too: root may write anywhere, but a directory marked read-only means 'not here'."""
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, not a directory; give a "
                          "directory for the run directories")
    if not (existing.stat().st_mode & stat.S_IWUSR and os.access(existing, os.W_OK)):
        raise ConfigError(f"--out {out}: {existing} is not writable; give a directory you "
                          "can write to")
