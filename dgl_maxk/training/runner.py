"""Experiments: every variant and seed of a config, trained with checkpoints, resumable.

A run directory holds ``config.yaml`` (the resolved config), ``log.txt``,
``<variant>/seed<N>/{checkpoint.pt,result.json}`` and ``results.json`` (config, environment,
precision, per-seed histories and scores, mean and std per variant, timings).

Training (:func:`run_seed`): Adam with the config's learning rate (constant or cosine) and
weight decay, the full-graph step (mode 'full') or the mini-batch step on sampled blocks
(mode 'minibatch'), evaluation of train/val/test on the whole graph (or layer by layer:
``sampling.inference``), test reported at the best validation epoch, all under the config's
``train.precision``. Resuming from a
checkpoint continues the same computation (bit for bit on the CPU; on GPUs up to the order
of the kernels' atomic adds).

A run stops early, leaving resumable checkpoints, when its budget (epochs or seconds in this
call) runs out (``complete`` is then False) or on SIGINT/SIGTERM (RunInterrupted).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

from .. import data as _data
from .checkpoint import (STOP_SIGNALS, atomic_write_bytes, inspect_seed, signals_deferred,
                         write_json)
from .config import apply_overrides, expand_variants, validate_config
from .distributed import any_process, broadcast_object, init_distributed, resolve_device
from .errors import CheckpointError, ConfigError, RunInterrupted
from .precision import MATMUL_PRECISION
from .report import environment, summary_lines, tf32_tensor_cores, variant_summary
from .seed import Budget, graphed_minibatch, run_seed

__all__ = ["run_experiment", "run_seed", "Budget", "StopSignals"]

LOG = logging.getLogger(__name__)


class _StopNow(Exception):
    """A second SIGINT/SIGTERM: stop at once (the run keeps its last saved checkpoints)."""


class StopSignals:
    """Within the block, SIGINT and SIGTERM are recorded (``signal_name``) for the training
    loop to stop at the end of its epoch, after saving a checkpoint; a second signal stops at
    once (:class:`_StopNow`, which the runner turns into RunInterrupted). The previous
    handlers come back when the block ends. Handlers can only be installed from the main
    thread; elsewhere signals keep their course."""

    def __init__(self):
        self.signal_name = None
        self._previous = {}

    def _record(self, signum, frame):
        if self.signal_name is not None:
            raise _StopNow(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name
        LOG.warning(f"{self.signal_name}: stopping at the end of this epoch, after saving a "
                    "checkpoint (send it again to stop at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._record) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def run_experiment(cfg: dict | None = None, device="auto", out="runs", resume=None,
                   seeds=None, stop_after_epochs=None, time_limit=None, progress=True,
                   quiet=False, verbose=False, dataset_cache: dict | None = None,
                   restart_corrupt=False) -> dict:
    """Run every variant and seed of a validated config; returns the results dict (also
    written to ``<run_dir>/results.json``), with ``complete`` False when a budget stopped it.

    cfg: from :func:`~dgl_maxk.training.config.load_config` (ignored when resuming);
    device: 'auto' | 'cpu' | 'cuda' | 'cuda:N'; out: where the run directory
    ``<name>-<timestamp>`` is made; resume: a run directory to continue (its config.yaml is
    used); seeds: a list or a count replacing ``train.seeds``; stop_after_epochs, time_limit:
    stop early with resumable checkpoints after this many epochs / seconds in this call;
    dataset_cache: a dict reused across calls to load each dataset once; restart_corrupt:
    restart from scratch any seed whose checkpoint is unreadable (moved aside to .corrupt).

    What it prints: a progress bar per variant and seed on stderr where stderr is a terminal
    (``progress``); on stdout the run's settings, each seed's score and the summary, with
    ``verbose`` also a line per logged epoch, with ``quiet`` only warnings and the summary.
    The run's log.txt has every line.

    Raises ConfigError (bad config, run directory or config.yaml), CheckpointError (an
    unreadable checkpoint), DatasetError, and RunInterrupted after SIGINT/SIGTERM (once the
    checkpoints are saved; after a second signal at once, keeping those saved before).
    Nothing is written to a run directory before every check passed.
    """
    budget = _budget(stop_after_epochs, time_limit)
    stdout_level = _stdout_level(quiet, verbose)
    rank, world, dev = init_distributed(resolve_device(device))
    if resume is not None and seeds is not None:
        raise ConfigError("a resumed run keeps the seeds of its config.yaml; do not pass "
                          "seeds with resume")
    cfg = run_config(resume) if resume is not None else _fresh_config(cfg, seeds)
    variants = expand_variants(cfg)
    cache, loaded = load_datasets(variants, dataset_cache, dev)
    if resume is not None:
        run_dir = Path(resume)
        _preflight(run_dir, variants, restart_corrupt)
    else:
        run_dir = _new_run_dir(out, cfg, rank)
    per_variant, complete, at_once = {}, False, None
    try:
        with _only_run_in(run_dir, rank), _run_log(run_dir, stdout_level, rank) as stdout, \
                StopSignals() as signals:
            # a resumed run's wall time adds this call's to its earlier calls', whose
            # environments (host, versions, threads) are kept beside this call's
            earlier = _earlier_calls(run_dir)
            started = time.perf_counter() - earlier["wall_seconds"]
            try:
                _log_header(run_dir, dev, world, cfg, variants, loaded)
                complete = _train_variants(variants, cache, run_dir, dev, budget, signals,
                                           progress and rank == 0, restart_corrupt,
                                           per_variant)
            except _StopNow as second:  # the seeds finished before it are reported
                at_once = second
            with signals_deferred():  # results.json whole: a signal takes effect after
                precision = _run_precision(variants)
                results = {"name": cfg["name"], "config": cfg, "precision": precision,
                           "environment": environment(dev, precision),
                           "earlier_environments": earlier["environments"],
                           "run_dir": str(run_dir), "variants": per_variant,
                           "complete": complete, "processes": world,
                           "wall_seconds": time.perf_counter() - started}
                if rank == 0:
                    write_json(run_dir / "results.json", results)
                    if stdout is not None:
                        stdout.setLevel(logging.INFO)  # the summary is printed even with quiet
                    for line in summary_lines(results):
                        LOG.info(line)
    except _StopNow as second:  # another signal while the results were written
        at_once = at_once or second
    if at_once is not None and not complete:
        raise RunInterrupted(run_dir, f"a second {at_once} (at once: the checkpoints saved "
                                      "before it are kept)")
    # a signal after the last epoch changes nothing: the run is complete
    if signals.signal_name is not None and not complete:
        raise RunInterrupted(run_dir, signals.signal_name)
    return results


def _budget(stop_after_epochs, time_limit) -> Budget:
    if stop_after_epochs is not None and (isinstance(stop_after_epochs, bool) or not
                                          isinstance(stop_after_epochs, int) or
                                          stop_after_epochs < 1):
        raise ConfigError(f"--stop-after-epochs must be a positive number of epochs, got "
                          f"{stop_after_epochs!r}")
    if time_limit is not None and not time_limit > 0:
        raise ConfigError(f"--time-limit must be a positive number of seconds, got "
                          f"{time_limit!r}")
    return Budget(stop_after_epochs, time_limit)


def _fresh_config(cfg, seeds) -> dict:
    if cfg is None:
        raise ConfigError("no config given")
    if seeds is not None:
        cfg = validate_config(apply_overrides(cfg, {"train.seeds": seeds}))
    return cfg


def run_config(run_dir) -> dict:
    """The validated config.yaml of a run directory (to continue it); a ConfigError saying
    why where there is none to read."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a run directory)")
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path} cannot be read ({type(err).__name__}); it must be the "
                          "run's resolved config: restore it or start a new run") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} is empty or not a mapping; it must be the run's resolved "
                          "config: restore it or start a new run")
    try:
        return validate_config(cfg)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _dataset_key(vcfg) -> str:
    return json.dumps(vcfg["dataset"], sort_keys=True)


def load_datasets(variants: dict, cache: dict | None = None, device=None):
    """Every dataset of a run's ``variants`` (``expand_variants``), loaded before anything is
    written (a missing one fails before the run directory exists) into ``cache`` (a dict
    that ``run_experiment(dataset_cache=...)`` reuses), those with a graph built on a device
    on ``device``; returns the cache and a log line per dataset."""
    cache = cache if cache is not None else {}
    loaded = {}
    for vcfg in variants.values():
        key, d = _dataset_key(vcfg), vcfg["dataset"]
        if key in loaded:
            continue
        if key in cache:
            loaded[key] = f"dataset {d['name']}: {cache[key].describe()} (loaded before)"
            continue
        t0 = time.perf_counter()
        cache[key] = _data.load_dataset(d["name"], root=d["root"], self_loops=d["self_loops"],
                                        device=device, **d["params"])
        loaded[key] = (f"dataset {d['name']}: {cache[key].describe()} "
                       f"(loaded in {time.perf_counter() - t0:.1f} s)")
    return cache, list(loaded.values())


def _preflight(run_dir: Path, variants: dict, restart_corrupt: bool):
    """Refuse a resume before touching the run: every seed's checkpoint must be readable
    (or restart_corrupt given) and written for this config."""
    for vname, vcfg in variants.items():
        for seed in vcfg["train"]["seeds"]:
            files = inspect_seed(run_dir / vname / f"seed{seed}", vcfg, seed)
            if files.unreadable is not None and not restart_corrupt:
                raise CheckpointError(files.unreadable)


def _earlier_calls(run_dir: Path) -> dict:
    """What the run's results.json holds of the calls before this one (a resume): their wall
    seconds in all, and their environments, oldest first (none for a new run)."""
    try:
        saved = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        saved = {}
    if not isinstance(saved, dict):
        saved = {}
    seconds = saved.get("wall_seconds")
    environments = saved.get("earlier_environments")
    environments = list(environments) if isinstance(environments, list) else []
    if isinstance(saved.get("environment"), dict):
        environments.append(saved["environment"])
    return {"wall_seconds": float(seconds) if isinstance(seconds, (int, float)) else 0.0,
            "environments": environments}


@contextlib.contextmanager
def _only_run_in(run_dir: Path, rank: int):
    """Hold the run directory for this run (process 0 locks it, every process learns whether
    it could): two runs resuming one directory would train every seed twice into the same
    files."""
    fd, refusal = _lock(run_dir) if rank == 0 else (None, None)
    try:
        refusal = broadcast_object(refusal)
        if refusal is not None:
            raise ConfigError(refusal)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _lock(run_dir: Path):
    """(the descriptor holding ``run_dir``'s lock or None, why another run holds it or
    None). File systems without flock (NFS without local locks, Lustre without the flock
    option) leave the run unlocked, with a warning."""
    if fcntl is None:
        return None, None
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, (f"{run_dir} is in use by another dgl_maxk run; wait for it to end (or "
                      "stop it) before resuming")
    except OSError as err:
        os.close(fd)
        LOG.warning(f"{run_dir} cannot be locked here ({err.strerror}): make sure no other "
                    "run resumes it meanwhile")
        return None, None
    return fd, None


def _new_run_dir(out, cfg, rank) -> Path:
    """``<out>/<name>-<timestamp>`` with the config in it, made by process 0 (under
    torchrun every process gets its path)."""
    run_dir = None
    if rank == 0:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = Path(out) / f"{cfg['name']}-{stamp}"
        run_dir, i = base, 1
        while run_dir.exists():
            run_dir, i = Path(f"{base}-{i}"), i + 1
        run_dir.mkdir(parents=True)
        text = yaml.safe_dump(cfg, sort_keys=False).encode()
        try:
            atomic_write_bytes(run_dir / "config.yaml", lambda f: f.write(text))
        except OSError:  # a full disk: no run directory without its config
            run_dir.rmdir()
            raise
    return Path(broadcast_object(str(run_dir) if run_dir else None))


def _stdout_level(quiet: bool, verbose: bool) -> int:
    """The least level of the lines a run prints: epoch lines are DEBUG, the run's settings
    and scores INFO."""
    if quiet and verbose:
        raise ConfigError("quiet and verbose exclude each other; give one of them")
    return logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO


class _Console(logging.StreamHandler):
    """The terminal's share of the run's lines, written around the progress bars (tqdm
    clears them for the line and draws them again below it)."""

    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


class _RunLogFile(logging.FileHandler):
    """log.txt. A line it cannot take (a full disk) stops the run with an OSError naming the
    file, as the other run files do; logging would print a traceback for each line and go
    on."""

    def handleError(self, record):
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            raise OSError(err.errno, err.strerror, self.baseFilename) from None
        super().handleError(record)


@contextlib.contextmanager
def _run_log(run_dir: Path, stdout_level: int, rank: int):
    """The ``dgl_maxk`` logger's lines go to the run's log.txt, all of them, and to stdout
    from ``stdout_level`` up, on process 0, for the duration of the block; yields the stdout
    handler (None on other processes)."""
    logger = logging.getLogger("dgl_maxk")
    handlers, stdout = [], None
    if rank == 0:
        stdout = _Console(sys.stdout)
        stdout.setLevel(stdout_level)
        handlers = [stdout, _RunLogFile(run_dir / "log.txt", encoding="utf-8")]
    saved = logger.level, logger.propagate
    # the run prints its own lines: a handler of the root logger would print each twice
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    try:
        yield stdout
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            with contextlib.suppress(OSError):  # a line log.txt could not take raised already
                handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _run_precision(variants) -> str | dict:
    """The variants' train.precision: one name when they share it, else {variant: name}."""
    precisions = {name: v["train"]["precision"] for name, v in variants.items()}
    shared = set(precisions.values())
    return shared.pop() if len(shared) == 1 else precisions


def _log_header(run_dir, device, world, cfg, variants, loaded):
    LOG.info(f"run directory: {run_dir}")
    p = _run_precision(variants)
    if isinstance(p, str):
        LOG.info(f"precision: {p} (float32 matmul precision '{MATMUL_PRECISION[p]}'"
                 + (", bfloat16 autocast" if p == "bf16" else "")
                 + ("" if p == "fp32" or tf32_tensor_cores(device)
                    else "; this device has no TF32 tensor cores") + ")")
    else:
        LOG.info("precision: " + ", ".join(f"{n} {v}" for n, v in p.items()))
    LOG.info(f"device: {device}" + (f" (x{world} processes)" if world > 1 else "")
             + f"; variants: {', '.join(variants)}; seeds: {cfg['train']['seeds']}")
    sampled = {n: v for n, v in variants.items() if v["mode"] == "minibatch"}
    if sampled:
        LOG.info(_minibatch_steps_line(sampled, device, world))
    dgl_sampled = [n for n, v in sampled.items() if v["sampling"]["sampler"] == "dgl"]
    threads = torch.get_num_threads()
    if dgl_sampled and threads > 1:
        LOG.warning(f"{', '.join(dgl_sampled)}: DGL's sampler with {threads} threads draws "
                    "other neighbours from run to run with the same seed; for repeatable runs "
                    "use --threads 1 (or OMP_NUM_THREADS=1)")
    for line in loaded:
        LOG.info(line)


def _minibatch_steps_line(variants, device, world) -> str:
    """What ``sampling.cuda_graph`` (auto by default) resolved to, per variant."""
    settings = {str(v["sampling"]["cuda_graph"]).lower() for v in variants.values()}
    graphed = {n: graphed_minibatch(v, device, world) for n, v in variants.items()}
    steps = ", ".join(f"{n} {'graphed' if g else 'eager'}" for n, g in graphed.items())
    return (f"mini-batch steps (sampling.cuda_graph: {', '.join(sorted(settings))}): {steps}"
            + (" (graphed: replayed from a CUDA graph over padded blocks)"
               if any(graphed.values()) else ""))


def _train_variants(variants, cache, run_dir, device, budget, signals, progress,
                    restart_corrupt, summaries: dict) -> bool:
    """Whether every variant finished, training until a stop; ``summaries`` ({variant:
    summary}) holds each seed as soon as it finished, for a stop at once to report."""
    for vname, vcfg in variants.items():
        dataset = cache[_dataset_key(vcfg)]
        per_seed = []
        summaries[vname] = variant_summary(vcfg, dataset, per_seed)
        for seed in vcfg["train"]["seeds"]:
            if any_process(budget.exhausted() or signals.signal_name is not None, device):
                return False
            tag = f"[{vname} seed {seed}] "
            res = run_seed(vcfg, dataset, seed, device, run_dir / vname / f"seed{seed}",
                           budget=budget, progress=progress, tag=tag, signals=signals,
                           restart_corrupt=restart_corrupt)
            if res is None:
                return False
            LOG.info(f"{tag}best val {res['best_val']:.4f} at epoch {res['best_epoch']}: "
                     f"test {res['test_at_best_val']:.4f}")
            per_seed.append(res)
            summaries[vname] = variant_summary(vcfg, dataset, per_seed)
    return True
