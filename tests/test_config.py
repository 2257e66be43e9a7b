"""dgl_maxk.training.config: the pydantic config models, their error messages, the dotted and
short overrides, config files and variants."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

import dgl_maxk  # noqa: F401  (imports DGL through the package's compatibility fix)
from dgl_maxk.training import config as C
from dgl_maxk.training.config import ConfigError
from conftest import small_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("overrides, key", [
    ({"model.hiden": 3}, "model.hiden"),
    ({"modle.k": 3}, "modle.k"),
    ({"train.lr": "fast"}, "train.lr"),
    ({"train.lr": float("inf")}, "train.lr"),
    ({"train.epochs": 2.5}, "train.epochs"),
    ({"train.epochs": 0}, "train.epochs"),
    ({"model.layers": True}, "model.layers"),
    ({"model.dropout": 1.5}, "model.dropout"),
    ({"model.name": "gat"}, "model.name"),
    ({"model.nonlinearity": "gelu"}, "model.nonlinearity"),
    ({"model": 3}, "model"),
    ({"dataset.name": "mnist"}, "dataset.name"),
    ({"dataset.params.nodes": 3}, "dataset.params.nodes"),
    ({"dataset.params.num_nodes": "many"}, "dataset.params.num_nodes"),
    ({"train.seeds": [0, 0]}, "train.seeds"),
    ({"train.seeds": [0, 1.5]}, "train.seeds"),
    ({"train.schedule": "step"}, "train.schedule"),
    ({"train.precision": "fp16"}, "train.precision"),
])
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'") as err:
        small_config(**overrides)
    # one line, in our words: not pydantic's multi-line dump
    assert "\n" not in str(err.value) and "validation error" not in str(err.value)


def test_messages_say_what_is_wrong():
    value = random.randint(2, 9) + 0.5
    with pytest.raises(ConfigError, match=rf"'train\.epochs' must be an integer, got {value}"):
        small_config(**{"train.epochs": value})
    with pytest.raises(ConfigError, match=r"'model\.dropout' must be >= 0 and < 1, got 1\.5"):
        small_config(**{"model.dropout": 1.5})
    with pytest.raises(ConfigError, match=r"'train\.lr' must be > 0, got -1"):
        small_config(**{"train.lr": -1})
    with pytest.raises(ConfigError, match=r"'model\.name' must be one of \['gcn', 'gin', "
                                          r"'sage'\], got 'gat'"):
        small_config(**{"model.name": "gat"})
    with pytest.raises(ConfigError, match=r"'model\.hiden' \(did you mean 'hidden'\? known "
                                          r"keys in 'model': .*'hidden'"):
        small_config(**{"model.hiden": 3})
    with pytest.raises(ConfigError, match=r"'train\.seeds' must not repeat a seed"):
        small_config(**{"train.seeds": [1, 1]})
    with pytest.raises(ConfigError, match=r"'dataset\.name' must be one of .*'planted'"):
        small_config(**{"dataset.name": "mnist"})


def test_types_are_not_converted_silently():
    for key, value in (("model.hidden", "16"), ("model.hidden", 16.0), ("train.lr", True),
                       ("dataset.self_loops", 1), ("model.nonlinearity", None)):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            small_config(**{key: value})
    # a number may be written as an integer
    lr = random.randint(1, 5)
    assert small_config(**{"train.lr": lr})["train"]["lr"] == float(lr)


def test_mapping_keys_must_be_names():
    key = random.randint(0, 9)
    with pytest.raises(ConfigError, match=rf"'dataset\.params' must have names as keys, "
                                          rf"got {key}$"):
        small_config(**{"dataset.params": {key: 1}})
    with pytest.raises(ConfigError, match=rf"'variants' must have names as keys, got {key}$"):
        small_config(variants={key: {"k": 2}})


def test_k_larger_than_hidden_is_rejected():
    with pytest.raises(ConfigError, match=r"'model\.k' = 32 exceeds model\.hidden = 16"):
        small_config(**{"model.k": 32})
    cfg = {"name": "t", "dataset": {"name": "planted"}, "model": {"name": "sage", "hidden": 16}}
    with pytest.raises(ConfigError, match=r"'model\.k' = 32 \(the default\) exceeds"):
        C.validate_config(cfg)  # a k the user never wrote says so
    # ReLU ignores k
    assert small_config(**{"model.k": 32, "model.nonlinearity": "relu"})["model"]["k"] == 32


def test_modes():
    assert small_config()["mode"] == "full"
    assert small_config(mode="minibatch", sampling={"fanouts": [5, 5]})["mode"] == "minibatch"
    with pytest.raises(ConfigError, match=r"got \[15, 10, 5\] \(the default\)"):
        small_config(mode="minibatch")  # 2 layers against fan-outs the user never wrote
    with pytest.raises(ConfigError, match=r"got \[5, 5, 5\]$"):
        small_config(mode="minibatch", sampling={"fanouts": [5, 5, 5]})
    with pytest.raises(ConfigError, match="'mode'.*'full', 'minibatch'"):
        small_config(mode="streaming")


def test_unknown_top_level_key_and_missing_required():
    with pytest.raises(ConfigError, match="'epochs'"):
        C.validate_config({"dataset": {"name": "planted"}, "model": {"name": "sage"},
                           "epochs": 3})
    with pytest.raises(ConfigError, match=r"'model\.name' is required"):
        C.validate_config({"dataset": {"name": "planted"}})
    with pytest.raises(ConfigError, match=r"'dataset\.name' is required"):
        C.validate_config({"model": {"name": "sage"}})


@pytest.mark.parametrize("text, named, nearest", [
    ("dataset: {name: planted}\nmodle:\n  name: sage\n", "modle", "model"),
    ("dataset: {name: planted}\nmodel: {name: sage}\nmodle: full\n", "modle", "mode"),
    ("dataset: {name: planted}\nmodel: {nmae: sage}\n", "model.nmae", "name"),
], ids=["section", "top-level key", "key of a section"])
def test_a_misspelt_key_is_named_before_the_key_it_leaves_missing(text, named, nearest,
                                                                    tmp_path):
    """A misspelt section leaves the real one empty: the misspelling is the error to report
    (with the known key nearest to it, of the same kind), not the required key it lacks."""
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"unknown config key '{named}' \(did you mean "
                                          rf"'{nearest}'\?") as err:
        C.load_config(path)
    assert "required" not in str(err.value)


def test_defaults_fill_the_plain_dict():
    cfg = C.validate_config({"dataset": {"name": "planted"}, "model": {"name": "gcn"}})
    assert type(cfg) is dict and type(cfg["train"]) is dict
    assert list(cfg) == ["name", "description", "mode", "dataset", "model", "train",
                         "sampling", "variants"]
    assert cfg["model"] == {"name": "gcn", "hidden": 256, "layers": 2, "dropout": 0.5,
                            "input_dropout": 0.0, "nonlinearity": "maxk", "k": 32}
    assert cfg["train"]["seeds"] == [0] and cfg["sampling"]["fanouts"] == [15, 10, 5]
    # defaults are not shared between configs
    cfg["train"]["seeds"].append(5)
    cfg["sampling"]["fanouts"].append(5)
    fresh = C.validate_config({"dataset": {"name": "planted"}, "model": {"name": "gcn"}})
    assert fresh["train"]["seeds"] == [0] and fresh["sampling"]["fanouts"] == [15, 10, 5]


def test_precision_key():
    assert small_config()["train"]["precision"] == "tf32"  # the paper's setting
    for precision in ("fp32", "tf32", "bf16"):
        cfg = small_config(**{"train.precision": precision})
        assert cfg["train"]["precision"] == precision
    cfg = C.validate_config(C.apply_overrides(small_config(), ["precision=bf16"]))
    assert cfg["train"]["precision"] == "bf16"
    with pytest.raises(ConfigError, match=r"'train\.precision' must be one of "
                                          r"\['fp32', 'tf32', 'bf16'\], got 'fp16'"):
        small_config(**{"train.precision": "fp16"})


def test_variant_errors_name_variant_and_key():
    with pytest.raises(ConfigError, match=r"variant 'big'.*'model\.k'"):
        small_config(variants={"big": {"model.k": 64}})
    with pytest.raises(ConfigError, match=r"variant 'x'.*unknown config key 'model\.kk'"):
        small_config(variants={"x": {"model.kk": 4}})
    with pytest.raises(ConfigError, match=r"'variants\.x\.train\.seeds' cannot be set"):
        small_config(variants={"x": {"seeds": [1]}})
    with pytest.raises(ConfigError, match=r"'variants': name 'a b'"):
        small_config(variants={"a b": {"k": 2}})
    with pytest.raises(ConfigError, match=r"'variants' must be a non-empty mapping"):
        small_config(variants={})


def test_variants_expand_with_dotted_keys():
    k = random.randint(1, 16)
    cfg = small_config(variants={"a": {"k": k}, "b": {"model.nonlinearity": "relu"}})
    assert cfg["variants"] == {"a": {"model.k": k}, "b": {"model.nonlinearity": "relu"}}
    expanded = C.expand_variants(cfg)
    assert list(expanded) == ["a", "b"]
    assert expanded["a"]["model"]["k"] == k and "variants" not in expanded["a"]
    assert expanded["b"]["model"]["nonlinearity"] == "relu"
    assert list(C.expand_variants(small_config())) == ["maxk4"]


def test_overrides_short_and_dotted_keys():
    cfg = C.apply_overrides(small_config(), ["k=8", "model.layers=3", "lr=1e-3",
                                             "dataset.params.seed=4", "seeds=[1, 2]"])
    cfg = C.validate_config(cfg)
    assert cfg["model"]["k"] == 8 and cfg["model"]["layers"] == 3
    assert cfg["train"]["lr"] == pytest.approx(1e-3)
    assert cfg["dataset"]["params"]["seed"] == 4 and cfg["train"]["seeds"] == [1, 2]
    with pytest.raises(ConfigError, match=r"unknown config key 'hiden' \(did you mean 'hidden'"):
        C.apply_overrides(cfg, ["hiden=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'mean_degree' \(a parameter of "
                                          r"the datasets planted, powerlaw: dataset\.params\."
                                          r"mean_degree\)"):
        C.apply_overrides(cfg, ["mean_degree=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'zzzz' \(short keys: .*\bk\b.*"
                                          r"or a dotted key"):
        C.apply_overrides(cfg, ["zzzz=3"])
    with pytest.raises(ConfigError, match="key=value"):
        C.apply_overrides(cfg, ["k16"])
    with pytest.raises(ConfigError, match="did you mean 'train'. no section 'trian'"):
        C.apply_overrides(cfg, ["trian.lr=3"])
    with pytest.raises(ConfigError, match=r"\(did you mean 'lr'. known keys in 'train'"):
        C.apply_overrides(cfg, ["train.lrr=3"])
    with pytest.raises(ConfigError, match=r"\(no section 'zzzz'"):  # nothing near: no guess
        C.apply_overrides(cfg, ["zzzz.lr=3"])
    with pytest.raises(ConfigError, match=r"'model\.k\.x'"):
        C.apply_overrides(cfg, ["model.k.x=3"])
    with pytest.raises(ConfigError, match=r"'model' must be a mapping"):
        C.apply_overrides({"model": 3}, ["k=3"])


def test_resolve_key_and_parse_assignment():
    assert C.resolve_key("hidden") == "model.hidden"
    assert C.resolve_key("batch_size") == "sampling.batch_size"
    assert C.resolve_key("precision") == "train.precision"
    assert C.resolve_key("mode") == "mode" and C.resolve_key("name") == "name"
    assert C.resolve_key("dataset.params.p_in") == "dataset.params.p_in"
    n = random.randint(0, 100)
    assert C.parse_assignment(f"k={n}") == ("k", n)
    assert C.parse_assignment("lr=1e-3") == ("lr", 1e-3)
    assert C.parse_assignment("sparse_features=true") == ("sparse_features", True)
    assert C.parse_assignment(f"seeds=[{n}, {n + 1}]") == ("seeds", [n, n + 1])
    with pytest.raises(ConfigError, match=r"override of 'seeds': cannot parse") as err:
        C.parse_assignment("seeds=[0, 1")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, value", [
    ("lr=1e-3", 1e-3), ("lr=1e3", 1e3), ("weight_decay=-2E+5", -2e5), ("dropout=.5e-1", 0.05),
    ("dataset.params.p_in=1e-3", 1e-3),
    ("lr='1e3'", "1e3"), ('lr="1e-3"', "1e-3"),  # quoted: a string
    ("name=1e3", "1e3"), ("description=1e-3", "1e-3"), ("dataset.root=2e5", "2e5"),
    ("name=nan", "nan"), ("name=infinity", "infinity"),
])
def test_exponent_floats_convert_only_for_non_string_keys(text, value):
    _, parsed = C.parse_assignment(text)
    assert parsed == value and type(parsed) is type(value)


def test_exponent_floats_in_config_files_are_numbers(tmp_path):
    lr, decay = random.choice([1e-3, 5e-4, 2e-2]), random.choice([1e-5, 3e-6])
    text = (CONFIGS / "quickstart.yaml").read_text()
    assert "lr: 0.01\n" in text
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("lr: 0.01\n", f"lr: {lr:.0e}\n  weight_decay: {decay:.0e}\n"))
    train = C.load_config(path)["train"]
    assert (train["lr"], train["weight_decay"]) == (lr, decay)


def test_numeric_looking_run_name_survives_validation():
    cfg = C.validate_config(C.apply_overrides(small_config(), ["name=1e3",
                                                               "description=1e-3"]))
    assert cfg["name"] == "1e3" and cfg["description"] == "1e-3"


def test_seed_count_expands():
    n = random.randint(1, 6)
    assert small_config(**{"train.seeds": n})["train"]["seeds"] == list(range(n))
    with pytest.raises(ConfigError, match=r"'train\.seeds' must be a positive count"):
        small_config(**{"train.seeds": 0})


@pytest.mark.parametrize("seeds, problem", [
    ([C.MAX_SEED + 1], "from 0 to 4294967295"), ([0, 10**20], "from 0 to 4294967295"),
    (C.MAX_SEEDS + 1, "count of at most"), (2**32, "count of at most"),
    (10**20, "count of at most"), (list(range(C.MAX_SEEDS + 1)), "at most"),
])
def test_seeds_are_bounded_by_what_a_run_can_seed_and_hold(seeds, problem):
    with pytest.raises(ConfigError, match=rf"'train\.seeds' .*{problem}"):
        small_config(**{"train.seeds": seeds})
    seed = random.randint(0, C.MAX_SEED - 1)
    assert small_config(**{"train.seeds": [seed, C.MAX_SEED]})["train"]["seeds"] == [
        seed, C.MAX_SEED]
    assert len(small_config(**{"train.seeds": C.MAX_SEEDS})["train"]["seeds"]) == C.MAX_SEEDS


def test_minibatch_config_validation():
    base = CONFIGS / "quickstart_minibatch.yaml"
    assert C.load_config(base)["mode"] == "minibatch"
    with pytest.raises(ConfigError, match="sampling.fanouts"):
        C.load_config(base, ["sampling.fanouts=[5]"])
    with pytest.raises(ConfigError, match="sampling.fanouts"):
        C.load_config(base, ["sampling.fanouts=[5,0]"])
    with pytest.raises(ConfigError, match="sampling.batch_size"):
        C.load_config(base, ["sampling.batch_size=0"])
    with pytest.raises(ConfigError, match="train.sparse_features"):
        C.load_config(base, ["train.sparse_features=true"])
    with pytest.raises(ConfigError, match="sampling.nope"):
        C.load_config(base, ["sampling.nope=1"])


# --------------------------------------------------------------------------- config files


def test_config_file_problems_are_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        C.load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=f"{tmp_path} is a directory"):
        C.load_config(tmp_path)
    binary = tmp_path / "model.pt"
    binary.write_bytes(bytes([0, 1, 2, 3]) + random.randbytes(64))
    with pytest.raises(ConfigError, match="model.pt is not a text file"):
        C.load_config(binary)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.yaml is not a text file"):
        C.load_config(latin1)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: {name: sage\ntrain: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml is not valid YAML: .* at line") as err:
        C.load_config(broken)
    assert "\n" not in str(err.value)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        C.load_config(listing)


@pytest.mark.parametrize("text, key, line", [
    ("model: {name: sage}\ntrain: {epochs: 3}\nmodel: {name: gcn}\n", "model", 3),
    ("model: {name: sage, k: 8, k: 16}\n", "k", 1),
    ("train:\n  lr: 0.1\n  epochs: 2\n  lr: 0.01\n", "lr", 4),
])
def test_a_key_given_twice_is_refused(text, key, line, tmp_path):
    """PyYAML keeps the last of two equal keys silently: a config would train what its
    author did not read."""
    path = tmp_path / "twice.yaml"
    path.write_text("name: twice\ndataset: {name: planted}\n" + text)
    with pytest.raises(ConfigError, match=f"the key '{key}' is given twice .* at line "
                                          f"{line + 2},"):
        C.load_config(path)
    with pytest.raises(ConfigError, match="'k' is given twice"):
        C.apply_overrides({}, ["model={k: 1, k: 2}"])
    anchors = tmp_path / "anchors.yaml"  # a merge key may repeat what it merges
    anchors.write_text("name: a\ndataset: {name: planted}\nbase: &b {name: sage, k: 4}\n"
                       "model: {<<: *b, k: 8}\n"
                       # merged into a node that an alias builds again, before its anchor
                       "defaults: {inner: &i {<<: *b, k: 2}}\nlater: {<<: *i}\n"
                       "kinds: {1: a, true: b}\n")  # equal in Python, not in YAML
    loaded = C._read_yaml(anchors)
    assert loaded == yaml.safe_load(anchors.read_text())  # what PyYAML makes of merges
    assert loaded["model"] == {"name": "sage", "k": 8}


def test_config_name_defaults_to_the_file_stem(tmp_path):
    path = tmp_path / f"run{random.randint(0, 999)}.yaml"
    path.write_text("dataset: {name: planted}\nmodel: {name: sage, hidden: 8, k: 4}\n")
    assert C.load_config(path)["name"] == path.stem
    assert C.load_config(path, ["name=other"])["name"] == "other"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_validates(path):
    cfg = C.load_config(path)
    assert cfg["name"]
    for name, vcfg in C.expand_variants(cfg).items():
        m = vcfg["model"]
        assert m["nonlinearity"] == "relu" or m["k"] <= m["hidden"]


def test_paper_configs_have_paper_hyperparameters():
    expect = {  # DESIGN.md section 2: layers, hidden, dropout, lr, epochs, k
        "reddit_sage": (4, 256, 0.5, 0.01, 3000, 32), "reddit_gcn": (4, 256, 0.5, 0.01, 3000, 16),
        "flickr_sage": (3, 256, 0.2, 0.001, 400, 8), "yelp_sage": (4, 384, 0.1, 0.001, 3000, None),
        "ogbn_products_sage": (3, 256, 0.5, 0.003, 500, 32),
        "ogbn_proteins_sage": (3, 256, 0.5, 0.01, 1000, 32),
    }
    for name, (layers, hidden, dropout, lr, epochs, k) in expect.items():
        cfg = C.load_config(CONFIGS / f"{name}.yaml")
        m, t = cfg["model"], cfg["train"]
        assert (m["layers"], m["hidden"], m["dropout"], t["lr"], t["epochs"]) == \
            (layers, hidden, dropout, lr, epochs), name
        assert t["weight_decay"] == 0 and cfg["dataset"]["self_loops"], name
        if k is not None:
            assert m["k"] == k and m["nonlinearity"] == "maxk", name


@pytest.mark.parametrize("name", ["a/../../b", "../up", "", "with space"])
def test_run_name_is_one_path_component(name):
    with pytest.raises(C.ConfigError, match="config key 'name' must be letters"):
        small_config(name=name)


def test_hidden_width_is_bounded_by_cbsr():
    with pytest.raises(C.ConfigError, match=r"'model.hidden' must be > 0 and <= 32768"):
        small_config(**{"model.hidden": 40000})



def test_an_override_every_variant_sets_again_is_refused(tmp_path):
    """The variants apply after --set: an override they all set again would change nothing,
    silently."""
    path = tmp_path / "two.yaml"
    path.write_text("name: two\ndataset: {name: planted}\nmodel: {name: sage, k: 4}\n"
                    "variants:\n  a: {model.nonlinearity: maxk, k: 2}\n"
                    "  b: {nonlinearity: relu}\n")
    for key in ("model.nonlinearity", "nonlinearity"):
        with pytest.raises(ConfigError, match=rf"--set {key} changes nothing.*\(a, b\)"
                                              r".*variants=null"):
            C.load_config(path, [f"{key}=relu"])
    assert C.load_config(path, ["k=3"])["model"]["k"] == 3  # variant b keeps it
    cfg = C.load_config(path, ["variants=null", "nonlinearity=relu"])
    assert list(C.expand_variants(cfg)) == ["relu"]
    # every variant sets k, but at hidden 16 the base (k 32 by default) needs this one
    ks = tmp_path / "ks.yaml"
    ks.write_text("name: ks\ndataset: {name: planted}\nmodel: {name: sage, hidden: 64}\n"
                  "variants:\n  k8: {k: 8}\n  k16: {k: 16}\n")
    assert C.load_config(ks, ["hidden=16", "k=8"])["model"]["hidden"] == 16
    with pytest.raises(ConfigError, match="--set k changes nothing"):
        C.load_config(ks, ["k=8"])
