"""dgl_maxk.training: metrics, the training step, full-graph training, checkpoints, resume,
precision, and the hard edges of a run (corrupt files, signals, budgets)."""
from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest
import torch

import dgl_maxk  # noqa: F401  (imports DGL through the package's compatibility fix)
from dgl_maxk import backends
from dgl_maxk import data as D
from dgl_maxk import training as T
from dgl_maxk.training import checkpoint as C
from dgl_maxk.training import runner, step
from conftest import ReadsOnTheHost, optimizer_state, small_config

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("mode, sampler", [("full", "device"), ("minibatch", "device"),
                                           ("minibatch", "dgl")])
def test_trainer_pads_unaligned_features_and_trains_the_same(mode, sampler, tmp_path,
                                                             monkeypatch):
    """13 feature columns: the trainer's table is padded to 16 for lin_in's aligned GEMMs,
    and (without input dropout, whose mask covers the padding too) a run has the losses of
    a run on the raw features, up to the GEMMs' rounding."""
    from dgl_maxk.training import seed as seed_module
    ds = D.load_dataset("planted", num_nodes=300, num_features=13)
    cfg = small_config(**{"train.epochs": 3, "model.input_dropout": 0.0, "mode": mode,
                          "sampling.fanouts": [4, 4], "sampling.batch_size": 64,
                          "sampling.sampler": sampler})
    run = seed_module._SeedRun(cfg, ds, 0, torch.device("cpu"))
    assert run.features.shape[1] == 16 and run.model.lin_in.padded_input
    assert torch.equal(run.features[:, :13], ds.features) and not run.features[:, 13:].any()
    padded = _run(cfg, ds, tmp_path / "padded")
    monkeypatch.setattr(seed_module, "aligned_features", lambda x: x)
    raw = _run(cfg, ds, tmp_path / "raw")
    assert [r["loss"] for r in padded["history"]] == pytest.approx(
        [r["loss"] for r in raw["history"]], rel=1e-5)


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
    from dgl_maxk import library
    seen = []
    original = library.maxk_cbsr
    monkeypatch.setattr(library, "maxk_cbsr",
                        lambda h, *args: seen.append(h.dtype) or original(h, *args))
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


def test_resume_may_change_how_the_step_is_launched(planted, tmp_path):
    """train.cuda_graph decides how the step is launched, not its result: a checkpoint made
    with it on resumes with it off (and the other way round), to the same result."""
    straight = _run(small_config(), planted, tmp_path / "a")
    cfg_on = small_config(**{"train.cuda_graph": True})
    assert _run(cfg_on, planted, tmp_path / "b", budget=runner.Budget(epochs=3)) is None
    resumed = _run(small_config(**{"train.cuda_graph": False}), planted, tmp_path / "b")
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]


def test_each_process_resumes_from_its_own_random_state(caplog):
    states = [{"process": i} for i in range(3)]
    assert [C.own_rng_state(states, r, 3) for r in range(3)] == states
    assert not caplog.records
    old = {"process": "every"}  # a checkpoint from before the per-process list
    assert C.own_rng_state(old, 2, 3) is old
    with caplog.at_level("WARNING"):
        assert C.own_rng_state(states, 3, 4) == states[0]
    assert "written by 3 processes and is resumed by 4" in caplog.text


def test_finished_run_is_not_rerun(planted, tmp_path):
    cfg = small_config()
    first = _run(cfg, planted, tmp_path)
    again = _run(cfg, planted, tmp_path)
    assert again == json.loads(json.dumps(first))


def test_checkpoint_of_other_config_is_refused_naming_what_changed(planted, tmp_path):
    lr = small_config()["train"]["lr"]
    assert _run(small_config(), planted, tmp_path, budget=runner.Budget(epochs=1)) is None
    with pytest.raises(T.ConfigError, match=rf"checkpoint.pt was written for another config "
                                            rf"\(train.lr: {lr} -> 0.02\)"):
        _run(small_config(**{"train.lr": 0.02}), planted, tmp_path)


def test_a_finished_result_of_other_config_is_refused(planted, tmp_path):
    """Without its checkpoint (deleted to save space), a seed's result.json is still checked:
    a run would otherwise average results of two models."""
    _run(small_config(), planted, tmp_path)
    (tmp_path / "checkpoint.pt").unlink()
    hidden = small_config()["model"]["hidden"]
    with pytest.raises(T.ConfigError, match=rf"result.json was written for another config "
                                            rf"\(model.hidden: {hidden} -> 8\)"):
        _run(small_config(**{"model.hidden": 8}), planted, tmp_path)


def test_what_does_not_decide_a_seed_may_change_on_resume(planted, tmp_path):
    """Other seeds, logging and checkpoint intervals do not change a seed's result: a run
    may gain seeds, or log differently, when it is resumed."""
    first = _run(small_config(**{"train.epochs": 3}), planted, tmp_path)
    again = _run(small_config(**{"train.epochs": 3, "train.seeds": [0, 5],
                                 "train.log_every": 2, "train.checkpoint_every": 1}),
                 planted, tmp_path)
    assert again == json.loads(json.dumps(first))


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


def test_a_run_directory_in_use_is_not_resumed(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    cfg = small_config(**{"train.epochs": 2})
    part = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True,
                            stop_after_epochs=1)
    log = (Path(part["run_dir"]) / "log.txt").read_text()
    fd = os.open(part["run_dir"], os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a run resuming it would
        with pytest.raises(T.ConfigError, match="is in use by another dgl_maxk run"):
            T.run_experiment(device="cpu", resume=part["run_dir"], progress=False, quiet=True)
    finally:
        os.close(fd)
    assert (Path(part["run_dir"]) / "log.txt").read_text() == log
    assert T.run_experiment(device="cpu", resume=part["run_dir"], progress=False,
                            quiet=True)["complete"]


def test_a_run_directory_that_cannot_be_locked_runs_unlocked(tmp_path, monkeypatch, caplog):
    """NFS without local locks refuses flock on a directory (EBADF): the run goes on."""
    pytest.importorskip("fcntl")

    def no_flock(fd, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")
    monkeypatch.setattr(runner.fcntl, "flock", no_flock)
    with caplog.at_level("WARNING"):
        res = T.run_experiment(small_config(**{"train.epochs": 1}), device="cpu", out=tmp_path,
                               progress=False, quiet=True)
    assert res["complete"] and "cannot be locked here (Bad file descriptor)" in caplog.text


@pytest.mark.parametrize("sampler, threads", [("dgl", 2), ("dgl", 1), ("device", 2)])
def test_dgl_sampler_on_several_threads_is_said_not_to_repeat(sampler, threads, tmp_path):
    """DGL's sampler draws other neighbours from run to run on several threads: the run's
    log warns and names the way out; one thread, or dgl_maxk's sampler, is quiet."""
    cfg = small_config(**{"train.epochs": 1, "mode": "minibatch", "sampling.fanouts": [4, 4],
                          "sampling.sampler": sampler})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        res = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True)
    finally:
        torch.set_num_threads(before)
    log = (Path(res["run_dir"]) / "log.txt").read_text()
    warned = "DGL's sampler with 2 threads" in log and "--threads 1" in log
    assert warned == (sampler == "dgl" and threads > 1), log


def test_the_run_log_describes_the_dataset_in_words(tmp_path):
    cfg = small_config(**{"train.epochs": 1})
    res = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True)
    data = D.load_dataset("planted", **cfg["dataset"]["params"])
    log = (Path(res["run_dir"]) / "log.txt").read_text()
    line = next(line for line in log.splitlines() if "dataset planted:" in line)
    assert "{" not in line and f"{data.num_nodes:,} nodes, {data.graph.num_edges():,} edges" \
        in line and f"{int(data.train_mask.sum()):,} / " in line


def test_results_json_holds_each_variants_dataset_sizes_and_split(tmp_path):
    """What a paper's table needs about the data is in results.json, not only in the log."""
    cfg = small_config(**{"train.epochs": 1})
    res = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True)
    saved = json.loads((Path(res["run_dir"]) / "results.json").read_text())
    params = cfg["dataset"]["params"]
    want = D.load_dataset("planted", **params).summary()
    for variant in saved["variants"].values():
        got = variant["dataset_summary"]
        assert {key: got[key] for key in want} == json.loads(json.dumps(want))
        assert got["train"] + got["val"] + got["test"] <= got["num_nodes"] == params["num_nodes"]


def test_experiment_stop_and_resume(tmp_path):
    cfg = small_config(**{"train.epochs": 4, "train.seeds": [0, 1]})
    part = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True,
                            stop_after_epochs=5)
    assert not part["complete"]
    full = T.run_experiment(device="cpu", resume=part["run_dir"], progress=False, quiet=True)
    assert full["complete"]
    # the run's wall time covers every call (a resume that finds it finished adds its own)
    again = T.run_experiment(device="cpu", resume=part["run_dir"], progress=False, quiet=True)
    assert again["wall_seconds"] > full["wall_seconds"] > part["wall_seconds"] > 0
    # and keeps every call's environment (threads, host, versions), oldest first
    assert part["earlier_environments"] == []
    assert again["earlier_environments"] == [part["environment"], full["environment"]]
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


# --------------------------------------------------------------------------- one step


def test_one_train_step_serves_both_modes(planted, tmp_path, monkeypatch):
    from dgl_maxk.training import sampled_step, seed
    assert seed.FullGraphStep is step.FullGraphStep and seed.SampledStep is sampled_step.SampledStep
    assert sampled_step.train_step is step.train_step
    graphs, real = [], step.train_step

    def spy(model, graph, *args, **kwargs):
        graphs.append(graph)
        return real(model, graph, *args, **kwargs)
    monkeypatch.setattr(step, "train_step", spy)  # what FullGraphStep runs off the GPU
    monkeypatch.setattr(sampled_step, "train_step", spy)  # and SampledStep
    _run(small_config(**{"train.epochs": 2}), planted, tmp_path / "full")
    assert graphs == [planted.graph] * 2
    graphs.clear()
    _run(small_config(**{"train.epochs": 1, "mode": "minibatch", "sampling.fanouts": [4, 4],
                         "sampling.batch_size": 32}), planted, tmp_path / "mb")
    assert len(graphs) == -(-int(planted.train_mask.sum()) // 32)
    assert all(isinstance(g, list) and len(g) == 2 for g in graphs)  # two sampled blocks


def test_train_step_returns_the_detached_loss_and_steps(planted):
    from dgl_maxk.models import build_model
    model = build_model("sage", 12, 16, 5, 2, k=4, dropout=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = torch.randperm(planted.num_nodes)[:50]
    labels = planted.labels[rows]
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(
            model(planted.graph, planted.features)[rows], labels)
    before = [p.detach().clone() for p in model.parameters()]
    loss = step.train_step(model, planted.graph, planted.features, labels, opt, rows=rows,
                           precision="fp32")
    assert loss.dim() == 0 and not loss.requires_grad
    torch.testing.assert_close(loss, expected)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))



def test_train_step_reports_nan_after_backward_and_leaves_weights(planted, monkeypatch):
    """The NaN scans of a step are deferred to its end (one read), and a NaN in a hidden
    layer's input is raised with its position before the optimizer step."""
    from dgl_maxk.models import build_model
    from dgl_maxk.sparse import checks
    model = build_model("sage", 12, 16, 5, 2, k=4, dropout=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.lin_in.bias[7] = float("nan")  # every hidden row gets a NaN in column 7
    before = [p.detach().clone() for p in model.parameters()]
    reads, real = [], step.raise_recorded_flags
    monkeypatch.setattr(step, "raise_recorded_flags",
                        lambda pending, flags: reads.append(len(pending)) or real(pending, flags))
    monkeypatch.setattr(opt, "step", lambda: reads.append("step"))
    with pytest.raises(ValueError, match=r"NaN value\(s\), the first at index \(0, 7\)"):
        step.train_step(model, planted.graph, planted.features, planted.labels, opt,
                        precision="fp32")
    # both layers' scans, read once, at the end of the step; SGD (not fused) is never called
    assert reads == [2]
    for a, b in zip(before, model.parameters()):
        torch.testing.assert_close(b.detach(), a, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("nan", [False, True])
def test_fused_optimizer_is_queued_before_the_read_and_skips_a_nan(planted, nan):
    """A fused Adam (AMP's found_inf) steps before the scans are read: without a NaN the
    step is Adam's own, bit for bit; with one it raises and leaves the weights and Adam's
    state (moments, step counts) as they were."""
    from dgl_maxk.models import build_model

    def run(fused, plant):
        torch.manual_seed(0)
        model = build_model("sage", 12, 16, 5, 2, k=4, dropout=0.0)
        opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=fused)
        step.train_step(model, planted.graph, planted.features, planted.labels, opt,
                        precision="fp32")
        if plant:
            with torch.no_grad():
                model.lin_in.bias[7] = float("nan")
        before, state = [p.detach().clone() for p in model.parameters()], optimizer_state(opt)
        try:
            step.train_step(model, planted.graph, planted.features, planted.labels, opt,
                            precision="fp32")
        except ValueError as err:
            assert "the first at index (0, 7)" in str(err)
            return before, state, model, opt, True
        return before, state, model, opt, False

    before, state, model, opt, raised = run(True, nan)
    assert raised == nan and not hasattr(opt, "found_inf")
    if nan:
        for a, b in zip(before, model.parameters()):
            torch.testing.assert_close(b.detach(), a, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(optimizer_state(opt), state, rtol=0, atol=0)
    else:
        _, _, plain, _, _ = run(False, False)  # the same steps through Adam's other path
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        for got, want in zip(model.parameters(), plain.parameters()):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- full-graph step

needs_kernels = pytest.mark.skipif(not backends.cuda.available(),
                                   reason="no CUDA GPU with CuPy (a CUDA graph of the kernels)")


def _steps(planted, device, calls, make_step, dropout=0.5, seed=3):
    """Losses and final weights of ``calls`` steps of a fresh SAGE model, each step made by
    ``make_step(model, opt, features, labels, rows)`` (called once) or train_step."""
    from dgl_maxk.models import build_model
    torch.manual_seed(seed)
    model = build_model("sage", 12, 16, 5, 2, k=4, dropout=dropout).to(device)
    opt = step.make_optimizer(model.parameters(), 0.01)
    feats, labels = planted.features.to(device), planted.labels.to(device)
    mask = planted.train_mask.to(device)
    torch.manual_seed(seed + 1)
    run = make_step(model, opt, feats, labels, mask)
    losses = [float(run()) for _ in range(calls)]
    run.grads = [None if p.grad is None else p.grad.detach().cpu() for p in model.parameters()]
    return losses, [p.detach().cpu() for p in model.parameters()], run


def _eager(planted):
    def make(model, opt, feats, labels, mask):
        return lambda: step.train_step(model, planted.graph, feats, labels[mask], opt,
                                       rows=mask, precision="fp32")
    return make


def _full(planted, **kwargs):
    def make(model, opt, feats, labels, mask):
        return step.FullGraphStep(model, planted.graph, feats, labels[mask], opt, rows=mask,
                                  precision="fp32", **kwargs)
    return make


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_kernels)])
def test_full_graph_step_is_train_step_repeated(planted, device):
    """Five steps (dropout on): the same losses and weights as five train_step calls; on a
    GPU the third to fifth are replays of a CUDA graph, dropout's random numbers
    included; on the CPU every step is train_step."""
    want_losses, want_weights, _ = _steps(planted, device, 5, _eager(planted))
    losses, weights, run = _steps(planted, device, 5, _full(planted))
    assert run.graphed == (device == "cuda") and (run._replay is not None) == run.graphed
    assert len(set(losses)) == 5  # the weights move, so each step's loss differs
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(weights, want_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@needs_kernels
def test_capturing_step_leaves_its_own_gradients(planted):
    """After the second call (the step that captures), the parameters' gradients are that
    step's, as after train_step, though they now live in the graph's buffers."""
    _, _, want = _steps(planted, "cuda", 2, _eager(planted))
    _, _, run = _steps(planted, "cuda", 2, _full(planted))
    assert run._replay is not None
    for got, ref in zip(run.grads, want.grads):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)


@needs_kernels
def test_graphed_step_captures_again_when_trained_parameters_change(planted):
    """A parameter frozen after the capture is no longer trained (as with train_step): the
    step runs eagerly once, then captures again without it."""
    _, _, run = _steps(planted, "cuda", 3, _full(planted), dropout=0.0)
    frozen = run.model.lin_in.weight
    frozen.requires_grad_(False)
    before = frozen.detach().clone()
    first = run._replay
    for _ in range(3):
        run()
    assert run._replay is not None and run._replay is not first
    assert frozen.grad is None and torch.equal(frozen, before)


@needs_kernels
def test_graphed_step_reports_nan_before_the_optimizer(planted):
    """A NaN that appears after the capture is found by the replayed scans and raised with
    its position, the weights and the optimizer's state unchanged, as train_step does."""
    _, _, run = _steps(planted, "cuda", 3, _full(planted), dropout=0.0)
    assert run._replay is not None
    with torch.no_grad():
        run.model.lin_in.bias[7] = float("nan")
    before = [p.detach().clone() for p in run.model.parameters()]
    state = optimizer_state(run.optimizer)
    with pytest.raises(ValueError, match=r"NaN value\(s\), the first at index \(0, 7\)"):
        run()
    for a, b in zip(before, run.model.parameters()):
        torch.testing.assert_close(b.detach(), a, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(optimizer_state(run.optimizer), state, rtol=0, atol=0)  # skipped


@needs_kernels
def test_graphed_step_survives_gradients_set_to_none(planted):
    """A caller's zero_grad(set_to_none=True) between steps does not stop the replays from
    training: the step puts the graph's gradients back."""
    _, _, run = _steps(planted, "cuda", 3, _full(planted))
    assert run._replay is not None
    run.optimizer.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in run.model.parameters()]
    run()
    assert all(p.grad is not None for p in run.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


@needs_kernels
def test_step_that_cannot_be_captured_runs_eagerly(planted):
    """A forward that reads a tensor on the host cannot be captured: the second step finds
    it, runs its step to the end, warns with the reason, and the step trains eagerly from
    then on: the same losses and weights as train_step."""
    def wrap(make):
        def made(model, opt, feats, labels, mask):
            return make(ReadsOnTheHost(model), opt, feats, labels, mask)
        return made
    want_losses, want_weights, _ = _steps(planted, "cuda", 3, wrap(_eager(planted)))
    with pytest.warns(RuntimeWarning, match="cannot be captured in a CUDA graph") as caught:
        losses, weights, run = _steps(planted, "cuda", 3, wrap(_full(planted)))
    assert len([w for w in caught if "cannot be captured" in str(w.message)]) == 1
    assert not run.graphed
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(weights, want_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_full_graph_step_refuses_a_mask_of_another_length(planted):
    mask = torch.ones(planted.num_nodes - 1, dtype=torch.bool)
    with pytest.raises(IndexError, match="rows mask has shape"):
        step.FullGraphStep(torch.nn.Linear(1, 1), planted.graph, planted.features,
                           planted.labels, None, rows=mask)


def test_full_graph_step_takes_rows_as_a_mask_or_indices(planted):
    mask = planted.train_mask
    run = step.FullGraphStep(torch.nn.Linear(1, 1), planted.graph, planted.features,
                             planted.labels[mask], None, rows=mask)
    assert torch.equal(run.rows, mask.nonzero().squeeze(1)) and not run.graphed
    assert not step.FullGraphStep(torch.nn.Linear(1, 1), planted.graph, planted.features,
                                  planted.labels, None, cuda_graph=False).graphed


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("precision, matmul, autocast", [("fp32", "highest", False),
                                                         ("tf32", "high", False),
                                                         ("bf16", "high", True)])
def test_precision_applies_is_recorded_and_restored(precision, matmul, autocast, tmp_path,
                                                    monkeypatch):
    seen, real = set(), step.train_step

    def spy(model, graph, features, *args, **kwargs):
        seen.add(torch.get_float32_matmul_precision())
        wrapped = model.forward
        model.forward = lambda *a: seen.add(torch.is_autocast_enabled("cpu")) or wrapped(*a)
        try:
            return real(model, graph, features, *args, **kwargs)
        finally:
            del model.forward
    monkeypatch.setattr(step, "train_step", spy)
    caller = "medium" if precision != "fp32" else "high"
    torch.set_float32_matmul_precision(caller)
    try:
        cfg = small_config(**{"train.epochs": 2, "train.precision": precision})
        res = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True)
        assert torch.get_float32_matmul_precision() == caller
    finally:
        torch.set_float32_matmul_precision("highest")
    assert seen == {matmul, autocast}
    saved = json.loads((Path(res["run_dir"]) / "results.json").read_text())
    assert saved["precision"] == precision and saved["config"]["train"]["precision"] == precision
    assert saved["environment"]["precision"] == precision
    assert saved["environment"]["float32_matmul_precision"] == matmul
    head = (Path(res["run_dir"]) / "log.txt").read_text().splitlines()[:3]
    assert any(line.startswith(f"precision: {precision} ") and matmul in line for line in head)
    # a CPU run: TF32 has nothing to run on, which the results and the log say
    assert saved["environment"]["tf32_tensor_cores"] is False
    assert any(("no TF32 tensor cores" in line) == (precision != "fp32") for line in head
               if line.startswith("precision:"))


@pytest.mark.parametrize("fast, slow", [("bf16", "fp32"), ("bf16", "bf16")])
def test_results_precision_is_the_variants(fast, slow, tmp_path):
    cfg = small_config(**{"train.epochs": 1, "train.precision": "tf32"},
                       variants={"fast": {"train.precision": fast},
                                 "slow": {"train.precision": slow}})
    res = T.run_experiment(cfg, device="cpu", out=tmp_path, progress=False, quiet=True)
    saved = json.loads((Path(res["run_dir"]) / "results.json").read_text())
    precision, matmul = {"fast": fast, "slow": slow}, {"fast": "high", "slow": "highest"}
    if fast == slow:  # shared by every variant: one name (not the base config's tf32)
        precision, matmul = fast, "high"
    assert saved["precision"] == precision == saved["environment"]["precision"]
    assert saved["environment"]["float32_matmul_precision"] == matmul
    assert {n: v["precision"] for n, v in saved["variants"].items()} == {"fast": fast,
                                                                         "slow": slow}


def test_precision_default_is_tf32():
    assert small_config()["train"]["precision"] == "tf32"


# --------------------------------------------------------------------------- hard edges


def _partial_run(tmp_path, epochs_done=2, **overrides):
    """A run of one seed stopped by its budget after ``epochs_done`` epochs."""
    cfg = small_config(**{"train.epochs": 5, "train.checkpoint_every": 0, **overrides})
    res = T.run_experiment(cfg, device="cpu", out=tmp_path / "runs", progress=False,
                           quiet=True, stop_after_epochs=epochs_done)
    run_dir = Path(res["run_dir"])
    return cfg, run_dir, run_dir / "maxk4" / "seed0"


def _reference(cfg, tmp_path):
    res = T.run_experiment(cfg, device="cpu", out=tmp_path / "ref", progress=False, quiet=True)
    return res["variants"]["maxk4"]["seeds"][0]


def _damage(path: Path, how: str):
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[:len(data) // 2],
                      "junk": bytes(torch.randint(0, 256, (len(data),)).tolist())}[how])


def test_budget_stop_saves_checkpoint_and_is_incomplete(tmp_path):
    cfg, run_dir, seed_dir = _partial_run(tmp_path)  # checkpoint_every 0
    assert not json.loads((run_dir / "results.json").read_text())["complete"]
    ckpt = torch.load(seed_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["state"]["epoch"] == 2 and not ckpt["state"]["finished"]


@pytest.mark.parametrize("kwargs", [{"stop_after_epochs": 0}, {"stop_after_epochs": -2},
                                    {"stop_after_epochs": 1.5}, {"time_limit": -1},
                                    {"time_limit": 0}])
def test_bad_budget_is_refused_before_any_work(kwargs, tmp_path):
    with pytest.raises(T.ConfigError, match="stop-after-epochs|time-limit"):
        T.run_experiment(small_config(), device="cpu", out=tmp_path, progress=False,
                         quiet=True, **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["empty", "truncated", "junk"])
def test_unreadable_checkpoint_is_named_and_restartable(how, tmp_path):
    cfg, run_dir, seed_dir = _partial_run(tmp_path)
    ckpt = seed_dir / "checkpoint.pt"
    _damage(ckpt, how)
    log_before = (run_dir / "log.txt").read_text()
    with pytest.raises(T.CheckpointError) as info:
        T.run_experiment(device="cpu", resume=run_dir, progress=False, quiet=True)
    assert str(ckpt) in str(info.value) and "--restart-corrupt" in str(info.value)
    assert (run_dir / "log.txt").read_text() == log_before  # a refused resume writes nothing
    res = T.run_experiment(device="cpu", resume=run_dir, progress=False, quiet=True,
                           restart_corrupt=True)
    assert res["complete"]
    assert (seed_dir / "checkpoint.pt.corrupt").is_file()
    assert "checkpoint.pt.corrupt" in (run_dir / "log.txt").read_text()
    ref = _reference(cfg, tmp_path)
    got = res["variants"]["maxk4"]["seeds"][0]
    assert [r["loss"] for r in got["history"]] == [r["loss"] for r in ref["history"]]


def test_finished_seed_is_not_retrained_when_its_checkpoint_is_unreadable(planted, tmp_path,
                                                                          monkeypatch):
    from dgl_maxk.training import seed
    cfg = small_config()
    first = _run(cfg, planted, tmp_path)
    _damage(tmp_path / "checkpoint.pt", "truncated")
    monkeypatch.setattr(seed, "FullGraphStep", lambda *a, **k: pytest.fail("retrained"))
    assert _run(cfg, planted, tmp_path) == json.loads(json.dumps(first))


@pytest.mark.parametrize("how", ["empty", "junk", "other_seed"])
def test_unreadable_result_is_treated_as_missing(how, planted, tmp_path, monkeypatch):
    from dgl_maxk.training import seed
    cfg = small_config()
    first = _run(cfg, planted, tmp_path)
    result = tmp_path / "result.json"
    if how == "other_seed":
        result.write_text(json.dumps(dict(first, seed=7)))
    else:
        _damage(result, how)
    # rebuilt from the finished checkpoint, without training again
    monkeypatch.setattr(seed, "FullGraphStep", lambda *a, **k: pytest.fail("retrained"))
    again = _run(cfg, planted, tmp_path)
    for key in ("history", "best_epoch", "best_val", "test_at_best_val", "final"):
        assert again[key] == json.loads(json.dumps(first[key])), key
    assert json.loads(result.read_text())["seed"] == 0


@pytest.mark.parametrize("content", [b"", b"\x00\xff\xfe binary \x80", b"- a\n- list\n",
                                     b"name: [unclosed", b"model: {name: sage}\n"])
def test_unreadable_run_config_is_named(content, tmp_path):
    _, run_dir, _ = _partial_run(tmp_path)
    (run_dir / "config.yaml").write_bytes(content)
    log_before = (run_dir / "log.txt").read_text()
    with pytest.raises(T.ConfigError, match=str(run_dir / "config.yaml")):
        T.run_experiment(device="cpu", resume=run_dir, progress=False, quiet=True)
    assert (run_dir / "log.txt").read_text() == log_before


def test_refused_resume_leaves_the_log_alone(tmp_path):
    import yaml
    _, run_dir, _ = _partial_run(tmp_path)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["train"]["lr"] = 0.05
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    log_before = (run_dir / "log.txt").read_text()
    with pytest.raises(T.ConfigError, match="another config"):
        T.run_experiment(device="cpu", resume=run_dir, progress=False, quiet=True)
    assert (run_dir / "log.txt").read_text() == log_before


def test_a_second_signal_stops_at_once_naming_the_run_directory(tmp_path, monkeypatch):
    signals = runner.StopSignals()
    signals._record(signal.SIGTERM, None)
    assert signals.signal_name == "SIGTERM"
    with pytest.raises(runner._StopNow):  # the second one does not wait for the epoch end
        signals._record(signal.SIGINT, None)

    def stopped_at_once(*args, **kwargs):
        raise runner._StopNow("SIGINT")
    monkeypatch.setattr(runner, "_train_variants", stopped_at_once)
    with pytest.raises(T.RunInterrupted, match="second SIGINT") as info:
        T.run_experiment(small_config(), device="cpu", out=tmp_path, progress=False)
    assert info.value.run_dir.parent == tmp_path and info.value.run_dir.is_dir()


def test_resume_takes_no_seeds(tmp_path):
    with pytest.raises(T.ConfigError, match="do not pass seeds"):
        T.run_experiment(resume=tmp_path, seeds=[0, 1], device="cpu")


def test_signal_handlers_are_restored(tmp_path):
    import signal
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    T.run_experiment(small_config(**{"train.epochs": 1}), device="cpu", out=tmp_path,
                     progress=False, quiet=True)
    assert {s: signal.getsignal(s) for s in before} == before


# --------------------------------------------------------------------------- signals

_CHILD = """
import json, signal, sys
import dgl_maxk
from dgl_maxk import training as T
cfg = T.validate_config(json.loads(sys.argv[1]))
try:
    T.run_experiment(cfg, device="cpu", out=sys.argv[2], progress=False, verbose=True)
except T.RunInterrupted as err:
    print("INTERRUPTED", err.run_dir, err.signal_name, flush=True)
    sys.exit(4)
"""


def _child_env():
    import os
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_signal_saves_a_checkpoint_and_resume_completes(signame, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    cfg = small_config(**{"train.epochs": 400, "train.checkpoint_every": 0})
    child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cfg), str(tmp_path)],
                             cwd=REPO, env=_child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    for line in child.stdout:
        if "epoch    2/" in line:
            os.kill(child.pid, getattr(signal, signame))
            break
    out, err = child.communicate(timeout=120)
    assert child.returncode == 4, err[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert f"INTERRUPTED {run_dir} {signame}" in out
    seed_dir = run_dir / "maxk4" / "seed0"
    ckpt = torch.load(seed_dir / "checkpoint.pt", weights_only=False)
    done = ckpt["state"]["epoch"]
    assert 2 <= done < 400 and len(ckpt["state"]["history"]) == done
    assert not json.loads((run_dir / "results.json").read_text())["complete"]
    assert not list(run_dir.rglob("*.tmp*"))
    resumed = T.run_experiment(device="cpu", resume=run_dir, progress=False, quiet=True,
                               stop_after_epochs=3)
    ref = T.run_experiment(cfg, device="cpu", out=tmp_path / "ref", progress=False,
                           quiet=True, stop_after_epochs=done + 3)
    a, b = (r["run_dir"] for r in (resumed, ref))
    hist_a = torch.load(Path(a) / "maxk4" / "seed0" / "checkpoint.pt", weights_only=False)
    hist_b = torch.load(Path(b) / "maxk4" / "seed0" / "checkpoint.pt", weights_only=False)
    assert hist_a["state"]["history"][-1]["epoch"] == done + 3
    assert [r["loss"] for r in hist_a["state"]["history"]] == \
        [r["loss"] for r in hist_b["state"]["history"]]


_WRITER = """
import os, signal, sys, time
import torch
from dgl_maxk.training import checkpoint as C
real_save = torch.save
def slow_save(obj, f):
    f.write(b"partial")
    os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the write
    time.sleep(0.2)
    f.seek(0)
    real_save(obj, f)
torch.save = slow_save
C.save_checkpoint(sys.argv[1], {"x": torch.arange(5)})
print("NOT REACHED")
"""


def test_sigterm_during_a_checkpoint_write_leaves_a_whole_file_and_no_temp(tmp_path):
    import signal
    import subprocess
    import sys
    path = tmp_path / "checkpoint.pt"
    r = subprocess.run([sys.executable, "-c", _WRITER, str(path)], cwd=REPO, env=_child_env(),
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]  # the signal took its course
    assert "NOT REACHED" not in r.stdout
    assert torch.equal(torch.load(path, weights_only=False)["x"], torch.arange(5))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    def boom(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        C.save_checkpoint(tmp_path / "c.pt", {"x": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loss_is_cross_entropy(dtype):
    from dgl_maxk.training.step import loss_fn
    logits = torch.randn(50, 7, dtype=dtype, requires_grad=True)
    labels = torch.randint(7, (50,))
    got, want = loss_fn(logits, labels, False), torch.nn.functional.cross_entropy(logits, labels)
    assert torch.allclose(got, want)
    assert torch.allclose(*(torch.autograd.grad(v, logits)[0] for v in (got, want)))
    multi = torch.randint(2, (50, 7)).to(dtype)
    assert torch.equal(loss_fn(logits, multi, True),
                       torch.nn.functional.binary_cross_entropy_with_logits(logits, multi))



def test_one_seed_has_no_standard_deviation(tmp_path):
    """The sample std is undefined for one value: null in results.json and no '± 0.00' in the
    summary (a paper would quote it as a measured spread)."""
    from dgl_maxk.training.metrics import mean_std_text, stats
    from dgl_maxk.training.report import summary_lines
    assert stats([0.5])["std"] is None and stats([0.5, 0.7])["std"] > 0
    assert mean_std_text(stats([0.5])) == "50.00"
    assert mean_std_text(stats([0.5, 0.7])) == "60.00 ± 14.14"
    results = T.run_experiment(small_config(**{"train.epochs": 2}), device="cpu",
                               out=tmp_path, progress=False, quiet=True)
    (variant,) = results["variants"].values()
    assert variant["test"]["n"] == 1 and variant["test"]["std"] is None
    line = next(line for line in summary_lines(results) if "hidden" in line)
    assert "±" not in line and f"{100 * variant['test']['mean']:.2f} (n=1" in line
