"""Experiment configs: pydantic models of every section, and a thin layer of dotted overrides.

A config is a dict (usually YAML) with the sections below; the models list every key, its
type, its default and its bounds, and :func:`validate_config` rejects anything else with one
line naming the dotted key. A validated config is a plain dict (``model_dump()``), so
``config.yaml``, checkpoints and ``results.json`` keep their format.

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

Overrides name a key by its dotted path (``model.k=16``) or, when only one section has it,
by its short name (``k=16``); values are YAML.
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      field_validator, model_validator)

from ..data import DATASETS, canonical_name, check_params, dataset_names
from ..models import MODELS
from ..sampling.sampler import FANOUTS_RULE, check_fanouts
from ..sparse import MAX_WIDTH
from .errors import ConfigError

__all__ = ["ConfigError", "ExperimentConfig", "load_config", "validate_config",
           "apply_overrides", "expand_variants", "resolve_key", "parse_assignment"]


#: A run seed seeds NumPy's global generator too, which takes seeds 0 .. 2**32 - 1.
MAX_SEED = 2**32 - 1
#: Each seed is one training: more is a slip of the keyboard (a count of billions would not
#: even fit in memory as a list).
MAX_SEEDS = 10_000


def _seed_list(seeds):
    if isinstance(seeds, int):
        if not 1 <= seeds <= MAX_SEEDS:
            raise ValueError(f"must be a positive count of at most {MAX_SEEDS} seeds or a list "
                             "of seeds")
        return list(range(seeds))
    if not seeds or min(seeds) < 0:
        raise ValueError("must be a non-empty list of non-negative integers")
    if max(seeds) > MAX_SEED:
        raise ValueError(f"must hold seeds from 0 to {MAX_SEED} (NumPy's seed range)")
    if len(seeds) > MAX_SEEDS:
        raise ValueError(f"must hold at most {MAX_SEEDS} seeds")
    if len(set(seeds)) != len(seeds):
        raise ValueError("must not repeat a seed")
    return seeds


def _fanouts_ok(fanouts):
    try:
        return check_fanouts(fanouts)
    except ValueError:
        raise ValueError(FANOUTS_RULE) from None


class _Section(BaseModel):
    # strict: no silent conversions ('3' is not 3, 2.5 is not an integer, 1 is not true);
    # an integer is still accepted where a number is expected
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class DatasetConfig(_Section):
    name: str = Field(description="a name from `python -m dgl_maxk datasets`")
    root: Optional[str] = Field(None, description="data root (default $DGL_MAXK_DATA, "
                                                  "else ./data)")
    self_loops: bool = True
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="generator / loader parameters")

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, name):
        try:
            return canonical_name(name)
        except ValueError:
            raise ValueError(f"must be one of {dataset_names()}") from None

    @model_validator(mode="after")
    def _params_fit_dataset(self):
        self.params = check_params(self.name, self.params, "dataset.params")
        return self


class ModelConfig(_Section):
    name: Literal[tuple(sorted(MODELS))]
    hidden: int = Field(256, gt=0, le=MAX_WIDTH)  # the most columns CBSR indexes
    layers: int = Field(2, gt=0)
    dropout: float = Field(0.5, ge=0, lt=1)
    input_dropout: float = Field(0.0, ge=0, lt=1,
                                 description="dropout on the input features (training only)")
    nonlinearity: Literal["maxk", "relu"] = "maxk"
    k: int = Field(32, gt=0)

    @model_validator(mode="after")
    def _k_fits_hidden(self):
        if self.nonlinearity == "maxk" and self.k > self.hidden:
            default = "" if "k" in self.model_fields_set else " (the default)"
            raise ValueError(f"config key 'model.k' = {self.k}{default} exceeds model.hidden "
                             f"= {self.hidden} (MaxK keeps k of the hidden entries)")
        return self


class TrainConfig(_Section):
    epochs: int = Field(200, gt=0)
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    seeds: Annotated[Union[int, list[int]], AfterValidator(_seed_list)] = Field(
        default_factory=lambda: [0], description="a count N (seeds 0..N-1) or a list")
    eval_every: int = Field(1, gt=0)
    log_every: int = Field(1, gt=0)
    checkpoint_every: int = Field(50, ge=0)
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        "tf32", description="fp32: full fp32 matmuls; tf32: TF32 matmuls on fp32 data (the "
                            "paper's setting); bf16: torch.autocast with bfloat16 (MaxK "
                            "values in bf16, aggregation accumulated in fp32)")
    sparse_features: bool = Field(False, description="feed the input features to lin_in as "
                                                     "a sparse matrix (same result; much "
                                                     "faster for bag-of-words features)")
    cuda_graph: bool = Field(True, description="full-graph training on a GPU: replay each "
                                               "step's forward and backward from a CUDA "
                                               "graph captured at the second step (same "
                                               "result; the graph keeps the step's memory "
                                               "reserved between steps)")


class SamplingConfig(_Section):
    fanouts: Annotated[list[int], AfterValidator(_fanouts_ok)] = Field(
        default_factory=lambda: [15, 10, 5],
        description="neighbours sampled per layer, input layer first (-1: all)")
    batch_size: int = Field(1024, gt=0, description="seed nodes per mini-batch")
    sampler: Literal["device", "dgl"] = Field(
        "device", description="device: dgl_maxk's sampler, on the training device, ahead of "
                              "the step; dgl: DGL's NeighborSampler on the CPU")
    prefetch: Optional[int] = Field(
        None, ge=0, description="threads of the device sampler, each preparing a batch ahead "
                          "at the same time; 0: the training thread, on a GPU a batch ahead "
                          "(default: 2 for features in host memory on a GPU, else 0)")
    cuda_graph: Union[Literal["auto"], bool] = Field(
        "auto", description="on a GPU with the device sampler: replay each full batch's "
                            "forward and backward from a CUDA graph, over blocks padded to "
                            "fixed sizes (other dropout draws than unpadded steps; the "
                            "gradients are averaged by the step, not by DDP). auto: in one "
                            "process, where it was measured 1.3-1.9x the eager steps' "
                            "throughput, MaxK and ReLU (docs/performance.md)")
    features: Literal["device", "host"] = Field(
        "device", description="where the input features stay: device (its memory) or host "
                              "(pinned host memory, for features larger than the GPU's "
                              "memory: the device sampler's loader gathers each batch's rows "
                              "on the CPU and a copy engine carries them over; with sampler "
                              "dgl the GPU reads them)")
    inference: Literal["auto", "graph", "layerwise"] = Field(
        "auto", description="evaluation: graph (one forward over the whole graph), "
                            "layerwise (a layer at a time over batches of nodes with all "
                            "their in-neighbours: graphs whose activations do not fit in "
                            "memory), auto (layerwise for datasets whose graph is built on "
                            "the device, graph otherwise)")


class ExperimentConfig(_Section):
    # the run directory is <out>/<name>-<time>: a name stays one path component
    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="run name: letters, digits, '.', '-', '_' (default: the "
                                  "config file's stem)")
    description: Optional[str] = None
    mode: Literal["full", "minibatch"] = "full"
    dataset: DatasetConfig
    model: ModelConfig
    train: TrainConfig
    sampling: SamplingConfig
    variants: Optional[dict[str, Any]] = Field(
        None, description="variant name -> {dotted key: value} overrides")

    @model_validator(mode="before")
    @classmethod
    def _sections_default_to_empty(cls, data):
        if not isinstance(data, dict):
            return data
        return {**data, **{name: {} for name in _SECTIONS if data.get(name) is None}}

    @model_validator(mode="after")
    def _minibatch_fits(self):
        if self.mode != "minibatch":
            return self
        if len(self.sampling.fanouts) != self.model.layers:
            default = "" if "fanouts" in self.sampling.model_fields_set else " (the default)"
            raise ValueError(f"config key 'sampling.fanouts' needs one fan-out per layer "
                             f"(model.layers = {self.model.layers}), got "
                             f"{self.sampling.fanouts}{default}")
        if self.train.sparse_features:
            raise ValueError("config key 'train.sparse_features' is for full-graph training; "
                             "mode 'minibatch' gathers dense feature rows per batch")
        return self

    @model_validator(mode="after")
    def _device_graph_fits(self):
        if DATASETS[self.dataset.name].on_device and (
                self.mode != "minibatch" or self.sampling.sampler != "device"
                or self.sampling.inference == "graph"):
            raise ValueError(f"dataset '{self.dataset.name}' has its graph built on the device "
                             "(too large for a DGL graph): it needs mode: minibatch, "
                             "sampling.sampler: device and sampling.inference: layerwise or "
                             "auto")
        return self


def _is_section(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


#: section name -> its model
_SECTIONS = {name: field.annotation for name, field in ExperimentConfig.model_fields.items()
             if _is_section(field.annotation)}


# --------------------------------------------------------------------------- error messages

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               dict: "a mapping", list: "a list", list[int]: "a list of integers"}
_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _type_name(annotation) -> str:
    if _is_section(annotation):
        return "a mapping"
    if get_origin(annotation) is Union:
        return " or ".join(_type_name(a) for a in get_args(annotation) if a is not type(None))
    return _TYPE_NAMES.get(annotation) or _TYPE_NAMES.get(get_origin(annotation),
                                                          str(annotation))


def _choices(annotation) -> list:
    """The values a Literal field takes (a union with bool: true and false too)."""
    if get_origin(annotation) is Union:
        return [c for a in get_args(annotation) for c in _choices(a)]
    return [True, False] if annotation is bool else list(get_args(annotation))


def _yaml_text(value) -> str:
    """A choice as a config file writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _bounds_text(field) -> str:
    bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata
              for attr, symbol in _BOUNDS.items() if hasattr(m, attr)]
    return "must be " + " and ".join(bounds)


def _locate(loc):
    """(dotted key, model holding it, its field or None if unknown) for a pydantic error
    location; locations inside a leaf (a list index, a union member) end at the leaf."""
    model, parts, field = ExperimentConfig, [], None
    for part in loc:
        parts.append(str(part))
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not _is_section(field.annotation):
            break
        model = field.annotation
    return ".".join(parts), model, field


def _value_at(cfg, key: str):
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def _unknown_key(error: dict) -> bool:
    return error["type"] in ("extra_forbidden", "invalid_key")


def _nearest_key(name: str, model, value):
    """The known key of ``model`` nearest to the unknown ``name``, among those taking a mapping
    where ``value`` is one (``modle: {...}`` is 'model', not 'mode'); None if none is near."""
    known = model.model_fields
    alike = [k for k, f in known.items()
             if ("a mapping" in _type_name(f.annotation)) == isinstance(value, dict)]
    near = difflib.get_close_matches(name, alike, n=1) or difflib.get_close_matches(name, known,
                                                                                     n=1)
    return near[0] if near else None


def _config_error(err: ValidationError, cfg: dict) -> ConfigError:
    """pydantic's first error as one line naming the dotted key; an unknown key comes first,
    being most often a misspelt one whose absence the other errors only echo ('modle:'
    leaves 'model.name' missing)."""
    errors = err.errors()
    first = next(filter(_unknown_key, errors), errors[0])
    key, model, field = _locate(first["loc"])
    kind, value = first["type"], _value_at(cfg, key)
    if field is None and _unknown_key(first):
        section, _, name = key.rpartition(".")
        near = _nearest_key(name, model, value)
        where = f"known keys in '{section}'" if section else "known top-level keys"
        hint = f"did you mean '{near}'? " if near else ""
        return ConfigError(f"unknown config key '{key}' ({hint}{where}: "
                           f"{list(model.model_fields)})")
    if kind == "missing":
        return ConfigError(f"config key '{key}' is required")
    if "[key]" in first["loc"]:  # a mapping key of the wrong type
        return ConfigError(f"config key '{key}' must have names as keys, got "
                           f"{first['input']!r}")
    if kind in ("value_error", "assertion_error"):
        problem = str(first["ctx"]["error"])
        if field is None or _is_section(field.annotation):  # a rule across keys
            return ConfigError(problem)
        return ConfigError(f"config key '{key}' {problem}, got {value!r}")
    if kind == "literal_error":
        choices = ", ".join(_yaml_text(c) for c in _choices(field.annotation))
        return ConfigError(f"config key '{key}' must be one of [{choices}], got {value!r}")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return ConfigError(f"config key '{key}' {_bounds_text(field)}, got {value!r}")
    if kind == "finite_number":
        return ConfigError(f"config key '{key}' must be finite, got {value!r}")
    if kind == "string_pattern_mismatch":
        return ConfigError(f"config key '{key}' must be letters, digits, '.', '-' or '_' "
                           f"(one path component), got {value!r}")
    expected = _type_name(field.annotation) if field is not None else "a mapping"
    return ConfigError(f"config key '{key}' must be {expected}, got {value!r} "
                       f"({type(value).__name__})")


# --------------------------------------------------------------------------- overrides


def _short_keys() -> dict:
    """short key -> the dotted keys of every section that has it"""
    out = {}
    for section, model in _SECTIONS.items():
        for key in model.model_fields:
            out.setdefault(key, []).append(f"{section}.{key}")
    return out


def _unknown_short_key(key: str) -> ConfigError:
    """The error for a short key that names no config key: where a dataset parameter of that
    name goes, else the short keys nearest to it (a typo's), else all of them."""
    takers = sorted(name for name, spec in DATASETS.items() if key in spec.params)
    if takers:
        return ConfigError(f"unknown config key '{key}' (a parameter of the dataset"
                           f"{'s' if len(takers) > 1 else ''} {', '.join(takers)}: "
                           f"dataset.params.{key})")
    known = sorted(set(_short_keys()) | set(ExperimentConfig.model_fields) - set(_SECTIONS))
    near = difflib.get_close_matches(key, known, n=3)
    hint = (f"did you mean {' or '.join(repr(k) for k in near)}?" if near
            else f"short keys: {', '.join(known)}; or a dotted key such as model.k")
    return ConfigError(f"unknown config key '{key}' ({hint})")


def _did_you_mean(name: str, known) -> str:
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean '{near[0]}'? " if near else ""


def resolve_key(key: str) -> str:
    """A dotted key, or a short one ('k', 'hidden', 'lr') when it names one key only."""
    parts = key.split(".")
    if len(parts) == 1:
        if key in ExperimentConfig.model_fields:
            return key
        matches = _short_keys().get(key, [])
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ConfigError(f"config key '{key}' is ambiguous: use one of {matches}")
        raise _unknown_short_key(key)
    section = parts[0]
    if section not in _SECTIONS:
        raise ConfigError(f"unknown config key '{key}' ({_did_you_mean(section, _SECTIONS)}"
                          f"no section '{section}'; sections: {list(_SECTIONS)})")
    known = _SECTIONS[section].model_fields
    if parts[1] not in known:
        raise ConfigError(f"unknown config key '{key}' ({_did_you_mean(parts[1], known)}"
                          f"known keys in '{section}': {list(known)})")
    if len(parts) > 2 and parts[:2] != ["dataset", "params"]:
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
        value = yaml.load(raw, _Loader) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override of '{key}': cannot parse {raw!r}: "
                          f"{_yaml_problem(err)}") from None
    if _EXPONENT_FLOAT.fullmatch(raw.strip()) and _holds_text(key):
        value = raw.strip()  # name=1e3 is a name
    return key, value


#: floats with an exponent, unquoted: YAML 1.1 (PyYAML) reads '1e-3', '1e3', '-2E+5' as
#: strings, YAML 1.2 and every user as numbers
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading unquoted exponent floats as numbers and refusing a key
    written twice in one mapping, where PyYAML keeps the last one silently (config files and
    overrides alike)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._checked = set()

    def flatten_mapping(self, node):
        # each mapping as written, once: PyYAML expands its merge keys ('<<', which may
        # repeat what they merge) into the node itself, and an alias builds it again
        if id(node) not in self._checked:
            self._checked.add(id(node))
            _refuse_repeated_keys(self, node)
        super().flatten_mapping(node)


def _refuse_repeated_keys(loader, node):
    seen = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = (key_node.tag, loader.construct_object(key_node))  # 1 and true differ
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key '{key[1]}' is given twice in one mapping (the first "
                "would be ignored)", key_node.start_mark)
        seen.add(key)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT,
                              list("-+0123456789."))


def _holds_text(key: str) -> bool:
    """Whether config key ``key`` is a string (name, description, dataset.name/root)."""
    *sections, leaf = resolve_key(key).split(".")
    if len(sections) > 1:  # dataset.params.<key>: numbers and booleans
        return False
    model = _SECTIONS[sections[0]] if sections else ExperimentConfig
    annotation = model.model_fields[leaf].annotation
    return str in (annotation, *get_args(annotation))


def apply_overrides(cfg: dict, overrides) -> dict:
    """A copy of ``cfg`` with ``overrides`` (['k=16', ...] or {'model.k': 16}) applied."""
    cfg = copy.deepcopy(cfg)
    for key, value in _assignments(overrides):
        _set(cfg, key, value)
    return cfg


def _assignments(overrides):
    """(key, value) pairs of ['k=16', ...] or {'model.k': 16}."""
    return overrides.items() if isinstance(overrides, dict) else map(parse_assignment,
                                                                      overrides or [])


# --------------------------------------------------------------------------- configs


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in one line (PyYAML's own message spans several, with a source excerpt)."""
    mark = getattr(err, "problem_mark", None)
    if mark is None:
        return " ".join(str(err).split())
    return f"{err.problem} at line {mark.line + 1}, column {mark.column + 1}"


def _read_yaml(path: Path) -> dict:
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; give a YAML file in it")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from None
    except UnicodeDecodeError:
        text = "\0"
    if "\0" in text:
        raise ConfigError(f"config file {path} is not a text file (binary, or not UTF-8); "
                          "give a YAML config")
    try:
        cfg = yaml.load(text, _Loader)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(err)}") \
            from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return cfg


def load_config(path, overrides=None) -> dict:
    """Read a YAML config, apply overrides and validate it (see :func:`validate_config`).
    An override that every variant of the config sets again is refused where the config
    is valid without it: it would change nothing."""
    path = Path(path)
    raw = _read_yaml(path)
    cfg = _with_overrides(raw, overrides, path)
    assignments = list(_assignments(overrides))
    variants = cfg.get("variants") or {}
    for key, _ in assignments:
        full = resolve_key(key)
        setters = [name for name, changes in variants.items()
                   if any(resolve_key(k) == full for k in changes or {})]
        if variants and len(setters) == len(variants) and _valid(
                raw, [(k, v) for k, v in assignments if resolve_key(k) != full], path):
            raise ConfigError(f"--set {key} changes nothing: every variant of this config "
                              f"sets '{full}' itself ({', '.join(setters)}); to train one "
                              f"setting, add --set variants=null")
    return cfg


def _with_overrides(raw: dict, overrides, path: Path) -> dict:
    cfg = apply_overrides(raw, overrides)
    if not cfg.get("name"):
        cfg["name"] = path.stem
    return validate_config(cfg)


def _valid(raw: dict, assignments, path: Path) -> bool:
    try:
        _with_overrides(raw, dict(assignments), path)
    except ConfigError:
        return False
    return True


def _validate_single(cfg: dict) -> dict:
    if not isinstance(cfg, dict):
        raise ConfigError("a config must be a mapping")
    try:
        return ExperimentConfig.model_validate(cfg).model_dump()
    except ValidationError as err:
        raise _config_error(err, cfg) from None


def _checked_variants(cfg: dict) -> dict:
    """The variants of a validated config, each checked on top of it, keys made dotted."""
    variants, base = cfg["variants"], _without_variants(cfg)
    if not variants:
        raise ConfigError("config key 'variants' must be a non-empty mapping of variant "
                          "name -> {key: value} overrides")
    checked = {}
    for name, overrides in variants.items():
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"config key 'variants': name {name!r} must be letters, "
                              "digits, '-' or '_'")
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise ConfigError(f"config key 'variants.{name}' must be a mapping of overrides")
        try:
            checked[name] = {resolve_key(k): v for k, v in overrides.items()}
            _validate_single(apply_overrides(base, overrides))
        except ConfigError as err:
            raise ConfigError(f"variant '{name}': {err}") from None
        for key in checked[name]:
            if key in ("variants", "name", "train.seeds"):
                raise ConfigError(f"config key 'variants.{name}.{key}' cannot be set "
                                  "per variant")
    return checked


def validate_config(cfg: dict) -> dict:
    """The config with defaults filled in; raises :class:`ConfigError` naming the key for
    unknown keys, wrong types, values out of range, unknown datasets or models, k > hidden,
    unsupported modes. Every variant is validated too."""
    out = _validate_single(cfg)
    if out["variants"] is not None:
        out["variants"] = _checked_variants(out)
    return out


def expand_variants(cfg: dict) -> dict:
    """{variant name: full config} -- one entry named after the nonlinearity (and k) when the
    config has no variants."""
    base = _without_variants(cfg)
    if not cfg.get("variants"):
        return {_default_variant_name(base): base}
    return {name: _without_variants(_validate_single(apply_overrides(base, overrides)))
            for name, overrides in cfg["variants"].items()}


def _without_variants(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "variants"}


def _default_variant_name(cfg):
    m = cfg["model"]
    return f"maxk{m['k']}" if m["nonlinearity"] == "maxk" else "relu"
