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
continue it (4). Exit status 1 means a bug in dgl_maxk. The parser, and what the command
line does before torch and DGL load, are :mod:`dgl_maxk.cli_start`'s.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import stat
import sys
from pathlib import Path

import torch

from . import envinfo
from .cli_start import (EXIT_CONFIG, EXIT_DATA, EXIT_DIVERGED, EXIT_OK, EXIT_SIGINT,
                        EXIT_SIGTERM, EXIT_STOPPED, INTERRUPTED_BEFORE_TRAINING,
                        build_parser, device_name, handling_signals)
from .data import DatasetError, data_root, dataset_names, layout
from .training import (CheckpointError, ConfigError, RunInterrupted, TrainingDiverged,
                       load_config, run_experiment)
from .training.config import TrainConfig, resolve_key

#: what the scripts take from here, so that they fail as the command line does (their
#: parsers' argument types are cli_start's, taken before torch and DGL load)
__all__ = ["main", "run", "run_command", "known_failure", "flag_error", "measure_then_write",
           "check_out_dir", "device_argument"]


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers send), raised as a Ctrl-C is, so that a script keeps what it
    measured before it."""


def _raise_terminated(signum, frame):
    raise _Terminated


def device_argument(text: str) -> str:
    """``--device``: auto, cpu, cuda or cuda:N of this machine, for argparse."""
    text = device_name(text)
    if text.startswith("cuda"):
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(text.partition(":")[2] or 0) >= available:
            raise argparse.ArgumentTypeError(f"{text}: this machine has {available} CUDA "
                                             "device(s); use --device cpu or auto")
    return text


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
    """``python -m dgl_maxk *argv``'s exit status (after its one line, for a failure)."""
    parser = build_parser()
    return run(parser, *parser.parse_known_args(argv))


def run(parser, args, extra) -> int:
    """The exit status of the command ``parser`` parsed (``python -m dgl_maxk`` parses
    before it loads this module: see dgl_maxk.__main__)."""
    command = parser.commands[args.command]
    if extra:  # named by the command's parser (argparse's own names the top level's)
        command.error(_unrecognized(extra))
    if args.command == "train":
        try:
            device_argument(args.device)
        except argparse.ArgumentTypeError as err:
            command.error(f"argument --device: {err}")
    commands = {"train": _train, "validate": _validate, "datasets": _datasets, "env": _env}
    return run_command(lambda: commands[args.command](args), INTERRUPTED_BEFORE_TRAINING)


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
    try:
        with handling_signals({signal.SIGINT: signal.default_int_handler,
                               signal.SIGTERM: _raise_terminated}):
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
    width = max(map(len, dataset_names()))
    for name in dataset_names():
        print(f"  {name:{width}} {layout(name)}")
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
                             quiet=args.quiet, verbose=args.verbose,
                             restart_corrupt=args.restart_corrupt)
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
