"""First contact: a quiet, offline start-up, ``import dgl`` in either order, ``env``.

Each check runs in a fresh interpreter (``python -c`` / ``python -m dgl_maxk``), where a
user's start-up happens; this checkout comes first on its path.
"""
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import _dgl_maxk_hook
from dgl_maxk import envinfo
from dgl_maxk._dgl import dgl

REPO = Path(__file__).resolve().parents[1]
UNAVAILABLE = _dgl_maxk_hook.unavailable_features(Path(dgl.__file__).parent, torch.__version__)


def fresh_env(tmp_path, **env_updates) -> dict:
    """A fresh interpreter's environment: this checkout first on the path, no inherited
    warning settings, temp files (and OGB/outdated's version-check cache) under
    ``tmp_path``."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONWARNINGS", "PYTHONPYCACHEPREFIX", "DGL_MAXK_BACKEND")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
               TMPDIR=str(tmp_path), CUDA_VISIBLE_DEVICES="", **env_updates)
    return env


def python(args, tmp_path, **env_updates):
    """Run ``python *args`` fresh (:func:`fresh_env`)."""
    return subprocess.run([sys.executable, *args], cwd=tmp_path,
                          env=fresh_env(tmp_path, **env_updates), capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def imported(importtime_stderr: str) -> list:
    """The modules ``python -X importtime`` reported, in the order their imports ended."""
    return [line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and "|" in line]


# --------------------------------------------------------------------------- the first seconds

@pytest.mark.parametrize("command", [["--help"], ["train", "--help"]])
def test_help_loads_neither_torch_nor_dgl(command, tmp_path):
    proc = python(["-X", "importtime", "-m", "dgl_maxk", *command], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: python -m dgl_maxk")
    assert "--config" in proc.stdout or "train" in proc.stdout
    heavy = [m for m in imported(proc.stderr) if m.split(".")[0] in ("torch", "dgl", "numpy")]
    assert heavy == [], heavy[:5]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("loading", ["torch", "dgl"])
def test_a_signal_while_torch_and_dgl_load_is_one_line(loading, signame, tmp_path):
    """Ctrl-C or SIGTERM in a command's first seconds, as soon as the first module of torch
    (of DGL) has loaded: the documented status and one line, whatever the import was doing
    (not a KeyboardInterrupt traceback, an ImportError of a half-loaded NumPy, a silent
    death)."""
    child = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "dgl_maxk", "train", "--config",
         REPO / "configs" / "quickstart.yaml", "--out", tmp_path / "runs"], cwd=tmp_path,
        env=fresh_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    try:
        for line in child.stderr:
            if any(m.startswith(f"{loading}.") for m in imported(line)):
                child.send_signal(getattr(signal, signame))
                break
        else:
            pytest.fail(f"no module of {loading} was imported")
        stdout, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    said = [line for line in stderr.splitlines() if not line.startswith("import time:")]
    assert child.returncode == {"SIGINT": 130, "SIGTERM": 143}[signame], said[-20:]
    assert said == ["interrupted before training started; nothing to resume (run the command "
                    "again)"], said[-20:]
    assert stdout == "" and not (tmp_path / "runs").exists()


def test_a_signal_the_process_ignores_stays_ignored():
    """A background job of a shell ignores SIGINT (the terminal's Ctrl-C is not for it): the
    command line's handlers leave it so."""
    from dgl_maxk.cli_start import handling_signals
    before, term = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    try:
        with handling_signals({signal.SIGINT: signal.default_int_handler,
                               signal.SIGTERM: signal.SIG_IGN}):
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # this one was not
        assert signal.getsignal(signal.SIGTERM) == term
    finally:
        signal.signal(signal.SIGINT, before)


# --------------------------------------------------------------------------- quiet

@pytest.mark.parametrize("action", ["always", "error"])
def test_import_prints_nothing_even_with_every_warning_shown(action, tmp_path):
    """``-W always`` shows every warning not silenced on purpose (a DeprecationWarning too)
    each time it is raised; ``-W error`` turns it into an exception. An empty bytecode cache
    makes Python compile every module as on a fresh install (DGL's invalid escapes warn only
    then). Nothing may be printed."""
    proc = python(["-W", action, "-c", "import dgl_maxk"], tmp_path,
                  PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout == ""


def test_import_keeps_warnings_of_user_code(tmp_path):
    """The silencing is narrow: user code and other libraries still warn as usual."""
    probe = textwrap.dedent("""
        import warnings
        import dgl_maxk
        warnings.warn("a warning of the user's own", UserWarning)
        warnings.warn("invalid escape sequence in user code", SyntaxWarning)
        print(sum(1 for f in warnings.filters if f[0] == "ignore" and f[3] is not None
                  and "dgl" in f[3].pattern))
    """)
    proc = python(["-W", "always", "-c", probe], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "UserWarning: a warning of the user's own" in proc.stderr
    assert "SyntaxWarning: invalid escape sequence in user code" in proc.stderr
    assert proc.stdout.split() == ["0"], "a filter of the DGL import outlived the import"


def test_short_training_run_prints_no_warning(tmp_path):
    proc = python(["-W", "always", "-m", "dgl_maxk", "train",
                   "--config", REPO / "configs" / "quickstart.yaml",
                   "--set", "train.epochs=1", "--seeds", "1", "--no-progress",
                   "--out", tmp_path / "runs"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    noisy = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "warning" in line.lower()]
    assert noisy == [], noisy
    assert "maxk" in proc.stdout and "relu" in proc.stdout  # it did train both variants


# --------------------------------------------------------------------------- offline

NETWORK_PROBE = textwrap.dedent("""
    import json, socket, sys, threading, time

    attempts = []

    def refuse(name):
        def call(*args, **kwargs):
            attempts.append(f"{name}{args[1:2] if name == 'connect' else args[:2]} "
                            f"in thread {threading.current_thread().name}")
            raise OSError(f"test: no network ({name})")
        return call

    socket.socket.connect = refuse("connect")
    socket.socket.connect_ex = refuse("connect_ex")
    socket.create_connection = refuse("create_connection")
    socket.getaddrinfo = refuse("getaddrinfo")

    try:
        import pkg_resources
    except ImportError:  # setuptools >= 81: outdated's check would stop before the network
        import types, packaging.version
        sys.modules["pkg_resources"] = types.SimpleNamespace(
            parse_version=packaging.version.parse)

    import dgl_maxk
    import ogb, ogb.nodeproppred
    {after}
    time.sleep(0.5)  # background threads get to start
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(timeout=10)
    print(json.dumps(attempts))
""")


def test_import_makes_no_network_attempt(tmp_path):
    """OGB (imported by DGL) starts a thread that asks PyPI for its latest version; its cache
    lives in the temp directory, fresh here, so the thread would try the network."""
    proc = python(["-c", NETWORK_PROBE.replace("{after}", "")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
    assert "outdated" not in proc.stderr.lower()


def test_network_probe_sees_a_version_check(tmp_path):
    """The probe can fail: ``outdated``'s own check (started by importing it) is caught."""
    if importlib.util.find_spec("outdated") is None:
        pytest.skip("outdated is not installed")
    proc = python(["-c", NETWORK_PROBE.replace("{after}", "import outdated")], tmp_path,
                  OUTDATED_RAISE_EXCEPTION="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    attempts = json.loads(proc.stdout.splitlines()[-1])
    assert attempts and all("pypi" in a for a in attempts), attempts


# --------------------------------------------------------------------------- import order

ORDER_PROBE = textwrap.dedent("""
    {first}
    import dgl, dgl_maxk, torch
    g = dgl.add_self_loop(dgl.rand_graph(30, 90))
    y = dgl_maxk.nn.SAGEConv(8, 4, "mean", k=2)(g, torch.randn(30, 8))
    print(tuple(y.shape))
""")


def test_import_dgl_maxk_then_dgl(tmp_path):
    proc = python(["-c", ORDER_PROBE.format(first="import dgl_maxk")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(30,", "4)"]


@pytest.mark.skipif(not UNAVAILABLE, reason="DGL has its libraries for this torch: "
                                            "`import dgl` works without the hook")
def test_import_dgl_first_through_the_hook_file(tmp_path):
    """What site does with dgl_maxk_hook.pth at start-up (``site.addsitedir`` on a folder
    holding a copy of it), then ``import dgl`` before dgl_maxk."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(REPO / "dgl_maxk_hook.pth", site_dir)
    first = f"import site; site.addsitedir({str(site_dir)!r}); import dgl"
    proc = python(["-c", ORDER_PROBE.format(first=first)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(30,", "4)"]
    without = python(["-c", "import dgl"], tmp_path)
    if envinfo.collect()["startup_hook"] is None:  # the probe above needed the hook file
        assert "graphbolt" in without.stderr


def test_import_dgl_first_in_this_interpreter(tmp_path):
    """A plain ``import dgl`` first, as a user's script does: needs dgl_maxk installed with
    pip (which puts dgl_maxk_hook.pth into site-packages) in the interpreter running the
    tests, or DGL's libraries for this torch."""
    hook = envinfo.collect()["startup_hook"]
    if UNAVAILABLE and hook is None:
        pytest.skip("dgl_maxk_hook.pth is not in this interpreter's site-packages (install "
                    "dgl_maxk with `pip install -e .` or `pip install .` to test it)")
    proc = python(["-c", ORDER_PROBE.format(first="import dgl")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(30,", "4)"]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # torchdata's banner too


def test_hook_file_imports_nothing_heavy(tmp_path):
    """The .pth line runs at every start-up: it may import the standard library only."""
    line = (REPO / "dgl_maxk_hook.pth").read_text().strip()
    assert line.startswith("import ") and "\n" not in line
    probe = f"import sys; {line}; print(sorted(m for m in ('torch', 'dgl', 'dgl_maxk', " \
            "'numpy') if m in sys.modules))"
    proc = python(["-c", probe], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[]"]


# --------------------------------------------------------------------------- the finder

@pytest.mark.parametrize("module", ["dgl.graphbolt", "dgl.sparse"])
def test_finder_acts_only_when_the_library_is_missing(module, tmp_path):
    finder = _dgl_maxk_hook.DGLLibraryFinder()
    fake_dgl = tmp_path / "dgl"
    library = Path(_dgl_maxk_hook.library_file(fake_dgl, module, torch.__version__))
    library.parent.mkdir(parents=True)
    (fake_dgl / module.split(".")[1]).mkdir(exist_ok=True)
    (fake_dgl / module.split(".")[1] / "__init__.py").touch()
    (fake_dgl / "graphbolt").mkdir(exist_ok=True)  # a graphbolt loader the finder knows
    shutil.copy(Path(dgl.__file__).parent / "graphbolt" / "__init__.py", fake_dgl / "graphbolt")
    spec = finder.find_spec(module, [str(fake_dgl)])
    assert spec is not None and spec.origin.startswith(str(fake_dgl))
    library.touch()
    assert finder.find_spec(module, [str(fake_dgl)]) is None
    assert finder.find_spec("dgl.nn", [str(Path(dgl.__file__).parent)]) is None
    assert (finder.find_spec(module, [str(Path(dgl.__file__).parent)]) is None) == (
        module not in UNAVAILABLE)


@pytest.mark.skipif("dgl.sparse" not in UNAVAILABLE, reason="DGL has dgl_sparse for this torch")
def test_dgl_sparse_fails_naming_the_cause():
    with pytest.raises(ImportError, match=r"dgl\.sparse is unavailable: DGL .* no dgl_sparse "
                                          r"library for torch .*it ships one for torch"):
        importlib.import_module("dgl.sparse")
    with pytest.raises(_dgl_maxk_hook.MissingDGLLibrary, match="dgl.sparse"):
        dgl.rand_graph(5, 10).adj()  # DGL imports dgl.sparse here


@pytest.mark.skipif("dgl.graphbolt" not in UNAVAILABLE, reason="DGL has graphbolt for this torch")
def test_graphbolt_operators_fail_naming_the_cause():
    import dgl.graphbolt as gb
    with pytest.raises(_dgl_maxk_hook.MissingDGLLibrary,
                       match=r"torch\.ops\.graphbolt\.isin is unavailable: DGL .* no graphbolt"):
        gb.isin(torch.tensor([1, 2]), torch.tensor([2]))
    assert not hasattr(torch.ops.graphbolt, "__wrapped__")  # protocol probes still work
    assert gb.ItemSet(torch.arange(4), names="seeds")  # the pure-Python part works


# --------------------------------------------------------------------------- env

def test_env_command_prints_the_report(tmp_path):
    proc = python(["-m", "dgl_maxk", "env"], tmp_path, DGL_MAXK_BACKEND="torch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    report = proc.stdout
    assert f"torch {torch.__version__}, dgl {dgl.__version__}" in report
    assert "CUDA: not available" in report and "CuPy: " in report
    assert "DGL_MAXK_BACKEND=torch -> CUDA tensors use the pure-torch path" in report
    for module, reason in UNAVAILABLE.items():
        assert f"{module}: {reason}" in report
    proc = python(["-m", "dgl_maxk", "env", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout)
    assert info["torch"] == torch.__version__ and info["dgl_unavailable"] == UNAVAILABLE
    assert info["cuda"]["available"] is False and info["environment"]["DGLBACKEND"] == "pytorch"


def test_collect_is_json_and_reports_a_missing_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # CuPy not installed
    info = envinfo.collect(device="cpu")
    assert json.loads(json.dumps(info)) == info
    assert info["cuda"]["device"] == "cpu"
    assert info["cupy"]["installed"] is False and info["cupy"]["usable"] is False
    assert info["torch_threads"] == torch.get_num_threads()
    assert "CuPy: missing, not usable: not installed" in envinfo.format_report(info)
