"""A seed's files: atomic writes, checkpoints with RNG states, and what a resume starts from.

``<seed_dir>/checkpoint.pt`` holds the model, optimizer, scheduler, RNG states, epoch,
best-so-far and history; ``<seed_dir>/result.json`` the finished seed's result. Every write
goes to a temporary file that replaces the old one only once it is complete, with SIGINT and
SIGTERM held back until then: a crash or a signal leaves the previous file intact and no
temporary file behind.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
import random
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import CheckpointError, ConfigError

LOG = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CHECKPOINT_KEYS = ("config", "seed", "model", "optimizer", "scheduler", "state", "rng")


@contextlib.contextmanager
def signals_deferred():
    """SIGINT and SIGTERM that arrive in the block take effect when it ends (through the
    handlers in place before it). Only the main thread can hold them back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in caught:
            signal.raise_signal(signum)


def atomic_write_bytes(path: Path, write):
    """``write(buffer)`` into memory, then its bytes into ``path`` atomically; the temporary
    file never outlives the call. A write that fails (a full disk) raises an OSError naming
    ``path``: the system's error names no file, and torch.save, writing to the disk itself,
    would turn it into a RuntimeError about a zip position."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with signals_deferred():
        buffer = io.BytesIO()
        write(buffer)
        try:
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise OSError(err.errno, err.strerror, str(path)) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def save_checkpoint(path: Path, state: dict):
    """torch.save to ``path`` atomically (a crash leaves the previous checkpoint intact)."""
    atomic_write_bytes(path, lambda f: torch.save(state, f))


def write_json(path: Path, obj):
    text = json.dumps(obj, indent=1, default=_json_default).encode()
    atomic_write_bytes(path, lambda f: f.write(text))


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def load_checkpoint(path: Path) -> dict:
    """The checkpoint at ``path``; a CheckpointError naming it when it cannot be read."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    # an unpickler fed a damaged file raises almost anything (EOFError, UnpicklingError,
    # RuntimeError from the zip reader, ValueError, KeyError ...): each means "unreadable"
    except Exception as err:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(err).__name__}: "
                              f"{_first_line(err)}); pass --restart-corrupt to restart that "
                              "seed from scratch") from None
    if not isinstance(ckpt, dict) or not all(k in ckpt for k in CHECKPOINT_KEYS):
        raise CheckpointError(f"checkpoint {path} is not a dgl_maxk checkpoint; pass "
                              "--restart-corrupt to restart that seed from scratch")
    return ckpt


def _first_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else "no message"


def read_result(path: Path, seed: int, epochs: int) -> dict | None:
    """The finished seed's result at ``path``, or None when it is missing, unreadable or not
    the complete result of that seed and epoch count."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    complete = (isinstance(result, dict) and result.get("seed") == seed
                and result.get("epochs") == epochs and isinstance(result.get("history"), list))
    return result if complete else None


def config_changes(saved: dict, cfg: dict) -> list[str]:
    """What differs between a seed file's ``comparable`` config and ``cfg``'s, as
    'key: saved -> now' (empty when they agree)."""
    now, saved = _flat(comparable(cfg)), _flat(_normalized(saved))
    return [f"{key}: {saved.get(key, '(unset)')} -> {now.get(key, '(unset)')}"
            for key in sorted(set(now) | set(saved)) if now.get(key) != saved.get(key)]


def _flat(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def comparable(cfg) -> dict:
    """The part of a config that decides a run's result (for resume checks)."""
    keys = ("mode", "dataset", "model", "train") + (("sampling",) if cfg["mode"] == "minibatch"
                                                      else ())
    return _normalized(json.loads(json.dumps({k: cfg[k] for k in keys})))


def _normalized(config: dict) -> dict:
    """``config`` without what does not decide a seed's result (``sampling.prefetch``: how
    far ahead batches are made, not which; ``train.cuda_graph``, ``sampling.cuda_graph``
    and ``train.sparse_features``: how the step is run; which other seeds run, how often to
    log and to checkpoint; where the data lies), and with what older checkpoints left
    implicit (before ``sampling.sampler`` existed, DGL's sampler sampled)."""
    config = copy.deepcopy(config)
    for key in ("cuda_graph", "sparse_features", "seeds", "log_every", "checkpoint_every"):
        config.get("train", {}).pop(key, None)
    config.get("dataset", {}).pop("root", None)
    sampling = config.get("sampling")
    if sampling is not None:
        sampling.setdefault("sampler", "dgl")
        sampling.pop("prefetch", None)
        sampling.pop("cuda_graph", None)
    return config


@dataclass
class SeedFiles:
    """What a seed directory holds: the finished result, a readable checkpoint, or the
    reason its checkpoint is unreadable (the message of a CheckpointError)."""
    result: dict | None = None
    checkpoint: dict | None = None
    unreadable: str | None = None


def inspect_seed(seed_dir: Path, cfg: dict, seed: int) -> SeedFiles:
    """A seed's files, checked: a checkpoint of another config or seed is a ConfigError; a
    complete, readable result.json is kept even when the checkpoint is unreadable (such a
    seed is never retrained). Changes nothing on disk."""
    seed_dir = Path(seed_dir)
    ckpt_path = seed_dir / "checkpoint.pt"
    result = read_result(seed_dir / "result.json", seed, cfg["train"]["epochs"])
    if result is not None and "config" in result:  # (results before 2026-12 hold none)
        _refuse_changes(seed_dir / "result.json", result["config"], cfg)
    if not ckpt_path.exists():
        return SeedFiles(result=result)
    try:
        ckpt = load_checkpoint(ckpt_path)
    except CheckpointError as err:
        return SeedFiles(result=result) if result is not None else SeedFiles(
            unreadable=str(err))
    if ckpt["seed"] != seed:
        raise ConfigError(f"{ckpt_path} was written for seed {ckpt['seed']}, not {seed}; "
                          "refusing to resume from it")
    _refuse_changes(ckpt_path, ckpt["config"], cfg)
    if ckpt["state"]["finished"] and result is not None:
        return SeedFiles(result=result)
    return SeedFiles(checkpoint=ckpt)


def _refuse_changes(path: Path, saved: dict, cfg: dict):
    changes = config_changes(saved, cfg)
    if changes:
        raise ConfigError(f"{path} was written for another config ({'; '.join(changes)}); "
                          "refusing to resume from it: restore those values in the run's "
                          "config.yaml, or start a new run")


def move_aside(path: Path) -> Path:
    """Rename an unreadable file to ``<name>.corrupt`` (kept for inspection)."""
    path = Path(path)
    target = path.with_name(path.name + ".corrupt")
    os.replace(path, target)
    LOG.warning(f"moved the unreadable {path} aside to {target.name}; that seed restarts "
                "from scratch")
    return target


def rng_state(device) -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def own_rng_state(saved, rank: int, world: int) -> dict:
    """This process's random state from a checkpoint's ``rng``: one per process (a list), or
    one for all (a dict, from checkpoints older than the list)."""
    if isinstance(saved, dict):
        return saved
    if len(saved) != world:
        LOG.warning(f"the checkpoint was written by {len(saved)} processes and is resumed by "
                    f"{world}: the run goes on, but will not repeat an uninterrupted one")
        return saved[rank % len(saved)]
    return saved[rank]


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if torch.device(device).type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
