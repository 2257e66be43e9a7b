"""The scripts under scripts/ on a CPU: ``--help`` before torch and DGL load, and for bad
input one line ``error: ...`` with the exit status of ``python -m dgl_maxk train`` (2 bad
arguments, configs or files; 3 data; 4 stopped and resumable), never a traceback.

``--help`` and signals run a script in a process of its own; the other cases call the
script's ``main`` in the test's process (the ``script_main`` fixture), where torch and DGL
are loaded already.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (REPO / "scripts").glob("*.py") if not p.stem.startswith("_"))
QUICKSTART = REPO / "configs" / "quickstart.yaml"
CORA = REPO / "configs" / "cora_gcn.yaml"


def script_env(tmp_path) -> dict:
    """The scripts' environment: the repository importable first (then whatever the path
    held: where DGL is installed, on some machines), no data anywhere."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, DGLBACKEND="pytorch", OMP_NUM_THREADS="1",
                PYTHONWARNINGS="ignore", DGL_MAXK_DATA=str(tmp_path / "nodata"))


def command(name: str, *args) -> list:
    return [sys.executable, str(REPO / "scripts" / f"{name}.py"), *map(str, args)]


def run_side_by_side(commands, tmp_path, timeout=120) -> list:
    """The CompletedProcess of each command, run as many at once as there are cores."""
    def run(cmd):
        return subprocess.run(cmd, cwd=REPO, env=script_env(tmp_path), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(run, commands))


class Ran(NamedTuple):
    """A script's run in this process, as :class:`subprocess.CompletedProcess` tells it."""
    args: list
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def script_main(tmp_path, capsys, monkeypatch):
    """``run(name, *args)``: ``python scripts/<name>.py *args`` through the script's ``main``
    in this process, with no data anywhere and ``tmp_path`` as the working directory. An
    uncaught exception fails the test, as a traceback would."""
    monkeypatch.setenv("DGL_MAXK_DATA", str(tmp_path / "nodata"))
    monkeypatch.chdir(tmp_path)

    def run(name, *args):
        args = [str(a) for a in args]
        capsys.readouterr()
        try:
            status = load_script(name).main(args)
        except SystemExit as exit_:
            status = exit_.code
        out, err = capsys.readouterr()
        return Ran([name, *args], status, out, err)
    return run


def assert_error_line(result, status: int, *words):
    """Exit ``status``, stderr opening with one ``error:`` line holding ``words``, and no
    traceback."""
    what = f"{result.args}:\n{result.stderr[-2000:]}"
    assert result.returncode == status, what
    assert "Traceback" not in result.stderr, what
    first, *rest = result.stderr.splitlines() or [""]
    assert first.startswith("error: "), what
    assert not any(line.startswith("error:") for line in rest), what
    assert all(word in first for word in words), what


def imported(importtime_stderr: str) -> list:
    """The top-level packages ``python -X importtime`` reported."""
    return [line.rsplit("|", 1)[1].strip().split(".")[0]
            for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and "|" in line]


def test_every_script_prints_its_help_before_torch_and_dgl_load(tmp_path):
    results = run_side_by_side([[sys.executable, "-X", "importtime", *command(name, "--help")[1:]]
                                for name in SCRIPTS], tmp_path)
    for name, result in zip(SCRIPTS, results):
        assert result.returncode == 0, (name, result.stderr[-2000:])
        assert result.stdout.startswith("usage:"), (name, result.stdout[:500])
        loaded = set(imported(result.stderr))
        assert "argparse" in loaded and not loaded & {"torch", "dgl", "numpy"}, (name, loaded)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_while_a_script_loads_torch_is_one_line(signame, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-X", "importtime",
                             *command("compare_dgl", "--device", "cpu", "--out", out)[1:]],
                            cwd=REPO, env=script_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        for line in proc.stderr:
            if imported(line) == ["torch"]:
                proc.send_signal(getattr(signal, signame))
                break
        else:
            pytest.fail("torch was not imported")
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    said = [line for line in stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143}[signame], said[-20:]
    assert said == ["interrupted before the run started; nothing was measured or written"], said
    assert stdout == "" and not out.exists()


def test_bench_minibatch_refuses_bad_arguments_before_starting(script_main, tmp_path):
    out = tmp_path / "out"
    common = ["--device", "cpu", "--gpus", "1", "--steps", "2", "--nodes", "2000",
              "--out", out]
    cases = [(["--variants", "foo"], "--variants"), (["--batch-size", "0"], "--batch-size"),
             (["--steps", "0"], "--steps"), (["--gpus", "0"], "--gpus"),
             (["--fanouts", "0", "5", "5"], "fanouts"), (["--fanouts", "5", "5"], "fanouts")]
    for args, flag in cases:
        assert_error_line(script_main("bench_minibatch", *common, *args), 2, flag)
    for flag, bad in (("--graph", "products"), ("--feature-memory", "ram")):
        assert_error_line(script_main("bench_minibatch", *common, flag, bad), 2,
                          f"argument {flag}: invalid choice")
    assert not out.exists()


# A worker's failure that the argument checks cannot foresee: the variant is spoilt after
# them. Before, the parent waited for the worker's results for ever.
FAILING_WORKER = """
import sys
sys.path.insert(0, "scripts")
import torch.multiprocessing as mp
import bench_minibatch
sys.argv = ["bench_minibatch.py", "--device", "cpu", "--gpus", "1", "--steps", "1",
            "--nodes", "2000"]
args = bench_minibatch.parse_args()
args.variants = ["maxk-kX"]
bench_minibatch.run_world(mp.get_context("spawn"), 1, args, True, [])
"""


def test_bench_minibatch_worker_failure_ends_the_run(tmp_path):
    result = subprocess.run([sys.executable, "-c", FAILING_WORKER], cwd=REPO,
                            env=script_env(tmp_path), capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "error: process 0 of 1 failed: ValueError" in result.stderr, result.stderr[-2000:]
    assert result.stderr.count("Traceback") == 1, result.stderr[-2000:]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                    reason="watches the worker processes through /proc (Linux)")
def test_bench_minibatch_sigterm_keeps_its_rows_and_stops_its_workers(tmp_path):
    """SIGTERM (a scheduler's) after the first variant: the rows measured so far are written,
    marked interrupted, the status is 143, and the worker is stopped with the parent, long
    before the seven runs it had left would end (the parent would wait for them)."""
    import json
    out = tmp_path / "out"
    proc = subprocess.Popen(command("bench_minibatch", "--device", "cpu", "--gpus", "1",
                                    "--nodes", "100000", "--degree", "8", "--batch-size",
                                    "256", "--steps", "6", "--warmup", "1", "--variants",
                                    "maxk-k8", "relu", "maxk-k16", "maxk-k32", "--out", out),
                            cwd=REPO, env=script_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    workers = []
    try:
        for line in proc.stdout:
            if "seeds/s" in line:  # the first row is in
                break
        workers = [pid for pid in _children(proc.pid) if "resource_tracker" not in
                   Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
        assert workers, "no worker process to watch"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        for pid in [proc.pid] + [pid for pid in workers if _running(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 143, stderr[-2000:]
    assert "the rows measured before it are in" in stderr, stderr[-2000:]
    saved = json.loads((out / "minibatch.json").read_text())
    assert saved["interrupted"] and saved["results"]
    assert all(r["replayed_steps"] == r["captures"] == 0 for r in saved["results"])  # a CPU
    assert (out / "minibatch.md").read_text().startswith("Interrupted")
    assert not [pid for pid in workers if _running(pid)], "a worker outlived the benchmark"


def _children(pid) -> list:
    """The processes whose parent is ``pid`` (from /proc: no pgrep needed)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def _running(pid) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_reproduce_bad_input_is_one_line(script_main, tmp_path):
    out = ["--out", tmp_path / "out", "--device", "cpu"]
    cases = [(["--configs", "nope.yaml"], 2, ["nope.yaml"]),
             (["--configs", QUICKSTART, "--k", "0"], 2, ["--k"]),
             (["--configs", QUICKSTART, "--hidden", "0"], 2, ["--hidden"]),
             (["--configs", QUICKSTART, "--set", "foo=1"], 2, ["foo"]),
             (["--configs", QUICKSTART, "--k", "8", "128"], 2, ["128", "64"]),
             (["--configs", CORA], 3, ["cora"])]
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases += [(["--configs", QUICKSTART, "--out", a_file], 2,
               ["--out", "is a file, not a directory"]),
              # the missing data of the second config stops the run before the first one
              (["--configs", QUICKSTART, CORA, "--out", tmp_path / "two"], 3, ["cora"])]
    for args, status, words in cases:
        assert_error_line(script_main("reproduce", *out, *args), status, *words)
    assert not (tmp_path / "two").exists()


def test_reproduce_reports_each_run_on_its_own_line():
    """Two configs on the same dataset, model and hidden size are two runs: two lines of the
    table (one was dropped), and the mean alone where one seed leaves no std."""
    reproduce = load_script("reproduce")

    def row(config, variant, k, mean, std, n):
        return {"config": config, "dataset": "planted", "model": "sage", "hidden": 64,
                "variant": variant, "k": k, "metric": "accuracy", "mean": mean, "std": std,
                "n": n, "run_dir": f"runs/{config}"}
    rows = [row("full", "relu", None, 0.5, 0.01, 2), row("full", "maxk8", 8, 0.6, 0.02, 2),
            row("sampled", "relu", None, 0.4, None, 1), row("sampled", "maxk8", 8, 0.45, None, 1)]
    table = reproduce.markdown_table(rows, [8], None, "cmd", 60.0, "tf32").splitlines()
    assert "| full | planted | sage | 64 | 50.00 ± 1.00 | 60.00 ± 2.00 (+10.00) |" in table
    assert "| sampled | planted | sage | 64 | 40.00 | 45.00 (+5.00) |" in table


def test_reproduce_ctrl_c_stops_the_run_resumably(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        command("reproduce", "--configs", "configs/quickstart.yaml", "--k", "8", "--seeds",
                "1", "--device", "cpu", "--out", out, "--set", "train.epochs=100000",
                "dataset.params.num_nodes=300"),
        cwd=REPO, env=script_env(tmp_path), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        # the log's header is written once the run handles SIGINT
        while not any("seeds:" in log.read_text() for log in out.glob("runs/*/log.txt")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 4, stderr[-2000:]
    assert "Traceback" not in stderr and "--resume" in stderr, stderr[-2000:]


def test_compare_dgl_bad_input_is_one_line(script_main, tmp_path):
    common = ["--out", tmp_path / "out", "--device", "cpu"]
    cases = [(["--graphs", "nope"], 2, "--graphs"), (["--ks", "0"], 2, "--ks"),
             (["--models", "foo"], 2, "--models"), (["--epochs", "0"], 2, "--epochs"),
             (["--dropout", "2"], 2, "argument --dropout: config key 'model.dropout'"),
             (["--ks", "64", "--hidden", "32"], 2, "argument --ks / --hidden: config key"),
             (["--graphs", "cora"], 3, "cora")]
    for args, status, word in cases:
        assert_error_line(script_main("compare_dgl", *common, *args), status, word)


def test_bench_kernels_bad_input_is_one_line(script_main):
    cases = [(["--device", "foo"], "--device"), (["--ks", "0"], "--ks"),
             (["--ks", "8,300"], "--d 256"), (["--reps", "0"], "--reps"),
             (["--graphs", "nope"], "'nope'"), (["--graphs", "10:x"], "'10:x'")]
    for args, word in cases:
        assert_error_line(script_main("bench_kernels", "--device", "cpu", *args), 2, word)


def test_bench_kernels_sigterm_keeps_what_it_measured(tmp_path):
    """SIGTERM while the second graph is timed: the first graph's rows are printed and
    written, marked interrupted, and the status is 143 (the process used to die with
    nothing written)."""
    import json
    out = tmp_path / "kernels.json"
    proc = subprocess.Popen(command("bench_kernels", "--device", "cpu", "--graphs",
                                    "tiny,200000:4000000", "--ks", "8,16", "--reps", "3",
                                    "--out", out),
                            cwd=REPO, env=script_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("200000:"):  # the first graph is done, the second built
                break
        proc.send_signal(signal.SIGTERM)
        rest, stderr = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode == 143, stderr[-2000:]
    assert f"interrupted; what was measured before it is in {out}" in stderr, stderr[-2000:]
    assert "Interrupted: the graphs and k measured" in rest
    assert "| tiny | 16 |" in rest  # the tables are printed
    saved = json.loads(out.read_text())
    assert saved["interrupted"]
    first = saved["graphs"][0]
    assert first["name"] == "tiny" and sorted(first["k"]) == ["16", "8"]
    assert all(set(first["k"][k]) >= {"fwd_ms", "bwd_ms", "fwd_of_floor"} for k in first["k"])


@functools.cache
def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="these are the answers without a GPU")
def test_without_gpu_the_scripts_say_what_to_run(script_main, tmp_path):
    out = tmp_path / "out"
    bench_minibatch = script_main("bench_minibatch", "--gpus", "1", "--out", out)
    reproduce = script_main("reproduce", "--configs", QUICKSTART, "--device", "cuda",
                            "--out", out)
    compare_dgl = script_main("compare_dgl", "--device", "cuda", "--out", out)
    bench_kernels = script_main("bench_kernels")
    assert_error_line(bench_minibatch, 2, "no CUDA GPU", "--device cpu")
    assert_error_line(reproduce, 2, "--device")
    assert_error_line(compare_dgl, 2, "--device")
    assert not out.exists()
    # bench_kernels names a CPU run that exists and is quick: a tiny graph, a few repeats
    script = load_script("bench_kernels")
    assert bench_kernels.returncode == 2 and "Traceback" not in bench_kernels.stderr
    assert script.CPU_SMOKE_ARGS in bench_kernels.stderr
    args = script.parse_args(script.CPU_SMOKE_ARGS.split())
    _, edges, _ = script.GRAPHS[args.graphs]
    assert args.device == "cpu" and edges <= 100_000 and args.reps <= 5


def test_bench_minibatch_times_dgls_blocks_once_and_scales_like_steps():
    """DGL's blocks run eagerly whatever --cuda-graph says: one arm, not one per mode; and
    "scaling vs 1 GPU" compares like steps only (auto graphs on one GPU, not under DDP)."""
    bench = load_script("bench_minibatch")
    args = bench.parse_args(["--samplers", "device", "dgl", "--cuda-graph", "on", "auto", "off",
                             "--device", "cpu", "--breakdown"])
    assert bench.arms(args) == [("device", "on"), ("device", "auto"), ("device", "off"),
                                ("dgl", "off")]

    def row(step, gpus, seeds_per_s):
        return {"sampler": "device", "cuda_graph": "auto", "step": step, "variant": "maxk-k8",
                "gpus": gpus, "steps": 1, "throughput_seeds_per_s": seeds_per_s,
                "step_ms": 1.0, "epoch_s_estimate": 1.0, "sample_s": 0.0, "copy_s": 0.0,
                "compute_s": 0.0, "features": "device", "peak_gpu_gib": None}
    table = bench.markdown_table([row("graphed", 1, 100.0), row("eager", 2, 150.0),
                                  row("eager", 1, 60.0)], args)
    scaling = [line.split("|")[9].strip() for line in table.splitlines()[4:]]
    assert scaling == ["1.00x", "2.50x", "1.00x"]


def test_bench_minibatch_times_each_pass_and_splits_its_breakdown_pass(script_main, tmp_path):
    """--passes 2: the row's seeds/s is that of both passes together, each pass's (of its own
    seeds and seconds) is in the JSON, and the breakdown pass's own step count."""
    import json
    out = tmp_path / "bm"
    result = script_main("bench_minibatch", "--device", "cpu", "--gpus", "1", "--nodes",
                         "3000", "--degree", "5", "--batch-size", "64", "--steps", "2",
                         "--passes", "2", "--warmup", "0", "--variants", "maxk-k8",
                         "--samplers", "device", "--breakdown", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = json.loads((out / "minibatch.json").read_text())["results"]
    assert (row["steps"], row["breakdown_steps"]) == (4, 2)
    # each pass: 2 batches of 64 seeds, in the seconds that its seeds/s implies
    walls = [128 / rate for rate in row["pass_seeds_per_s"]]
    assert len(walls) == 2 and sum(walls) == pytest.approx(row["wall_s"], rel=1e-9)
    assert row["throughput_seeds_per_s"] == pytest.approx(256 / sum(walls), rel=1e-9)


def test_compare_dgl_records_what_a_paper_needs(script_main, tmp_path):
    """Each arm's epoch range beside its median and the epochs it timed (stock DGL's: a
    third, after one warm-up), and the machine: host, commit, CPU model."""
    import json
    result = script_main("compare_dgl", "--graphs", "small", "--models", "sage", "--ks", "8",
                         "--hidden", "16", "--epochs", "3", "--warmup", "0", "--device", "cpu",
                         "--out", tmp_path / "cmp")
    assert result.returncode == 0, result.stderr[-2000:]
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    env = saved["environment"]
    assert {"host", "git_commit", "cpu", "cpu_count", "precision"} <= set(env)
    assert env["device_name"] == env["cpu"] and env["precision"] == "tf32"
    timed = [r for r in saved["results"] if "epoch_ms" in r]
    assert {r["variant"] for r in timed} >= {"csr-relu", "maxk-k8"}
    for r in timed:
        low, high = r["epoch_ms_range"]
        assert 0 < low <= r["epoch_ms"] <= high
        assert (r["epochs_timed"], r["warmup_epochs"]) == ((1, 1) if r["variant"] == "dgl-relu"
                                                           else (3, 0)), r["variant"]


def test_compare_dgl_interrupted_keeps_what_it_measured(tmp_path, monkeypatch):
    import json
    compare = load_script("compare_dgl")
    args = compare.parse_args(["--graphs", "small", "medium", "--models", "sage", "--device",
                               "cpu", "--out", str(tmp_path / "cmp")])
    graphs = []

    def measured(case, model_name, setup):
        if graphs:  # the second graph: Ctrl-C
            raise KeyboardInterrupt
        graphs.append(case)
        common = {"graph": case, "model": model_name, "epoch_ms_range": [4.0, 6.0],
                  "peak_gib": None, "cuda_graph": False, "device": "cpu", "note": "",
                  "aggregation_ms": 2.0, "aggregation_share": 0.4, "amdahl_limit": 1.67,
                  "plan_ms": 1.0}
        return [{**common, "variant": "csr-relu", "epoch_ms": 5.0},
                {**common, "variant": "maxk-k8", "epoch_ms": 4.0, "speedup": 1.25,
                 "fraction_of_limit": 0.75}]
    monkeypatch.setattr(compare, "load_case", lambda name, setup: name)
    monkeypatch.setattr(compare, "compare_model", measured)
    written = []
    with pytest.raises(KeyboardInterrupt):
        compare.run(args, written)
    assert written == [tmp_path / "cmp" / "compare.json"]
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["interrupted"] and {r["graph"] for r in saved["results"]} == {"small"}
    assert (tmp_path / "cmp" / "compare.md").read_text().startswith("Interrupted")


def test_compare_dgl_gives_every_arm_its_ratio_to_the_baseline_and_explains_the_limit(
        tmp_path, monkeypatch):
    """Each arm after the CSR ReLU baseline, the libraries' included, gets its epoch ratio to
    the baseline in the JSON and the table (as the plot draws it); a MaxK arm above its Amdahl
    limit gets a note on why that can happen."""
    import json
    compare = load_script("compare_dgl")
    args = compare.parse_args(["--graphs", "small", "--models", "sage", "--ks", "8",
                               "--device", "cpu", "--out", str(tmp_path / "cmp")])
    epoch_ms = iter([6.0, 12.0, 5.0])  # in the order the arms run: csr-relu, dgl-relu, maxk

    def timed(*args, **kwargs):
        return compare.Timing(next(epoch_ms), (1.0, 9.0), None, False, 3, 1)
    monkeypatch.setattr(compare, "time_training", timed)
    monkeypatch.setattr(compare, "time_aggregation", lambda *a: 2.0)
    monkeypatch.setattr(compare, "pyg_model", lambda *a: None)  # with PyG installed or not
    compare.run(args)
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    speedup = {r["variant"]: r.get("speedup") for r in saved["results"]}
    assert speedup == {"csr-relu": None, "dgl-relu": 0.5, "maxk-k8": 1.2}, speedup
    table = (tmp_path / "cmp" / "compare.md").read_text()
    cells = [[c.strip() for c in line.split("|")] for line in table.splitlines()
             if line.startswith("| small ")]
    assert {row[3]: row[8] for row in cells} == {"csr-relu": "", "dgl-relu": "0.50x",
                                                 "maxk-k8": "1.20x"}
    assert "Above 100%" not in table
    rows = saved["results"]
    rows[-1].update(speedup=2.0, fraction_of_limit=1.33)
    assert "Above 100% of the limit" in compare.markdown_table(rows, "fp32")


def test_compare_dgl_sigterm_while_writing_waits_for_the_files(tmp_path, monkeypatch, capsys):
    """A SIGTERM that lands while compare_dgl writes its outputs takes effect once all three
    are written and listed, so the run's last line points at whole files (status 143)."""
    import json
    from dgl_maxk.cli import run_command
    compare = load_script("compare_dgl")
    args = compare.parse_args(["--graphs", "small", "--device", "cpu",
                               "--out", str(tmp_path / "cmp")])
    row = {"graph": "small", "model": "sage", "variant": "csr-relu", "epoch_ms": 5.0,
           "peak_gib": None, "cuda_graph": False, "device": "cpu", "amdahl_limit": 1.5}

    def plot_then_terminated(results, path):
        os.kill(os.getpid(), signal.SIGTERM)
        path.write_bytes(b"png")
    monkeypatch.setattr(compare, "plot", plot_then_terminated)
    written = []
    (tmp_path / "cmp").mkdir()
    status = run_command(lambda: compare.write_outputs(tmp_path / "cmp", {}, args, [row],
                                                       written=written),
                         lambda: f"interrupted; written: {written}")
    assert status == 143 and written == [tmp_path / "cmp" / "compare.json"]
    assert json.loads(written[0].read_text())["results"] == [row]
    assert (tmp_path / "cmp" / "compare.png").read_bytes() == b"png"
    assert "compare.json" in capsys.readouterr().err


@pytest.mark.parametrize("matplotlib", ["installed", "missing"])
def test_compare_dgl_lists_only_the_files_it_wrote(matplotlib, tmp_path, monkeypatch, capsys):
    compare = load_script("compare_dgl")
    out = tmp_path / "cmp"
    args = compare.parse_args(["--graphs", "small", "--device", "cpu", "--out", str(out)])
    row = {"graph": "small", "model": "sage", "variant": "csr-relu", "epoch_ms": 5.0,
           "peak_gib": None, "cuda_graph": False, "device": "cpu", "amdahl_limit": 1.5}
    rows = [row, dict(row, variant="maxk-k8", epoch_ms=4.0, speedup=1.25)]
    if matplotlib == "missing":
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # its import raises ImportError
    out.mkdir()
    compare.write_outputs(out, {}, args, rows)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["compare.json", "compare.md"] + (["compare.png"] if matplotlib ==
                                                      "installed" else [])
    (listed,) = [line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("wrote ")]
    assert listed == "wrote " + ", ".join(str(out / name) for name in files)


def test_reproduce_without_matplotlib_writes_and_lists_the_rest(script_main, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # its import raises ImportError
    out = tmp_path / "out"
    result = script_main("reproduce", "--configs", QUICKSTART, "--k", "8", "--seeds", "1",
                         "--device", "cpu", "--out", out, "--set", "train.epochs=2",
                         "dataset.params.num_nodes=300")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "runs"]
    assert f"wrote {out / 'results.md'}, {out / 'results.json'}\n" in result.stdout


def test_reproduce_again_continues_its_runs(script_main, tmp_path):
    """The same command again resumes each run of the same config (nothing retrained, the
    same results); another config is a new run."""
    import json
    out = tmp_path / "out"
    base = ["--configs", QUICKSTART, "--k", "8", "--seeds", "2", "--device", "cpu", "--out",
            out, "--set", "train.epochs=3", "dataset.params.num_nodes=300"]
    first = script_main("reproduce", *base)
    assert first.returncode == 0, first.stderr[-2000:]
    before = json.loads((out / "results.json").read_text())["rows"]
    again = script_main("reproduce", *base)
    assert again.returncode == 0, again.stderr[-2000:]
    (run_dir,) = (out / "runs").iterdir()
    assert f"continuing {run_dir}" in again.stdout
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["variant"], r["mean"]) for r in rows] == [(r["variant"], r["mean"])
                                                          for r in before]
    other = script_main("reproduce", *base, "train.lr=0.02")
    assert other.returncode == 0 and "continuing" not in other.stdout
    assert len(list((out / "runs").iterdir())) == 2


def test_reproduce_skips_run_directories_it_cannot_read(tmp_path):
    reproduce = load_script("reproduce")
    for name, text in (("q-1", b"\xff\xfe not utf-8"), ("q-2", b"- a list"), ("q-3", b"")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_bytes(text)
    (tmp_path / "q-4").mkdir()  # no config.yaml
    assert reproduce.existing_run(tmp_path, {"name": "q"}) is None
