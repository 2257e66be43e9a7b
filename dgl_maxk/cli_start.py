"""What the command line does before torch and DGL load, on the standard library alone: its
parser (``--help`` answers at once) and its signals.

Until the command runs, SIGINT and SIGTERM end the process at once, with one line and status
130 / 143 (:func:`signals_end_at_once`): raised as exceptions into the imports of torch and
DGL they would leave C extensions half loaded, and what the interpreter does next with them
(a KeyboardInterrupt traceback, NumPy's "cannot load module more than once per process", a
RecursionError) says nothing to a user; nothing has run yet that needs unwinding.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import signal
import threading

EXIT_OK, EXIT_CONFIG, EXIT_DATA, EXIT_STOPPED, EXIT_DIVERGED = 0, 2, 3, 4, 5
#: exit status when SIGINT (SIGTERM) arrives before a run could save anything to resume
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
INTERRUPTED_BEFORE_TRAINING = ("interrupted before training started; nothing to resume (run "
                               "the command again)")


@contextlib.contextmanager
def handling_signals(handlers: dict):
    """``handlers`` ({signal: handler}) in place for the block, from the main thread only
    (elsewhere signals keep their course), and not for a signal the process ignores (a
    background job's SIGINT stays ignored); the previous handlers come back after it."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, handler) for s, handler in handlers.items()
                    if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def _end_at_once(line, signum, frame):
    os.write(2, f"{line}\n".encode())
    os._exit(EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)


def signals_end_at_once(line=INTERRUPTED_BEFORE_TRAINING):
    """A block in which SIGINT and SIGTERM end the process at once: ``line``, 130 / 143."""
    end = functools.partial(_end_at_once, line)
    return handling_signals({signal.SIGINT: end, signal.SIGTERM: end})


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


def parse_seeds(text: str):
    """Seeds as written on a command line: '3' is a count (seeds 0, 1, 2), '0,1,2' or '[0, 1]'
    a list. Raises ValueError saying how to write them ('0' would be no seed at all); their
    range and number are the config's to check."""
    text = str(text).strip()
    try:
        if "," in text or text.startswith("["):
            seeds = [int(s) for s in text.strip("[]").split(",") if s.strip()]
        else:
            seeds = int(text)
    except ValueError:
        seeds = None
    if seeds == 0:
        raise ValueError("0 would mean 0 seeds; for seed 0 write --seeds 0,")
    if seeds is None or seeds == [] or isinstance(seeds, int) and seeds < 0:
        raise ValueError(f"must be a count (3) or a comma-separated list (0,1,2), got {text!r}")
    return seeds


def seeds_argument(text: str):
    """``--seeds``: :func:`parse_seeds` for argparse."""
    try:
        return parse_seeds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def device_name(text: str) -> str:
    """``--device`` as written: auto, cpu, cuda or cuda:N, for argparse (whether this machine
    has that GPU, torch tells :func:`dgl_maxk.cli.device_argument`)."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device dgl_maxk trains on; "
                                         "use cpu, cuda, cuda:N or auto")
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
    train.add_argument("--device", type=device_name, default="auto",
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
    train.add_argument("--no-progress", action="store_true",
                       help="no progress bars (drawn on stderr when it is a terminal)")
    lines = train.add_mutually_exclusive_group()
    lines.add_argument("--verbose", action="store_true",
                       help="print the per-epoch lines too (log.txt always has them)")
    lines.add_argument("--quiet", action="store_true",
                       help="print only warnings and the final scores (log.txt has the rest)")
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
