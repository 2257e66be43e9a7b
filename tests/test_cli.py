"""The command line, end to end in subprocesses: ``python -m dgl_maxk ...``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args, cwd=REPO, env=None, timeout=180):
    full_env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep +
                    os.environ.get("PYTHONPATH", ""), PYTHONWARNINGS="ignore",
                    OMP_NUM_THREADS="1")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "dgl_maxk", *map(str, args)], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_dirs(out: Path):
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def test_two_epoch_quickstart_end_to_end(tmp_path):
    out = tmp_path / "runs"
    r = cli("train", "--config", "configs/quickstart.yaml", "--set", "train.epochs=2",
            "train.log_every=1", "--seeds", "1", "--out", out, "--device", "cpu",
            "--threads", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    # both variants' scores are printed, and one log line per epoch
    assert "maxk (sage, k=8" in r.stdout and "relu (sage, ReLU" in r.stdout
    assert r.stdout.count("[maxk seed 0] epoch") == 2
    assert r.stdout.count("[relu seed 0] epoch") == 2
    (run_dir,) = run_dirs(out)
    res = json.loads((run_dir / "results.json").read_text())
    assert res["complete"] and res["config"]["train"]["epochs"] == 2
    assert res["config"]["train"]["seeds"] == [0]
    for name in ("maxk", "relu"):
        seed = res["variants"][name]["seeds"][0]
        assert len(seed["history"]) == 2 and 0 <= seed["test_at_best_val"] <= 1
        assert (run_dir / name / "seed0" / "checkpoint.pt").exists()
    assert res["environment"]["device"] == "cpu"


def test_bad_config_fails_before_any_work(tmp_path):
    out = tmp_path / "runs"
    for args, key in ((["--set", "model.k=128"], "model.k"),
                      (["--set", "model.hiden=3"], "model.hiden"),
                      (["--set", "dataset.name=mnist"], "dataset.name"),
                      (["--set", "train.epochs=ten"], "train.epochs")):
        r = cli("train", "--config", "configs/quickstart.yaml", *args, "--out", out)
        assert r.returncode == 2, (args, r.stderr)
        assert f"'{key}'" in r.stderr, (args, r.stderr)
    assert run_dirs(out) == []


def test_missing_dataset_fails_fast_with_layout(tmp_path):
    out = tmp_path / "runs"
    start = time.monotonic()
    r = cli("train", "--config", "configs/reddit_sage.yaml", "--out", out,
            env={"DGL_MAXK_DATA": str(tmp_path / "nodata")})
    assert time.monotonic() - start < 60
    assert r.returncode == 3, r.stderr
    assert str(tmp_path / "nodata" / "reddit_69f818f5") in r.stderr
    assert "reddit_graph.npz" in r.stderr and "reddit_data.npz" in r.stderr
    assert run_dirs(out) == []


# Mini-batch runs resume to the same result too: DGL's sampler is reseeded per epoch, and is
# deterministic with one thread (cli() sets OMP_NUM_THREADS=1).
@pytest.mark.parametrize("config", ["quickstart", "quickstart_minibatch"])
def test_stop_and_resume_through_cli(config, tmp_path):
    out = tmp_path / "runs"
    common = ["--set", "train.epochs=3", "dataset.params.num_nodes=300", "--seeds", "1",
              "--device", "cpu"]
    r = cli("train", "--config", f"configs/{config}.yaml", *common, "--out", out,
            "--stop-after-epochs", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = run_dirs(out)
    assert not json.loads((run_dir / "results.json").read_text())["complete"]
    assert "--resume" in r.stdout
    r = cli("train", "--resume", run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from epoch 1" in r.stdout  # relu stopped after its first epoch
    resumed = json.loads((run_dir / "results.json").read_text())
    assert resumed["complete"]
    r = cli("train", "--config", f"configs/{config}.yaml", *common, "--out", tmp_path / "b")
    (ref_dir,) = run_dirs(tmp_path / "b")
    ref = json.loads((ref_dir / "results.json").read_text())
    for name in ("maxk", "relu"):
        a = resumed["variants"][name]["seeds"][0]
        b = ref["variants"][name]["seeds"][0]
        assert [h["loss"] for h in a["history"]] == [h["loss"] for h in b["history"]]
        assert a["test_at_best_val"] == b["test_at_best_val"]
    r = cli("train", "--resume", run_dir, "--set", "k=4")
    assert r.returncode == 2 and "--resume" in r.stderr


def test_validate_every_config():
    configs = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))
    assert len(configs) >= 11
    r = cli("validate", *configs)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(": ok") == len(configs)


def test_datasets_command_lists_layouts():
    r = cli("datasets")
    assert r.returncode == 0, r.stderr
    assert "reddit_69f818f5" in r.stdout and "ogbn_arxiv" in r.stdout
    assert "planted" in r.stdout and "powerlaw" in r.stdout
