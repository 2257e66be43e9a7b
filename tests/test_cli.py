"""The command line: end to end in subprocesses (``python -m dgl_maxk ...``); its output,
bad input and exit statuses in this process, through ``dgl_maxk.cli.main``."""
from __future__ import annotations

import builtins
import errno
import importlib.util
import io
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dgl_maxk.cli import main as cli_main
from dgl_maxk.data import DatasetError
from dgl_maxk.training.errors import CheckpointError, RunInterrupted

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


def cli(*args):
    """``python -m dgl_maxk *args``, run from the repository."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dgl_maxk", *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180,
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
    assert "] epoch" not in r.stdout  # in the log only (--verbose prints them)
    assert "epoch/s" not in r.stderr  # no progress bar where stderr is no terminal
    (run_dir,) = run_dirs(out)
    log = (run_dir / "log.txt").read_text()
    assert log.count("[maxk seed 0] epoch") == 2 and log.count("[relu seed 0] epoch") == 2
    res = json.loads((run_dir / "results.json").read_text())
    assert res["complete"] and res["config"]["train"]["epochs"] == 2
    assert res["config"]["train"]["seeds"] == [0]
    for name in ("maxk", "relu"):
        seed = res["variants"][name]["seeds"][0]
        assert len(seed["history"]) == 2 and 0 <= seed["test_at_best_val"] <= 1
        assert (run_dir / name / "seed0" / "checkpoint.pt").exists()
    assert res["environment"]["device"] == "cpu"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


TINY_RUN = ["train", "--config", QUICKSTART, "--set", "epochs=3", "dataset.params.num_nodes=300",
            "variants=null", "--seeds", "1", "--device", "cpu"]


@pytest.mark.parametrize("flag", [None, "--verbose", "--quiet"])
def test_per_epoch_lines_go_to_the_log_and_to_stdout_with_verbose(flag, tmp_path, capsys):
    code = cli_main([*map(str, TINY_RUN), "--out", str(tmp_path), *([flag] if flag else [])])
    out, err = capsys.readouterr()
    assert code == 0, err
    (run_dir,) = run_dirs(tmp_path)
    log = (run_dir / "log.txt").read_text()
    assert re.findall(r"seed 0\] epoch +(\d+)/3 loss", log) == ["1", "2", "3"], log
    assert out.count("] epoch ") == (3 if flag == "--verbose" else 0), out
    assert ("run directory:" in out and "best val" in out) == (flag != "--quiet"), out
    assert "== quickstart: test at best validation epoch" in out and "accuracy" in out
    assert "epoch/s" not in err  # stderr is no terminal here: no bar


def test_progress_bar_per_seed_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    code = cli_main([*map(str, TINY_RUN), "--seeds", "2", "--out", str(tmp_path)])
    assert code == 0
    bars = sys.stderr.getvalue()
    assert " seed 0:" in bars and " seed 1:" in bars and "epoch/s" in bars, bars
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert cli_main([*map(str, TINY_RUN), "--out", str(tmp_path), "--no-progress"]) == 0
    assert sys.stderr.getvalue() == ""
    assert "== quickstart" in capsys.readouterr().out


# Mini-batch runs resume to the same result too: DGL's sampler is reseeded per epoch, and is
# deterministic with one thread (cli() sets OMP_NUM_THREADS=1).
@pytest.mark.parametrize("config", ["quickstart", "quickstart_minibatch"])
def test_stop_and_resume_through_cli(config, tmp_path):
    out = tmp_path / "runs"
    common = ["--set", "train.epochs=3", "dataset.params.num_nodes=300", "--seeds", "1",
              "--device", "cpu"]
    r = cli("train", "--config", f"configs/{config}.yaml", *common, "--out", out,
            "--stop-after-epochs", "4")
    assert r.returncode == 4, r.stderr[-3000:]  # stopped, resumable
    (run_dir,) = run_dirs(out)
    assert not json.loads((run_dir / "results.json").read_text())["complete"]
    assert f"--resume {run_dir}" in r.stderr and "Traceback" not in r.stderr
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
    assert "ogbn_papers100M/ {raw/data.npz, raw/node-label.npz" in r.stdout
    starts = {len(line) - len(line.lstrip()[len(line.split()[0]):].lstrip())
              for line in r.stdout.splitlines()[1:]}
    assert len(starts) == 1, r.stdout  # the layouts in one column


# --------------------------------------------------------------------------- bad input
# In process through cli.main (the subprocess tests above cover `python -m dgl_maxk`): an
# uncaught exception would fail the test, so passing means no traceback.


def run_main(argv, capsys):
    """(exit status, stderr) of ``python -m dgl_maxk *argv``."""
    try:
        code = cli_main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def one_line_error(err):
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


def test_bad_config_fails_before_any_work(tmp_path, capsys):
    out = tmp_path / "runs"
    for args, key in ((["--set", "model.k=128"], "model.k"),
                      (["--set", "model.hiden=3"], "model.hiden"),
                      (["--set", "dataset.name=mnist"], "dataset.name"),
                      (["--set", "train.epochs=ten"], "train.epochs")):
        code, err = run_main(["train", "--config", QUICKSTART, *args, "--out", out], capsys)
        assert code == 2, (args, err)
        assert f"'{key}'" in err, (args, err)
    assert run_dirs(out) == []


def test_missing_dataset_fails_fast_with_layout(tmp_path, capsys, monkeypatch):
    out = tmp_path / "runs"
    monkeypatch.setenv("DGL_MAXK_DATA", str(tmp_path / "nodata"))
    start = time.monotonic()
    code, err = run_main(["train", "--config", REPO / "configs" / "reddit_sage.yaml", "--out",
                          out], capsys)
    assert time.monotonic() - start < 60
    assert code == 3, err
    assert str(tmp_path / "nodata" / "reddit_69f818f5") in err
    assert "reddit_graph.npz" in err and "reddit_data.npz" in err
    assert run_dirs(out) == []


def test_unreadable_config_files(tmp_path, capsys):
    binary = tmp_path / "weights.yaml"
    binary.write_bytes(bytes([0x80, 0]) + random.randbytes(200))
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: r\xe9sum\xe9\n".encode("latin-1"))
    for config, problem in ((tmp_path, f"{tmp_path} is a directory"),
                            (binary, "weights.yaml is not a text file"),
                            (latin1, "latin1.yaml is not a text file")):
        code, err = run_main(["train", "--config", config, "--out", tmp_path / "runs"], capsys)
        assert code == 2 and "Traceback" not in err, err
        assert err.startswith("error: ") and problem in err, err
    assert run_dirs(tmp_path / "runs") == []
    code = cli_main(["validate", str(tmp_path), str(QUICKSTART)])
    out, err = capsys.readouterr()
    assert code == 2 and "is a directory" in err and ": ok" in out


@pytest.mark.parametrize("args, named", [
    (["--threads", "-3"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--device", "tpu"], "'tpu'"),
    (["--device", "cuda:99"], "cuda:99"),
    (["--stop-after-epochs", "0"], "--stop-after-epochs"),
    (["--stop-after-epochs", "-2"], "--stop-after-epochs"),
    (["--time-limit", "-1"], "--time-limit"),
    (["--time-limit", "0"], "--time-limit"),
    (["--seeds", "0"], "for seed 0 write --seeds 0,"),
    (["--seeds", "-2"], "--seeds"),
    (["--seeds", "4294967296,"], "argument --seeds: config key 'train.seeds' must hold seeds "
                                 "from 0 to 4294967295"),
    (["--seeds", "99999999999999999999"], "argument --seeds: config key 'train.seeds' must be "
                                          "a positive count of at most"),
    (["--seeds", "4294967296"], "argument --seeds: config key 'train.seeds' must be a positive "
                                "count of at most"),
    (["--restart-corrupt"], "--restart-corrupt"),
    (["--verbose", "--quiet"], "--quiet: not allowed with argument --verbose"),
])
def test_bad_arguments_fail_in_one_line_before_any_work(args, named, tmp_path, capsys,
                                                         monkeypatch):
    monkeypatch.setattr("dgl_maxk.cli.run_experiment", lambda *a, **k: pytest.fail("ran"))
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path / "runs",
                          *args], capsys)
    assert code == 2 and one_line_error(err) and named in err, err
    assert run_dirs(tmp_path / "runs") == []


def test_reproduce_checks_the_seeds_with_the_config_before_any_run(tmp_path, capsys,
                                                                  monkeypatch):
    spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    monkeypatch.setattr(reproduce.T, "run_experiment", lambda *a, **k: pytest.fail("ran"))
    for seeds, problem in (("4294967296,", "must hold seeds from 0 to 4294967295"),
                           ("99999999999999999999", "must be a positive count of at most"),
                           ("4294967296", "must be a positive count of at most")):
        code = reproduce.main(["--configs", str(QUICKSTART), "--seeds", seeds, "--device",
                               "cpu", "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and one_line_error(err), err
        assert "'train.seeds'" in err and problem in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_an_argument_error(tmp_path, capsys):
    code, err = run_main(["train", "--config", QUICKSTART, "--device", "cuda"], capsys)
    assert code == 2 and one_line_error(err) and "0 CUDA device" in err, err


def test_unusable_out_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("dgl_maxk.cli.run_experiment", lambda *a, **k: pytest.fail("ran"))
    a_file = tmp_path / f"file{random.randint(0, 99)}"
    a_file.write_text("x")
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    for out, problem in ((a_file, "is a file"), (a_file / "runs", "is a file"),
                         (read_only, "is not writable"), (read_only / "runs", "not writable")):
        code, err = run_main(["train", "--config", QUICKSTART, "--out", out], capsys)
        assert code == 2 and one_line_error(err), err
        assert f"--out {out}" in err and problem in err, err
    assert list(read_only.iterdir()) == []


# --------------------------------------------------------------------------- exit codes


@pytest.fixture
def fake_run(monkeypatch):
    """Replace run_experiment by one that returns or raises ``outcome``; returns its calls."""
    calls = []

    def install(outcome):
        def run_experiment(cfg, **kwargs):
            calls.append((cfg, kwargs))
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        monkeypatch.setattr("dgl_maxk.cli.run_experiment", run_experiment)
        return calls
    return install


def test_finished_run_exits_0_with_the_arguments_passed_on(fake_run, tmp_path, capsys):
    calls = fake_run({"complete": True, "run_dir": str(tmp_path / "r")})
    seeds = sorted(random.sample(range(50), 3))
    code, err = run_main(["train", "--config", QUICKSTART, "--seeds",
                          ",".join(map(str, seeds)), "--set", "k=4", "--out", tmp_path,
                          "--device", "cpu", "--stop-after-epochs", "5"], capsys)
    assert code == 0 and err == ""
    ((cfg, kwargs),) = calls
    assert cfg["train"]["seeds"] == seeds and cfg["model"]["k"] == 4
    assert kwargs["device"] == "cpu" and kwargs["stop_after_epochs"] == 5
    assert kwargs["out"] == str(tmp_path) and kwargs["restart_corrupt"] is False


def test_stopped_run_exits_4_naming_the_run_directory(fake_run, tmp_path, capsys):
    run_dir = tmp_path / f"quickstart-{random.randint(0, 10**6)}"
    fake_run({"complete": False, "run_dir": str(run_dir)})
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path,
                          "--time-limit", "60"], capsys)
    assert code == 4 and f"--resume {run_dir}" in err and "<" not in err, err


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_interrupted_run_exits_4_naming_the_run_directory(signal_name, fake_run, tmp_path,
                                                          capsys):
    run_dir = tmp_path / f"quickstart-{random.randint(0, 10**6)}"
    fake_run(RunInterrupted(run_dir, signal_name))
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path], capsys)
    assert code == 4 and signal_name in err and f"--resume {run_dir}" in err, err
    assert "<run directory>" not in err


def test_an_unknown_option_is_named_by_its_command_with_the_set_spelling(capsys):
    code, err = run_main(["train", "--config", QUICKSTART, "--epochs", "3"], capsys)
    assert code == 2 and one_line_error(err), err
    assert "--epochs 3" in err and "--set train.epochs=" in err and "train --help" in err
    code, err = run_main(["validate", QUICKSTART, "--bogus"], capsys)
    assert code == 2 and one_line_error(err) and "validate --help" in err, err
    assert "--set" not in err


def test_diverged_training_exits_5_naming_the_epoch(tmp_path, capsys):
    """A learning rate that sends the weights to NaN: one line naming the seed, the epoch and
    what to change (the run directory keeps what was saved), not a traceback."""
    code, err = run_main(["train", "--config", QUICKSTART, "--seeds", "0,", "--set", "epochs=3",
                          "variants=null", "lr=1e30", "--out", tmp_path, "--device", "cpu",
                          "--no-progress", "--quiet"], capsys)
    assert code == 5 and one_line_error(err), err
    assert "seed 0] epoch 1/3" in err and "NaN" in err and "train.lr" in err, err
    assert "the dataset's features hold none" in err, err


@pytest.mark.parametrize("sparse", [False, True])
def test_a_nan_in_training_names_its_cause(sparse):
    """NaN in the dataset's features points there; without, to the learning rate."""
    from dgl_maxk.training.seed import _nan_cause
    features = torch.rand(7, 5)
    clean = features.to_sparse() if sparse else features
    assert "lower train.lr" in _nan_cause(clean) and "hold none" in _nan_cause(clean)
    features[int(torch.randint(7, ())), int(torch.randint(5, ()))] = float("nan")
    dirty = features.to_sparse() if sparse else features
    assert "features hold NaN" in _nan_cause(dirty) and "train.lr" not in _nan_cause(dirty)


def test_a_run_file_that_cannot_be_written_is_one_line(fake_run, tmp_path, capsys):
    full = tmp_path / "run" / "results.json"
    fake_run(OSError(28, "No space left on device", str(full)))
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path], capsys)
    assert code == 2 and one_line_error(err), err
    assert str(full) in err and "No space left on device" in err


class _NoSpaceLeft(io.FileIO):
    """A file on a full disk: it opens, but no byte of it can be written (the system's ENOSPC,
    which names no file)."""

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def disk_full_at(monkeypatch):
    """``disk_full_at(name, after=0)``: the files called ``name`` (or its temporary files,
    ``name.tmp<pid>``) that are opened for writing after the first ``after`` of them are
    on a full disk."""
    real_open = builtins.open

    def fill(name, after=0):
        opened = []

        def open_(file, mode="r", *args, **kwargs):
            if not (isinstance(file, (str, os.PathLike)) and set(mode) & set("wax")
                    and Path(file).name.startswith(name)):
                return real_open(file, mode, *args, **kwargs)
            opened.append(file)
            if len(opened) <= after:
                return real_open(file, mode, *args, **kwargs)
            raw = io.BufferedWriter(_NoSpaceLeft(file, "".join(c for c in mode if c in "wax+")))
            return raw if "b" in mode else io.TextIOWrapper(raw, kwargs.get("encoding"))
        monkeypatch.setattr(builtins, "open", open_)
    return fill


@pytest.mark.parametrize("name, after", [("config.yaml", 0), ("log.txt", 0),
                                         ("checkpoint.pt", 1), ("results.json", 0)])
def test_a_full_disk_is_one_line_naming_the_file(name, after, disk_full_at, tmp_path,
                                                 capsys):
    """Whichever run file meets the full disk is named, in one line, with status 2; the files
    written before it stay whole (the checkpoint of the epoch before), and no temporary file
    is left."""
    disk_full_at(name, after)
    code, err = run_main(["train", "--config", QUICKSTART, "--seeds", "0,", "--set",
                          "epochs=3", "checkpoint_every=1", "variants=null",
                          "dataset.params.num_nodes=300", "--out", tmp_path, "--device", "cpu",
                          "--no-progress", "--quiet"], capsys)
    assert code == 2 and one_line_error(err), err
    assert err.strip().endswith(f"{name}: No space left on device"), err
    assert not list(tmp_path.rglob("*.tmp*"))
    if name == "config.yaml":  # no run directory without its config
        assert run_dirs(tmp_path) == []
        return
    (run_dir,) = run_dirs(tmp_path)
    assert f"error: {run_dir}" in err, err
    if name == "checkpoint.pt":
        ckpt = torch.load(run_dir / "maxk8" / "seed0" / name, weights_only=False)
        assert ckpt["state"]["epoch"] == 1 and len(ckpt["state"]["history"]) == 1


def test_resume_passes_restart_corrupt_and_bad_checkpoints_exit_2(fake_run, tmp_path, capsys):
    ckpt = tmp_path / "maxk" / "seed0" / "checkpoint.pt"
    calls = fake_run(CheckpointError(f"{ckpt} cannot be read (truncated); pass "
                                     "--restart-corrupt to restart that seed from scratch"))
    code, err = run_main(["train", "--resume", tmp_path], capsys)
    assert code == 2 and one_line_error(err) and str(ckpt) in err, err
    code, err = run_main(["train", "--resume", tmp_path, "--restart-corrupt"], capsys)
    assert [kwargs["restart_corrupt"] for _, kwargs in calls] == [False, True]
    assert [cfg for cfg, _ in calls] == [None, None]
    assert [kwargs["resume"] for _, kwargs in calls] == [str(tmp_path)] * 2


def test_unreadable_data_exits_3(fake_run, tmp_path, capsys):
    fake_run(DatasetError(f"dataset 'reddit': {tmp_path}/reddit_data.npz is corrupt"))
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path], capsys)
    assert code == 3 and one_line_error(err) and "reddit_data.npz" in err, err


def test_sigint_before_the_run_started(fake_run, tmp_path, capsys):
    fake_run(KeyboardInterrupt())
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path], capsys)
    assert code == 130 and "nothing to resume" in err and "<" not in err, err


def test_flag_error_leads_with_the_flags_of_the_keys_named_whole():
    """A script's config error names its flags first, in the message's order, for whole keys
    only."""
    from dgl_maxk.cli import flag_error
    from dgl_maxk.training import ConfigError
    flags = {"model.k": "--ks", "model.hidden": "--hidden", "dataset.params.seed": "--seed"}
    err = ConfigError("config key 'model.k' = 64 exceeds model.hidden = 32")
    assert flag_error(err, flags) == f"argument --ks / --hidden: {err}"
    swapped = {"model.hidden": "--hidden", "model.k": "--ks"}  # the message's order wins
    assert flag_error(err, swapped) == f"argument --ks / --hidden: {err}"
    for unrelated in ("config key 'model.kind' is unknown", "sub.model.k = 3",
                      "config key 'params.seed' is unknown"):
        assert flag_error(ConfigError(unrelated), flags) == unrelated


def test_a_second_ctrl_c_writes_the_finished_seeds_to_results_json(tmp_path, capsys,
                                                                   monkeypatch):
    """Two Ctrl-C as the second seed starts: the run stops at once (status 4), and its
    results.json, marked incomplete, holds the seed that had finished."""
    import signal
    from dgl_maxk.training import runner
    real_run_seed = runner.run_seed

    def run_seed(cfg, dataset, seed, *args, **kwargs):
        if seed == 1:
            os.kill(os.getpid(), signal.SIGINT)  # stop at the end of the epoch ...
            os.kill(os.getpid(), signal.SIGINT)  # ... no, at once
        return real_run_seed(cfg, dataset, seed, *args, **kwargs)
    monkeypatch.setattr(runner, "run_seed", run_seed)
    code, err = run_main(["train", "--config", QUICKSTART, "--seeds", "2", "--set",
                          "epochs=2", "dataset.params.num_nodes=300", "--out", tmp_path,
                          "--device", "cpu", "--no-progress", "--quiet"], capsys)
    (run_dir,) = run_dirs(tmp_path)
    assert code == 4 and "a second SIGINT" in err and f"--resume {run_dir}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["complete"] is False and list(results["variants"]) == ["maxk"]
    (finished,) = results["variants"]["maxk"]["seeds"]
    assert finished["seed"] == 0 and results["variants"]["maxk"]["test"]["n"] == 1
    assert 0 <= finished["test_at_best_val"] <= 1


def test_sigterm_outside_a_run_is_reported_as_a_ctrl_c_is_with_143(monkeypatch, tmp_path,
                                                                   capsys):
    """SIGTERM (what schedulers send) while a command runs outside a run's own handlers: the
    command's interrupted line and 143, not a silent death; the handler from before comes
    back."""
    import os
    import signal
    before = signal.getsignal(signal.SIGTERM)

    def terminated(cfg, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")
    monkeypatch.setattr("dgl_maxk.cli.run_experiment", terminated)
    code, err = run_main(["train", "--config", QUICKSTART, "--out", tmp_path], capsys)
    assert code == 143 and "nothing to resume" in err, err
    assert signal.getsignal(signal.SIGTERM) == before
