"""Mini-batch training: blocks from DGL's sampler, the sampled trainer mode, and
data-parallel training over two processes with gloo."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dgl_maxk
from dgl_maxk.cli import main as cli_main
from dgl_maxk.training import sampling
from dgl_maxk._dgl import dgl
from dgl_maxk.models import build_model
from dgl_maxk.training.sampled_step import SampledStep

REPO = Path(__file__).resolve().parents[1]


# GCN is left out: GraphConv's 'both' normalisation divides by the *block's* out-degrees on a
# block, as DGL's GraphConv does, so its block outputs differ from the full graph's by design.
@pytest.mark.parametrize("name", ["sage", "gin"])
@pytest.mark.parametrize("nonlinearity", ["maxk", "relu"])
def test_blocks_with_all_neighbours_equal_the_full_graph(name, nonlinearity, h):
    """Sampling every neighbour (fan-out -1) gives blocks whose outputs at the seed nodes are
    the full-graph outputs (destination nodes are a prefix of the sources)."""
    g = dgl.add_self_loop(h.random_graph(60, 240))
    x = torch.randn(60, 12, dtype=torch.float64)
    model = build_model(name, 12, 16, 5, 2, k=4, dropout=0.3,
                        nonlinearity=nonlinearity).double().eval()
    full = model(g, x)
    seeds = h.random_seeds(60, 17)
    loader = sampling.make_loader(g, seeds, [-1, -1], batch_size=8, seed=0)
    seen = 0
    for input_nodes, output_nodes, blocks in loader:
        for block in blocks:
            assert torch.equal(block.srcdata[dgl.NID][:block.num_dst_nodes()],
                               block.dstdata[dgl.NID])
        out = model(blocks, x[input_nodes])
        torch.testing.assert_close(out, full[output_nodes], rtol=1e-10, atol=1e-10)
        seen += len(output_nodes)
    assert seen == len(seeds)


def test_train_epoch_reduces_the_loss(h):
    g = dgl.add_self_loop(h.random_graph(200, 1000))
    x = torch.randn(200, 8)
    y = (x[:, 0] > 0).long()  # learnable from the features
    model = build_model("sage", 8, 16, 2, 2, k=4, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    step = SampledStep(model, opt, [5, 5], 50, 200)
    loader = sampling.make_loader(g, torch.arange(200), [5, 5], batch_size=50, seed=0)
    first = sampling.train_epoch(step, loader, x, y, torch.device("cpu"),
                                  timed=True)
    for _ in range(15):
        last = sampling.train_epoch(step, loader, x, y, torch.device("cpu"))
    assert first["seeds"] == 200 and first["steps"] == 4
    assert first["sample_s"] > 0 and first["compute_s"] > 0
    assert last["loss"] < 0.7 * first["loss"], (first["loss"], last["loss"])


def _cli(launcher, *args, returncode=0):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    cmd = [sys.executable, *launcher, "-m", "dgl_maxk", "train", *map(str, args)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert returncode is None or r.returncode == returncode, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def _results(out):
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((run_dir / "results.json").read_text()), run_dir


# --standalone: torchrun's rendezvous on a free port (tests running side by side would
# collide on the fixed default).
TWO_PROCESSES = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
ARGS = ["--config", str(REPO / "configs" / "quickstart_minibatch.yaml"), "--device", "cpu",
        "--seeds", "1", "--set", "train.epochs=3", "dataset.params.num_nodes=400",
        "--no-progress"]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """(stdout, results, run directory) of the uninterrupted two-process run (both tests
    below read it)."""
    out = tmp_path_factory.mktemp("whole")
    r = _cli(TWO_PROCESSES, *ARGS, "--verbose", "--out", out)
    return (r.stdout, *_results(out))


def test_two_process_gloo_training_gives_the_same_result_format(two_process_run, tmp_path):
    assert cli_main(["train", *ARGS, "--out", str(tmp_path)]) == 0  # the same run in one process
    one, _ = _results(tmp_path)
    two_out, two, run_dir = two_process_run
    assert one["processes"] == 1 and two["processes"] == 2
    assert set(two) == set(one)
    for variant in ("maxk", "relu"):
        seeds_one, seeds_two = one["variants"][variant]["seeds"], two["variants"][variant]["seeds"]
        assert len(seeds_two) == 1 and set(seeds_two[0]) == set(seeds_one[0])
        assert [r["epoch"] for r in seeds_two[0]["history"]] == [1, 2, 3]
        assert 0.0 <= two["variants"][variant]["test"]["mean"] <= 1.0
    # one writer: process 0's log lines appear once, and the files exist once
    assert two_out.count("[maxk seed 0] epoch    3/3") == 1
    assert (run_dir / "maxk" / "seed0" / "result.json").is_file()
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "log.txt", "maxk",
                                                        "relu", "results.json"]


def test_two_process_run_resumes_to_the_uninterrupted_result(two_process_run, tmp_path):
    """Each process draws its own dropout masks (its blocks differ in size), so each must
    resume from its own random state, not process 0's."""
    _, whole, _ = two_process_run
    # each process exits 4 (stopped, resumable), which torchrun reports as its own failure
    r = _cli(TWO_PROCESSES, *ARGS, "--out", tmp_path, "--stop-after-epochs", "2",
             returncode=None)
    cut, run_dir = _results(tmp_path)
    assert not cut["complete"] and f"--resume {run_dir}" in r.stderr, r.stderr[-3000:]
    # on the device of the cut run (a GPU machine's default would be its GPUs)
    r = _cli(TWO_PROCESSES, "--resume", run_dir, "--device", "cpu", "--no-progress")
    assert "resuming from epoch 2" in r.stdout
    resumed, _ = _results(tmp_path)
    for variant in ("maxk", "relu"):
        a, b = (res["variants"][variant]["seeds"][0] for res in (resumed, whole))
        assert [h["loss"] for h in a["history"]] == [h["loss"] for h in b["history"]], variant
