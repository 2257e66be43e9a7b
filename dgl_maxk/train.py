"""Training MaxK-GNN models from a config: validation, full-graph training, results.

A config is a dict (usually YAML) with the sections below; :data:`SCHEMA` lists every key,
its type and its default, and :func:`validate_config` rejects anything else, naming the key.

.. code-block:: yaml

    name: cora_gcn
    mode: full                      # only 'full' so far (mini-batch comes later)
    dataset: {name: cora, root: null, self_loops: true, params: {}}
    model: {name: gcn, hidden: 256, layers: 2, dropout: 0.5, nonlinearity: maxk, k: 32}
    train: {epochs: 400, lr: 0.01, weight_decay: 0.0, schedule: constant, seeds: [0, 1, 2],
            eval_every: 1, log_every: 1, checkpoint_every: 50}
    variants:                       # optional: run the config once per variant
      maxk: {model.nonlinearity: maxk}
      relu: {model.nonlinearity: relu}

Training (:func:`run_seed`): Adam with the config's learning rate (constant, the paper's
schedule, or cosine) and weight decay, cross-entropy (or binary cross-entropy for multi-label
data), evaluation of train/val/test after each epoch, test reported at the best validation
epoch. Checkpoints (model, optimizer, scheduler, RNG states, epoch, best-so-far, history) are
written atomically; resuming from one continues the exact same computation.

A run directory holds ``config.yaml`` (the resolved config), ``log.txt``,
``<variant>/seed<N>/{checkpoint.pt,result.json}`` and ``results.json`` (config, environment,
per-seed histories and scores, mean and std per variant, timings).
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch.nn import functional as F

from . import data as _data
from . import minibatch
from .minibatch import loss_fn, synchronize
from ._dgl import dgl
from .models import MODELS, build_model
from .training.errors import ConfigError

__all__ = ["ConfigError", "SCHEMA", "load_config", "validate_config", "apply_overrides",
           "expand_variants", "run_experiment", "run_seed", "evaluate"]


REQUIRED = object()


class Field:
    """One config key: its type(s), default and allowed values."""

    def __init__(self, types, default=None, choices=None, check=None, doc=""):
        self.types = types if isinstance(types, tuple) else (types,)
        self.default, self.choices, self.check, self.doc = default, choices, check, doc

    def validate(self, key, value):
        if value is None and self.default is None and self.default is not REQUIRED:
            return None
        if value is REQUIRED or (value is None and self.default is REQUIRED):
            raise ConfigError(f"config key '{key}' is required")
        ok = False
        for typ in self.types:
            if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
                value, ok = float(value), True
                break
            if typ is int and isinstance(value, int) and not isinstance(value, bool):
                ok = True
                break
            if typ not in (int, float) and isinstance(value, typ):
                ok = True
                break
        if not ok:
            names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in self.types)
            raise ConfigError(f"config key '{key}' must be {names}, got {value!r} "
                              f"({type(value).__name__})")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"config key '{key}' must be finite, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"config key '{key}' must be one of {list(self.choices)}, "
                              f"got {value!r}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(f"config key '{key}' {problem}, got {value!r}")
        return value


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
               dict: "a mapping", list: "a list"}


def _positive(v):
    return None if v > 0 else "must be positive"


def _non_negative(v):
    return None if v >= 0 else "must be >= 0"


def _probability(v):
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _seeds_ok(v):
    if isinstance(v, int):
        return None if v >= 1 else "must be a positive count or a list of seeds"
    if not v or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v):
        return "must be a non-empty list of non-negative integers"
    if len(set(v)) != len(v):
        return "must not repeat a seed"
    return None


def _fanouts_ok(v):
    if not v or not all(isinstance(f, int) and not isinstance(f, bool) and (f > 0 or f == -1)
                        for f in v):
        return "must be a non-empty list of positive integers (or -1 for all neighbours)"
    return None


MODES = ("full", "minibatch")

#: Every config key: section -> key -> Field (top-level keys map straight to a Field).
SCHEMA = {
    "name": Field(str, None, doc="run name (default: the config file's stem)"),
    "description": Field(str, None),
    "mode": Field(str, "full", choices=MODES,
                  doc="'full' (full-graph, the paper's) or 'minibatch' (sampled blocks)"),
    "dataset": {
        "name": Field(str, REQUIRED),
        "root": Field(str, None, doc="data root (default $DGL_MAXK_DATA, else ./data)"),
        "self_loops": Field(bool, True),
        "params": Field(dict, {}, doc="generator / loader parameters"),
    },
    "model": {
        "name": Field(str, REQUIRED, choices=tuple(sorted(MODELS))),
        "hidden": Field(int, 256, check=_positive),
        "layers": Field(int, 2, check=_positive),
        "dropout": Field(float, 0.5, check=_probability),
        "input_dropout": Field(float, 0.0, check=_probability,
                               doc="dropout on the input features (training only)"),
        "nonlinearity": Field(str, "maxk", choices=("maxk", "relu")),
        "k": Field(int, 32, check=_positive),
    },
    "train": {
        "epochs": Field(int, 200, check=_positive),
        "lr": Field(float, 0.01, check=_positive),
        "weight_decay": Field(float, 0.0, check=_non_negative),
        "schedule": Field(str, "constant", choices=("constant", "cosine")),
        "seeds": Field((list, int), [0], check=_seeds_ok),
        "eval_every": Field(int, 1, check=_positive),
        "log_every": Field(int, 1, check=_positive),
        "checkpoint_every": Field(int, 50, check=_non_negative),
        "precision": Field(str, "fp32", choices=("fp32", "bf16"),
                           doc="bf16: torch.autocast with bfloat16 (MaxK values in bf16, "
                               "aggregation accumulated in fp32)"),
        "sparse_features": Field(bool, False,
                                 doc="feed the input features to lin_in as a sparse matrix "
                                     "(same result; much faster for bag-of-words features "
                                     "such as Cora's)"),
    },
    "sampling": {
        "fanouts": Field(list, [15, 10, 5], check=_fanouts_ok,
                         doc="neighbours sampled per layer, input layer first (-1: all)"),
        "batch_size": Field(int, 1024, check=_positive, doc="seed nodes per mini-batch"),
    },
    "variants": Field(dict, None, doc="name -> {dotted key: value} overrides"),
}


def _leaf_keys():
    out = {}
    for section, spec in SCHEMA.items():
        if isinstance(spec, dict):
            for key in spec:
                out.setdefault(key, []).append(f"{section}.{key}")
    return out


def resolve_key(key: str) -> str:
    """A dotted key, or a short one ('k', 'hidden', 'lr') when it names one key only."""
    parts = key.split(".")
    if len(parts) == 1:
        if key in SCHEMA:
            return key
        matches = _leaf_keys().get(key, [])
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ConfigError(f"config key '{key}' is ambiguous: use one of {matches}")
        raise ConfigError(f"unknown config key '{key}'")
    section = parts[0]
    if section not in SCHEMA or not isinstance(SCHEMA[section], dict):
        raise ConfigError(f"unknown config key '{key}' (no section '{section}'; sections: "
                          f"{[s for s in SCHEMA if isinstance(SCHEMA[s], dict)]})")
    if parts[1] not in SCHEMA[section]:
        raise ConfigError(f"unknown config key '{key}' (known keys in '{section}': "
                          f"{sorted(SCHEMA[section])})")
    if len(parts) > 2 and not (section == "dataset" and parts[1] == "params"):
        raise ConfigError(f"unknown config key '{key}'")
    return key


def _set(cfg: dict, key: str, value):
    parts = resolve_key(key).split(".")
    node = cfg
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        if not isinstance(node[part], dict):
            raise ConfigError(f"config key '{'.'.join(parts[:-1])}' must be a mapping")
        node = node[part]
    node[parts[-1]] = value


def parse_assignment(text: str):
    """'model.k=16' -> ('model.k', 16); values are YAML ('true', '[0, 1]', '1e-3')."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. model.k=16)")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override of '{key}': cannot parse {raw!r}: {err}") from None
    if isinstance(value, str) and _looks_numeric(value):
        value = float(value)  # YAML 1.1 reads '1e-3' as a string
    return key, value


def _looks_numeric(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def apply_overrides(cfg: dict, overrides) -> dict:
    """A copy of ``cfg`` with ``overrides`` (['k=16', ...] or {'model.k': 16}) applied."""
    cfg = copy.deepcopy(cfg)
    items = overrides.items() if isinstance(overrides, dict) else map(parse_assignment,
                                                                       overrides or [])
    for key, value in items:
        _set(cfg, key, value)
    return cfg


def load_config(path, overrides=None) -> dict:
    """Read a YAML config, apply overrides and validate it (see :func:`validate_config`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    with open(path) as f:
        try:
            cfg = yaml.safe_load(f) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    cfg = apply_overrides(cfg, overrides)
    if not cfg.get("name"):
        cfg["name"] = path.stem
    return validate_config(cfg)


def _validate_single(cfg: dict) -> dict:
    if not isinstance(cfg, dict):
        raise ConfigError("a config must be a mapping")
    out = {}
    for key in cfg:
        if key not in SCHEMA:
            raise ConfigError(f"unknown config key '{key}' (known top-level keys: "
                              f"{list(SCHEMA)})")
    for section, spec in SCHEMA.items():
        if section == "variants":
            continue
        if isinstance(spec, Field):
            value = cfg.get(section, spec.default)
            out[section] = spec.validate(section, value)
            continue
        given = cfg.get(section) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"config key '{section}' must be a mapping")
        for key in given:
            if key not in spec:
                raise ConfigError(f"unknown config key '{section}.{key}' (known keys in "
                                  f"'{section}': {sorted(spec)})")
        out[section] = {}
        for key, field in spec.items():
            value = given[key] if key in given else (
                field.default if field.default is REQUIRED else copy.deepcopy(field.default))
            out[section][key] = field.validate(f"{section}.{key}", value)
    if out["mode"] == "minibatch":
        if len(out["sampling"]["fanouts"]) != out["model"]["layers"]:
            raise ConfigError(f"config key 'sampling.fanouts' needs one fan-out per layer "
                              f"(model.layers = {out['model']['layers']}), got "
                              f"{out['sampling']['fanouts']}")
        if out["train"]["sparse_features"]:
            raise ConfigError("config key 'train.sparse_features' is for full-graph training; "
                              "mode 'minibatch' gathers dense feature rows per batch")
    try:
        out["dataset"]["name"] = _data.canonical_name(out["dataset"]["name"])
    except ValueError as err:
        raise ConfigError(f"config key 'dataset.name': {err}") from None
    try:
        out["dataset"]["params"] = _data.check_params(
            out["dataset"]["name"], out["dataset"]["params"], "dataset.params")
    except ValueError as err:
        raise ConfigError(f"config key {err}") from None
    model = out["model"]
    if model["nonlinearity"] == "maxk" and model["k"] > model["hidden"]:
        raise ConfigError(f"config key 'model.k' = {model['k']} exceeds model.hidden = "
                          f"{model['hidden']} (MaxK keeps k of the hidden entries)")
    seeds = out["train"]["seeds"]
    out["train"]["seeds"] = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    return out


def validate_config(cfg: dict) -> dict:
    """The config with defaults filled in; raises :class:`ConfigError` naming the key for
    unknown keys, wrong types, unknown datasets or models, k > hidden, unsupported modes.
    Every variant is validated too."""
    variants = cfg.get("variants")
    out = _validate_single({k: v for k, v in cfg.items() if k != "variants"})
    if variants is not None:
        if not isinstance(variants, dict) or not variants:
            raise ConfigError("config key 'variants' must be a non-empty mapping of variant "
                              "name -> {key: value} overrides")
        checked = {}
        for name, overrides in variants.items():
            if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"config key 'variants': name {name!r} must be letters, "
                                  "digits, '-' or '_'")
            overrides = overrides or {}
            if not isinstance(overrides, dict):
                raise ConfigError(f"config key 'variants.{name}' must be a mapping of "
                                  "overrides")
            for key in overrides:
                if resolve_key(key) in ("variants", "name", "train.seeds"):
                    raise ConfigError(f"config key 'variants.{name}.{key}' cannot be set "
                                      "per variant")
            try:
                _validate_single(apply_overrides(out, overrides))
            except ConfigError as err:
                raise ConfigError(f"variant '{name}': {err}") from None
            checked[name] = {resolve_key(k): v for k, v in overrides.items()}
        out["variants"] = checked
    else:
        out["variants"] = None
    return out


def expand_variants(cfg: dict) -> dict:
    """{variant name: full config} -- one entry named after the nonlinearity (and k) when the
    config has no variants."""
    if not cfg.get("variants"):
        single = {k: v for k, v in cfg.items() if k != "variants"}
        return {_default_variant_name(single): single}
    out = {}
    for name, overrides in cfg["variants"].items():
        base = {k: v for k, v in cfg.items() if k != "variants"}
        out[name] = _validate_single(apply_overrides(base, overrides))
    return out


def _default_variant_name(cfg):
    m = cfg["model"]
    return f"maxk{m['k']}" if m["nonlinearity"] == "maxk" else "relu"


# --------------------------------------------------------------------------- metrics


def evaluate(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, metric: str,
             evaluator: str | None = None) -> float:
    """The dataset's metric on the masked nodes: 'accuracy' (argmax; through the OGB
    Evaluator for OGB datasets), 'micro_f1' (multi-label, logit > 0) or 'rocauc' (OGB)."""
    logits, labels = logits[mask], labels[mask]
    if labels.shape[0] == 0:
        return float("nan")
    if metric == "accuracy":
        pred = logits.argmax(dim=1)
        if evaluator is not None:
            from ogb.nodeproppred import Evaluator
            return float(Evaluator(evaluator).eval({
                "y_true": labels.reshape(-1, 1).cpu(),
                "y_pred": pred.reshape(-1, 1).cpu()})["acc"])
        return float((pred == labels).float().mean())
    if metric == "micro_f1":
        pred = logits > 0
        truth = labels > 0.5
        tp = (pred & truth).sum().item()
        fp = (pred & ~truth).sum().item()
        fn = (~pred & truth).sum().item()
        return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    if metric == "rocauc":
        from ogb.nodeproppred import Evaluator
        return float(Evaluator(evaluator or "ogbn-proteins").eval({
            "y_true": labels.cpu(), "y_pred": logits.detach().cpu()})["rocauc"])
    raise ValueError(f"unknown metric {metric!r}")


# --------------------------------------------------------------------------- helpers


def resolve_device(device: str = "auto") -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available here")
    return dev


def environment(device) -> dict:
    """Versions and machine facts for the results file."""
    import dgl_maxk

    def version(module):
        try:
            return __import__(module).__version__
        except Exception:  # noqa: BLE001
            return None

    env = {"python": sys.version.split()[0], "platform": platform.platform(),
           "host": socket.gethostname(), "torch": torch.__version__,
           "dgl": version("dgl"), "ogb": version("ogb"), "numpy": np.__version__,
           "dgl_maxk": dgl_maxk.__version__, "device": str(device),
           "torch_threads": torch.get_num_threads(),
           "backend": os.environ.get("DGL_MAXK_BACKEND", "auto")}
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    try:
        env["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5).stdout.strip() or None
    except Exception:  # noqa: BLE001
        env["git_commit"] = None
    return env


def _atomic_write_bytes(path: Path, write):
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(path: Path, state: dict):
    """torch.save to ``path`` atomically (a crash leaves the previous checkpoint intact)."""
    _atomic_write_bytes(Path(path), lambda f: torch.save(state, f))


def write_json(path: Path, obj):
    text = json.dumps(obj, indent=1, default=_json_default).encode()
    _atomic_write_bytes(Path(path), lambda f: f.write(text))


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _rng_state(device):
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _Stop(Exception):
    pass


class Budget:
    """When to stop early (leaving a resumable checkpoint): after ``epochs`` more epochs in
    this process, or once ``seconds`` of wall time have passed."""

    def __init__(self, epochs=None, seconds=None):
        self.epochs_left = epochs
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def tick(self) -> bool:
        """Count one epoch; True when the run must stop now."""
        if self.epochs_left is not None:
            self.epochs_left -= 1
            if self.epochs_left <= 0:
                return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def exhausted(self) -> bool:
        return (self.epochs_left is not None and self.epochs_left <= 0) or (
            self.deadline is not None and time.monotonic() >= self.deadline)


# --------------------------------------------------------------------------- full-graph run


def run_seed(cfg: dict, dataset, seed: int, device, seed_dir: Path, budget: Budget | None
             = None, progress: bool = True, log=print, tag: str = "") -> dict | None:
    """Train one model for one seed: on the whole graph (mode 'full') or on sampled blocks
    (mode 'minibatch', data-parallel under torchrun); evaluation is on the whole graph.

    Resumes from ``seed_dir/checkpoint.pt`` when it exists (returning the stored result at
    once when that run had finished). Returns the seed's result (scores, best epoch,
    history, timings), or None when ``budget`` stopped it early (its checkpoint is written).
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    seed_dir = Path(seed_dir)
    seed_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, result_path = seed_dir / "checkpoint.pt", seed_dir / "result.json"
    m, t = cfg["model"], cfg["train"]

    seed_everything(seed)
    model = build_model(m["name"], dataset.num_features, m["hidden"], dataset.num_classes,
                        m["layers"], k=m["k"], dropout=m["dropout"],
                        nonlinearity=m["nonlinearity"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=t["lr"],
                                 weight_decay=t["weight_decay"])
    scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=t["epochs"])
                 if t["schedule"] == "cosine" else None)

    rank = dist.get_rank() if minibatch.is_distributed() else 0
    train_model = model
    if minibatch.is_distributed():
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    graph = dataset.graph  # stays on the CPU; dgl_maxk's layers move its structure
    feat = dataset.features.to(device)
    if t["sparse_features"]:
        model.lin_in = SparseInputLinear(model.lin_in)  # same parameters and state dict
        feat = feat.to_sparse().coalesce()
    labels = dataset.labels.to(device)
    masks = {s: getattr(dataset, f"{s}_mask").to(device) for s in ("train", "val", "test")}
    train_idx = masks["train"].nonzero().squeeze(1)
    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16,
                              enabled=t["precision"] == "bf16")

    def epoch_loader(epoch):
        """A fresh loader per epoch: DGL's shuffles its seed order in place, so a long-lived
        one would make each epoch's order depend on all earlier ones (and break resume)."""
        # DGL's sampler has its own generator, which checkpoints cannot hold: seed it from
        # (seed, epoch) so a resumed run samples what an uninterrupted one does.
        dgl.seed(seed * 100_003 + epoch)
        s_cfg = cfg["sampling"]
        return minibatch.make_loader(graph, train_idx.cpu(), s_cfg["fanouts"],
                                     s_cfg["batch_size"], seed * 100_003 + epoch,
                                     use_ddp=minibatch.is_distributed())

    state = {"epoch": 0, "best": {"val": -math.inf, "epoch": None, "test": None,
                                   "train": None},
             "history": [], "train_seconds": 0.0, "eval_seconds": 0.0, "finished": False}
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ckpt["config"] != _comparable(cfg) or ckpt["seed"] != seed:
            raise ConfigError(f"{ckpt_path} was written for another config or seed; "
                              "refusing to resume from it")
        if ckpt["state"]["finished"] and result_path.exists():
            with open(result_path) as f:
                return json.load(f)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(ckpt["scheduler"])
        state = ckpt["state"]
        _set_rng_state(ckpt["rng"], device)
        log(f"{tag}resuming from epoch {state['epoch']} ({ckpt_path})")

    def checkpoint():
        if rank != 0:  # one writer; every process resumes from the same file
            return
        save_checkpoint(ckpt_path, {
            "config": _comparable(cfg), "seed": seed, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "state": state, "rng": _rng_state(device)})

    metric, evaluator = dataset.metric, dataset.evaluator
    bar = tqdm(total=t["epochs"], initial=state["epoch"], desc=tag.strip() or "train",
               disable=None if progress else True, leave=False, file=sys.stderr, dynamic_ncols=True)
    stopped = False
    try:
        for epoch in range(state["epoch"] + 1, t["epochs"] + 1):
            synchronize(device)
            start = time.perf_counter()
            if cfg["mode"] == "full":
                train_model.train()
                optimizer.zero_grad(set_to_none=True)
                x = _input_dropout(feat, m["input_dropout"])
                with autocast():
                    logits = train_model(graph, x)
                    loss = loss_fn(logits[train_idx].float(), labels[train_idx],
                                   dataset.multilabel)
                loss.backward()
                optimizer.step()
                loss_value = float(loss.detach())
            else:
                stats = minibatch.train_epoch(train_model, epoch_loader(epoch), feat, labels,
                                              optimizer, device, dataset.multilabel,
                                              input_dropout=m["input_dropout"],
                                              autocast=autocast)
                loss_value = minibatch.all_reduce_mean({"loss": stats["loss"]},
                                                       device)["loss"]
            if scheduler is not None:
                scheduler.step()
            synchronize(device)
            train_time = time.perf_counter() - start
            row = {"epoch": epoch, "loss": loss_value, "time": train_time}
            if epoch % t["eval_every"] == 0 or epoch == t["epochs"]:
                start = time.perf_counter()
                model.eval()
                with torch.no_grad(), autocast():
                    logits = model(graph, feat).float()
                for split in ("train", "val", "test"):
                    row[split] = evaluate(logits, labels, masks[split], metric, evaluator)
                synchronize(device)
                row["eval_time"] = time.perf_counter() - start
                state["eval_seconds"] += row["eval_time"]
                if row["val"] > state["best"]["val"]:
                    state["best"] = {"val": row["val"], "epoch": epoch, "test": row["test"],
                                     "train": row["train"]}
            state["train_seconds"] += train_time
            state["history"].append(row)
            state["epoch"] = epoch
            if epoch % t["log_every"] == 0 or epoch == t["epochs"]:
                line = (f"{tag}epoch {epoch:4d}/{t['epochs']} loss {row['loss']:.4f}")
                if "val" in row:
                    line += (f" train {row['train']:.4f} val {row['val']:.4f} "
                             f"test {row['test']:.4f}")
                line += f" time {train_time * 1e3:.1f} ms"
                bar.clear()
                log(line)
                bar.refresh()
            bar.update(1)
            out_of_budget = budget is not None and budget.tick()
            if epoch == t["epochs"]:
                state["finished"] = True
                checkpoint()
            elif out_of_budget:
                checkpoint()
                stopped = True
                break
            elif t["checkpoint_every"] and epoch % t["checkpoint_every"] == 0:
                checkpoint()
    finally:
        bar.close()
    if stopped:
        log(f"{tag}stopped after epoch {state['epoch']}; resume with --resume")
        return None
    epochs_run = len(state["history"])
    result = {
        "seed": seed, "epochs": state["epoch"], "metric": metric,
        "best_epoch": state["best"]["epoch"], "best_val": state["best"]["val"],
        "test_at_best_val": state["best"]["test"], "train_at_best_val": state["best"]["train"],
        "final": {s: state["history"][-1].get(s) for s in ("loss", "train", "val", "test")},
        "train_seconds": state["train_seconds"], "eval_seconds": state["eval_seconds"],
        "mean_epoch_seconds": state["train_seconds"] / max(1, epochs_run),
        "median_epoch_seconds": float(np.median([r["time"] for r in state["history"]])),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "history": state["history"],
    }
    if rank == 0:
        write_json(result_path, result)
    return result


class SparseInputLinear(torch.nn.Module):
    """``nn.Linear`` that also takes a sparse COO input (``torch.sparse.mm``), holding the
    very parameters of the Linear it replaces (state dicts are unchanged)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x):
        if not x.is_sparse:
            return F.linear(x, self.weight, self.bias)
        with torch.autocast(x.device.type, enabled=False):  # sparse mm has no bf16 backward
            out = torch.sparse.mm(x, self.weight.t())
        return out if self.bias is None else out + self.bias


def _input_dropout(x, p):
    """Dropout on input features (training only); on the stored values of a sparse input."""
    if not p:
        return x
    if x.is_sparse:
        return torch.sparse_coo_tensor(x.indices(), F.dropout(x.values(), p), x.shape,
                                       is_coalesced=True)
    return F.dropout(x, p)


def _comparable(cfg):
    """The part of a config that decides a run's result (for resume checks)."""
    keys = ("mode", "dataset", "model", "train") + (("sampling",) if cfg["mode"] == "minibatch"
                                                      else ())
    return json.loads(json.dumps({k: cfg[k] for k in keys}))


# --------------------------------------------------------------------------- experiments


def _stats(values):
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    arr = np.asarray(vals, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
            "n": len(vals)}


def _run_dir(out, name) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{name}-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    path.mkdir(parents=True)
    return path


class _Logger:
    def __init__(self, path: Path | None, quiet: bool = False):
        self.path, self.quiet = path, quiet

    def __call__(self, line: str):
        if not self.quiet:
            print(line, flush=True)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def run_experiment(cfg: dict | None = None, device="auto", out="runs", resume=None,
                   seeds=None, stop_after_epochs=None, time_limit=None, progress=True,
                   quiet=False, dataset_cache: dict | None = None) -> dict:
    """Run every variant and seed of a validated config; returns the results dict (also
    written to ``<run_dir>/results.json``).

    Parameters
    ----------
    cfg : dict -- from :func:`load_config` (ignored when resuming)
    device : 'auto' | 'cpu' | 'cuda' | 'cuda:N'
    out : directory in which the run directory ``<name>-<timestamp>`` is created
    resume : run directory to continue (its ``config.yaml`` is used)
    seeds : list of seeds or a count, replacing ``train.seeds``
    stop_after_epochs, time_limit : stop early with resumable checkpoints after this many
        epochs / seconds in this call (for machines with a time limit per command)
    dataset_cache : dict reused across calls to load each dataset once (scripts)
    """
    rank, world, dev = minibatch.init_distributed(resolve_device(device))
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a run directory)")
        with open(run_dir / "config.yaml") as f:
            cfg = validate_config(yaml.safe_load(f))
    else:
        if cfg is None:
            raise ConfigError("no config given")
        if seeds is not None:
            cfg = validate_config(apply_overrides(cfg, {"train.seeds": seeds}))
    variants = expand_variants(cfg)
    # load every dataset first: a missing one fails before the run directory exists
    cache = dataset_cache if dataset_cache is not None else {}
    loaded = []
    for vcfg in variants.values():
        dkey = json.dumps(vcfg["dataset"], sort_keys=True)
        if dkey not in cache:
            d = vcfg["dataset"]
            t0 = time.perf_counter()
            cache[dkey] = _data.load_dataset(d["name"], root=d["root"],
                                             self_loops=d["self_loops"], **d["params"])
            loaded.append(f"dataset {d['name']}: {cache[dkey].summary()} "
                          f"(loaded in {time.perf_counter() - t0:.1f} s)")
    if resume is None:
        run_dir = None
        if rank == 0:  # under torchrun, process 0 makes the run directory and writes the files
            run_dir = _run_dir(out, cfg["name"])
            with open(run_dir / "config.yaml", "w") as f:
                yaml.safe_dump(cfg, f, sort_keys=False)
        run_dir = Path(minibatch.broadcast_object(str(run_dir) if run_dir else None))
    log = _Logger(run_dir / "log.txt", quiet) if rank == 0 else _Logger(None, quiet=True)
    progress = progress and rank == 0
    env = environment(dev)
    log(f"run directory: {run_dir}")
    log(f"device: {dev}" + (f" (x{world} processes)" if world > 1 else "")
        + f"; variants: {', '.join(variants)}; seeds: {cfg['train']['seeds']}")
    for line in loaded:
        log(line)
    budget = Budget(stop_after_epochs, time_limit)
    results = {"name": cfg["name"], "config": cfg, "environment": env,
               "run_dir": str(run_dir), "variants": {}, "complete": False}
    started = time.perf_counter()
    complete = True
    for vname, vcfg in variants.items():
        dataset = cache[json.dumps(vcfg["dataset"], sort_keys=True)]
        per_seed = []
        for seed in vcfg["train"]["seeds"]:
            if budget.exhausted():
                complete = False
                break
            res = run_seed(vcfg, dataset, seed, dev, run_dir / vname /
                                        f"seed{seed}", budget=budget, progress=progress,
                                        log=log, tag=f"[{vname} seed {seed}] ")
            if res is None:
                complete = False
                break
            log(f"[{vname} seed {seed}] best val {res['best_val']:.4f} at epoch "
                f"{res['best_epoch']}: test {res['test_at_best_val']:.4f}")
            per_seed.append(res)
        m = vcfg["model"]
        results["variants"][vname] = {
            "model": m["name"], "nonlinearity": m["nonlinearity"],
            "k": m["k"] if m["nonlinearity"] == "maxk" else None, "hidden": m["hidden"],
            "layers": m["layers"], "dataset": vcfg["dataset"]["name"],
            "metric": dataset.metric,
            "test": _stats([r["test_at_best_val"] for r in per_seed]),
            "val": _stats([r["best_val"] for r in per_seed]),
            "epoch_seconds": _stats([r["median_epoch_seconds"] for r in per_seed]),
            "seeds": per_seed,
        }
        if not complete:
            break
    results["complete"] = complete
    results["wall_seconds"] = time.perf_counter() - started
    results["processes"] = world
    if rank != 0:
        return results
    write_json(run_dir / "results.json", results)
    log.quiet = False  # the summary is printed even with quiet
    for line in summary_lines(results):
        log(line)
    return results


def summary_lines(results: dict) -> list[str]:
    """A short human summary: one line per variant with mean +- std of test at best val."""
    lines = [f"== {results['name']}: test at best validation epoch (mean ± std over seeds)"]
    for vname, v in results["variants"].items():
        t, ep = v["test"], v["epoch_seconds"]
        if t["n"] == 0:
            lines.append(f"  {vname:>10}: no finished seed")
            continue
        what = f"k={v['k']}" if v["k"] is not None else "ReLU"
        lines.append(f"  {vname:>10} ({v['model']}, {what}, hidden {v['hidden']}): "
                     f"{v['metric']} {100 * t['mean']:.2f} ± {100 * t['std']:.2f} "
                     f"(n={t['n']}; val {100 * v['val']['mean']:.2f}; "
                     f"{1e3 * ep['mean']:.1f} ms/epoch)")
    if not results["complete"]:
        lines.append(f"  (incomplete: continue with --resume {results['run_dir']})")
    lines.append(f"  results: {results['run_dir']}/results.json")
    return lines
