"""dgl_maxk.train: config validation, metrics, full-graph training, checkpoints and resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dgl_maxk  # noqa: F401  (imports DGL through the package's compatibility fix)
from dgl_maxk import data as D
from dgl_maxk import train as T

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def small_config(**overrides):
    cfg = {"name": "t", "dataset": {"name": "planted",
                                    "params": {"num_nodes": 300, "num_features": 12}},
           "model": {"name": "sage", "hidden": 16, "layers": 2, "k": 4, "dropout": 0.5,
                     "input_dropout": 0.2},
           "train": {"epochs": 6, "lr": 0.01, "seeds": [0], "checkpoint_every": 2}}
    return T.validate_config(T.apply_overrides(cfg, overrides))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("overrides, key", [
    ({"model.hiden": 3}, "model.hiden"),
    ({"modle.k": 3}, "modle.k"),
    ({"train.lr": "fast"}, "train.lr"),
    ({"train.epochs": 2.5}, "train.epochs"),
    ({"model.layers": True}, "model.layers"),
    ({"model.dropout": 1.5}, "model.dropout"),
    ({"model.name": "gat"}, "model.name"),
    ({"model.nonlinearity": "gelu"}, "model.nonlinearity"),
    ({"dataset.name": "mnist"}, "dataset.name"),
    ({"dataset.params.nodes": 3}, "dataset.params.nodes"),
    ({"dataset.params.num_nodes": "many"}, "dataset.params.num_nodes"),
    ({"train.seeds": [0, 0]}, "train.seeds"),
    ({"train.schedule": "step"}, "train.schedule"),
])
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(T.ConfigError, match=f"'{key}'"):
        small_config(**overrides)


def test_k_larger_than_hidden_is_rejected():
    with pytest.raises(T.ConfigError, match=r"'model\.k' = 32 exceeds model\.hidden = 16"):
        small_config(**{"model.k": 32})
    # ReLU ignores k
    assert small_config(**{"model.k": 32, "model.nonlinearity": "relu"})["model"]["k"] == 32


def test_modes():
    assert small_config()["mode"] == "full"
    assert small_config(mode="minibatch", sampling={"fanouts": [5, 5]})["mode"] == "minibatch"
    with pytest.raises(T.ConfigError, match="'mode'.*'full', 'minibatch'"):
        small_config(mode="streaming")


def test_unknown_top_level_key_and_missing_required():
    with pytest.raises(T.ConfigError, match="'epochs'"):
        T.validate_config({"dataset": {"name": "planted"}, "model": {"name": "sage"},
                           "epochs": 3})
    with pytest.raises(T.ConfigError, match=r"'model\.name' is required"):
        T.validate_config({"dataset": {"name": "planted"}})


def test_variant_errors_name_variant_and_key():
    with pytest.raises(T.ConfigError, match=r"variant 'big'.*'model\.k'"):
        small_config(variants={"big": {"model.k": 64}})
    with pytest.raises(T.ConfigError, match=r"unknown config key 'model\.kk'"):
        small_config(variants={"x": {"model.kk": 4}})


def test_overrides_short_and_dotted_keys():
    cfg = T.apply_overrides(small_config(), ["k=8", "model.layers=3", "lr=1e-3",
                                             "dataset.params.seed=4", "seeds=[1, 2]"])
    cfg = T.validate_config(cfg)
    assert cfg["model"]["k"] == 8 and cfg["model"]["layers"] == 3
    assert cfg["train"]["lr"] == pytest.approx(1e-3)
    assert cfg["dataset"]["params"]["seed"] == 4 and cfg["train"]["seeds"] == [1, 2]
    with pytest.raises(T.ConfigError, match="unknown config key 'kk'"):
        T.apply_overrides(cfg, ["kk=3"])
    with pytest.raises(T.ConfigError, match="key=value"):
        T.apply_overrides(cfg, ["k16"])


def test_seed_count_expands():
    assert small_config(**{"train.seeds": 3})["train"]["seeds"] == [0, 1, 2]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_validates(path):
    cfg = T.load_config(path)
    assert cfg["name"]
    for name, vcfg in T.expand_variants(cfg).items():
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
        cfg = T.load_config(CONFIGS / f"{name}.yaml")
        m, t = cfg["model"], cfg["train"]
        assert (m["layers"], m["hidden"], m["dropout"], t["lr"], t["epochs"]) == \
            (layers, hidden, dropout, lr, epochs), name
        assert t["weight_decay"] == 0 and cfg["dataset"]["self_loops"], name
        if k is not None:
            assert m["k"] == k and m["nonlinearity"] == "maxk", name


# --------------------------------------------------------------------------- metrics


def test_metrics():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 1.0], [0.0, 1.0]])
    labels = torch.tensor([0, 1, 1, 1])
    mask = torch.tensor([True, True, True, False])
    assert T.evaluate(logits, labels, mask, "accuracy") == pytest.approx(2 / 3)
    assert T.evaluate(logits, labels, mask, "accuracy", "ogbn-arxiv") == pytest.approx(2 / 3)
    ml = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    pred = torch.tensor([[2.0, -1.0], [-1.0, 1.0], [1.0, 1.0]])
    # tp = 3, fp = 1, fn = 1 -> 2*3 / (6 + 2)
    assert T.evaluate(pred, ml, torch.ones(3, dtype=torch.bool), "micro_f1") == \
        pytest.approx(0.75)
    y = torch.zeros(6, 112)
    y[:3] = 1.0  # every task has positives and negatives
    mask = torch.ones(6, dtype=torch.bool)
    good = y + 0.1 * torch.rand(6, 112)  # ranks every positive above every negative
    assert T.evaluate(good, y, mask, "rocauc", "ogbn-proteins") == pytest.approx(1.0)
    assert T.evaluate(-good, y, mask, "rocauc", "ogbn-proteins") == pytest.approx(0.0)


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def planted():
    return D.load_dataset("planted", num_nodes=300, num_features=12)


def _run(cfg, ds, tmp, budget=None):
    return T.run_seed(cfg, ds, 0, "cpu", tmp, budget=budget, progress=False,
                      log=lambda line: None)


def test_full_run_reports_test_at_best_val(planted, tmp_path):
    cfg = small_config(**{"train.epochs": 8})
    res = _run(cfg, planted, tmp_path)
    hist = res["history"]
    assert [r["epoch"] for r in hist] == list(range(1, 9))
    best = max(hist, key=lambda r: (r["val"], -r["epoch"]))
    assert res["best_epoch"] == best["epoch"]
    assert res["test_at_best_val"] == best["test"]
    assert all(0 <= r[s] <= 1 for r in hist for s in ("train", "val", "test"))
    assert (tmp_path / "result.json").exists() and (tmp_path / "checkpoint.pt").exists()


def test_training_learns(planted, tmp_path):
    cfg = small_config(**{"train.epochs": 40, "train.checkpoint_every": 0})
    res = _run(cfg, planted, tmp_path)
    assert res["history"][-1]["loss"] < 0.7 * res["history"][0]["loss"]
    assert res["best_val"] > 0.5  # 5 classes: chance is 0.2


@pytest.mark.parametrize("mode, sparse", [("full", False), ("full", True),
                                          ("minibatch", False)])
def test_bf16_precision_trains_with_bf16_maxk_values(mode, sparse, planted, tmp_path,
                                                     monkeypatch):
    from dgl_maxk import ops
    seen = []
    original = ops._MaxK.apply
    monkeypatch.setattr(ops._MaxK, "apply", lambda h, k: seen.append(h.dtype) or original(h, k))
    cfg = small_config(**{"train.epochs": 60, "train.checkpoint_every": 0,
                          "train.precision": "bf16", "mode": mode,
                          "train.sparse_features": sparse,
                          "sampling.fanouts": [5, 5], "sampling.batch_size": 16})
    res = _run(cfg, planted, tmp_path)
    assert torch.bfloat16 in seen  # autocast was in effect around MaxK
    assert res["history"][-1]["loss"] < 0.8 * res["history"][0]["loss"]
    assert res["best_val"] > 0.45  # 5 classes: chance is 0.2


@pytest.mark.parametrize("model", ["sage", "gcn", "gin"])
def test_resume_gives_the_uninterrupted_result(planted, tmp_path, model):
    cfg = small_config(**{"model.name": model, "train.schedule": "cosine"})
    straight = _run(cfg, planted, tmp_path / "a")
    final_a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)

    torch.manual_seed(12345)  # the resumed run must not depend on the caller's RNG
    assert _run(cfg, planted, tmp_path / "b", budget=T.Budget(epochs=3)) is None
    ckpt = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert ckpt["state"]["epoch"] == 3 and not ckpt["state"]["finished"]
    torch.manual_seed(999)
    resumed = _run(cfg, planted, tmp_path / "b")
    final_b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)

    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]
    for key in ("best_epoch", "best_val", "test_at_best_val", "final"):
        assert resumed[key] == straight[key]
    for name, value in final_a["model"].items():
        assert torch.equal(value, final_b["model"][name]), name
    assert final_a["optimizer"]["state"].keys() == final_b["optimizer"]["state"].keys()
    for i, s in final_a["optimizer"]["state"].items():
        assert torch.equal(s["exp_avg"], final_b["optimizer"]["state"][i]["exp_avg"])


def test_finished_run_is_not_rerun(planted, tmp_path):
    cfg = small_config()
    first = _run(cfg, planted, tmp_path)
    again = _run(cfg, planted, tmp_path)
    assert again == json.loads(json.dumps(first))


def test_checkpoint_of_other_config_is_refused(planted, tmp_path):
    _run(small_config(), planted, tmp_path)
    with pytest.raises(T.ConfigError, match="another config"):
        _run(small_config(**{"train.lr": 0.02}), planted, tmp_path)


def test_checkpoints_are_atomic(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    T.save_checkpoint(path, {"x": 1})

    def boom(obj, f):
        f.write(b"partial")
        raise RuntimeError("disk full")
    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(RuntimeError):
        T.save_checkpoint(path, {"x": 2})
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {"x": 1}


def test_experiment_writes_results(tmp_path):
    cfg = small_config(**{"train.epochs": 3, "train.seeds": [0, 1]},
                       variants={"maxk": {"model.nonlinearity": "maxk"},
                                 "relu": {"model.nonlinearity": "relu"}})
    res = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True)
    run_dir = Path(res["run_dir"])
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved["complete"] and set(saved["variants"]) == {"maxk", "relu"}
    for v in saved["variants"].values():
        assert v["test"]["n"] == 2 and v["test"]["std"] >= 0
        assert len(v["seeds"][0]["history"]) == 3
    assert saved["environment"]["torch"] == torch.__version__
    assert saved["config"]["model"]["hidden"] == 16
    assert (run_dir / "config.yaml").exists() and (run_dir / "log.txt").exists()
    log = (run_dir / "log.txt").read_text()
    assert log.count("[relu seed 1] epoch") == 3  # one line per epoch


def test_experiment_stop_and_resume(tmp_path):
    cfg = small_config(**{"train.epochs": 4, "train.seeds": [0, 1]})
    part = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True,
                            stop_after_epochs=5)
    assert not part["complete"]
    full = T.run_experiment(device="cpu", resume=part["run_dir"], progress=False, quiet=True)
    assert full["complete"]
    ref = T.run_experiment(cfg, device="cpu", out=tmp_path / "ref", progress=False,
                           quiet=True)
    (v_full,), (v_ref,) = full["variants"].values(), ref["variants"].values()
    assert [s["test_at_best_val"] for s in v_full["seeds"]] == \
        [s["test_at_best_val"] for s in v_ref["seeds"]]
    assert [s["history"][-1]["loss"] for s in v_full["seeds"]] == \
        [s["history"][-1]["loss"] for s in v_ref["seeds"]]


def test_sparse_features_compute_the_same_model(planted, tmp_path):
    dense = _run(small_config(**{"model.input_dropout": 0.0, "train.epochs": 3}), planted,
                 tmp_path / "d")
    sparse = _run(small_config(**{"model.input_dropout": 0.0, "train.epochs": 3,
                                  "train.sparse_features": True}), planted, tmp_path / "s")
    for a, b in zip(dense["history"], sparse["history"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    a = torch.load(tmp_path / "d" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "s" / "checkpoint.pt", weights_only=False)["model"]
    assert a.keys() == b.keys()  # the state dict is unchanged by the sparse input path
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-4), name


def test_sparse_input_dropout_keeps_pattern_and_scales():
    x = torch.rand(50, 30).mul(torch.rand(50, 30) < 0.2).to_sparse().coalesce()
    y = T._input_dropout(x, 0.5)
    assert torch.equal(y.indices(), x.indices())
    kept = y.values() != 0
    assert 0.3 < kept.float().mean() < 0.7
    assert torch.allclose(y.values()[kept], 2 * x.values()[kept])
