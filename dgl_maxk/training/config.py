"""Experiment configs: the schema of every key, validation, overrides and variants.

A config is a dict (usually YAML) with the sections below; :data:`SCHEMA` lists every key,
its type and its default, and :func:`validate_config` rejects anything else, naming the key.

.. code-block:: yaml

    name: cora_gcn
    mode: full                      # 'full' (the paper's) or 'minibatch' (sampled blocks)
    dataset: {name: cora, root: null, self_loops: true, params: {}}
    model: {name: gcn, hidden: 256, layers: 2, dropout: 0.5, nonlinearity: maxk, k: 32}
    train: {epochs: 400, lr: 0.01, weight_decay: 0.0, schedule: constant, seeds: [0, 1, 2],
            eval_every: 1, log_every: 1, checkpoint_every: 50, precision: tf32}
    variants:                       # optional: run the config once per variant
      maxk: {model.nonlinearity: maxk}
      relu: {model.nonlinearity: relu}
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import yaml

from .. import data as _data
from ..models import MODELS
from .errors import ConfigError

__all__ = ["ConfigError", "SCHEMA", "load_config", "validate_config", "apply_overrides",
           "expand_variants", "resolve_key", "parse_assignment"]

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
        "precision": Field(str, "tf32", choices=("fp32", "tf32", "bf16"),
                           doc="fp32: full fp32 matmuls; tf32 (the paper's): TF32 matmuls; "
                               "bf16: TF32 plus torch.autocast with bfloat16 (MaxK values "
                               "in bf16, aggregation accumulated in fp32)"),
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
