"""dgl_maxk.training: metrics, the training step, full-graph training, checkpoints, resume,
precision, and the hard edges of a run (corrupt files, signals, budgets)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dgl_maxk  # noqa: F401  (imports DGL through the package's compatibility fix)
from dgl_maxk import data as D
from dgl_maxk import training as T
from dgl_maxk.training import checkpoint as C
from dgl_maxk.training import runner, step

REPO = Path(__file__).resolve().parents[1]


def small_config(**overrides):
    cfg = {"name": "t", "dataset": {"name": "planted",
                                    "params": {"num_nodes": 300, "num_features": 12}},
           "model": {"name": "sage", "hidden": 16, "layers": 2, "k": 4, "dropout": 0.5,
                     "input_dropout": 0.2},
           "train": {"epochs": 6, "lr": 0.01, "seeds": [0], "checkpoint_every": 2}}
    return T.validate_config(T.apply_overrides(cfg, overrides))


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
    return T.run_seed(cfg, ds, 0, "cpu", tmp, budget=budget, progress=False)


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
    assert _run(cfg, planted, tmp_path / "b", budget=runner.Budget(epochs=3)) is None
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
    C.save_checkpoint(path, {"x": 1})

    def boom(obj, f):
        f.write(b"partial")
        raise RuntimeError("disk full")
    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(RuntimeError):
        C.save_checkpoint(path, {"x": 2})
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
    y = step.drop_input(x, 0.5)
    assert torch.equal(y.indices(), x.indices())
    kept = y.values() != 0
    assert 0.3 < kept.float().mean() < 0.7
    assert torch.allclose(y.values()[kept], 2 * x.values()[kept])
