"""Installing dgl_maxk's layers in place of DGL's, and what ``import dgl_maxk`` does."""
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import _dgl_maxk_hook
import dgl_maxk
import dgl_maxk.nn
from dgl_maxk._dgl import dgl

LAYERS = ("SAGEConv", "GraphConv", "GINConv")
NAMESPACES = ("dgl.nn", "dgl.nn.pytorch", "dgl.nn.pytorch.conv")
REPO = Path(__file__).resolve().parents[1]


def namespace(name):
    module = dgl
    for part in name.split(".")[1:]:
        module = getattr(module, part)
    return module


@pytest.fixture(autouse=True)
def clean_install():
    """Every test starts and ends with DGL's own classes in place."""
    dgl_maxk.uninstall()
    originals = {(ns, name): getattr(namespace(ns), name) for ns in NAMESPACES
                 for name in LAYERS}
    for (ns, name), cls in originals.items():
        assert cls.__module__.startswith("dgl."), f"{ns}.{name} is {cls} before the test"
    yield originals
    dgl_maxk.uninstall()
    for (ns, name), cls in originals.items():
        assert getattr(namespace(ns), name) is cls, f"{ns}.{name} not restored"


def build_all():
    """Layers as existing DGL code builds them (names looked up at call time)."""
    return {
        "SAGEConv": dgl.nn.SAGEConv(64, 8, "mean"),
        "GraphConv": dgl.nn.pytorch.GraphConv(64, 8),
        "GINConv": dgl.nn.pytorch.conv.GINConv(torch.nn.Linear(64, 8), "sum"),
    }


def assert_installed(k):
    assert dgl_maxk.is_installed()
    for ns in NAMESPACES:
        for name in LAYERS:
            assert getattr(namespace(ns), name) is getattr(dgl_maxk.nn, name), (ns, name)
    for name, conv in build_all().items():
        assert isinstance(conv, getattr(dgl_maxk.nn, name)), name
        assert conv.k == k, name


def assert_uninstalled(originals):
    assert not dgl_maxk.is_installed()
    for (ns, name), cls in originals.items():
        assert getattr(namespace(ns), name) is cls, (ns, name)
    for name, conv in build_all().items():
        assert type(conv) is originals[("dgl.nn", name)], name
        assert not hasattr(conv, "k")
    # dgl_maxk's own classes are dense by default again
    assert dgl_maxk.nn.SAGEConv(16, 8, "mean").k is None
    assert dgl_maxk.nn.GraphConv(16, 8).k is None
    assert dgl_maxk.nn.GINConv(None, "sum").k is None


def test_install_and_uninstall(clean_install):
    dgl_maxk.install(k=8)
    assert_installed(8)
    # the replacements are still DGL layers (isinstance checks in user code keep working)
    for name in LAYERS:
        assert issubclass(getattr(dgl.nn, name), clean_install[("dgl.nn", name)])
    from dgl.nn import SAGEConv  # a name bound after install gets ours
    assert SAGEConv is dgl_maxk.nn.SAGEConv
    dgl_maxk.uninstall()
    assert_uninstalled(clean_install)
    dgl_maxk.uninstall()  # a no-op the second time
    assert_uninstalled(clean_install)


def test_explicit_k_wins_over_installed_k():
    dgl_maxk.install(k=8)
    assert dgl.nn.SAGEConv(16, 8, "gcn", k=4).k == 4
    assert dgl.nn.GraphConv(16, 8, k=None).k is None  # k=None keeps a layer dense
    assert dgl.nn.GINConv(None, "mean", k=2).k == 2


def test_installed_k_leaves_dense_only_aggregators_dense():
    dgl_maxk.install(k=4)
    g = dgl.add_self_loop(dgl.rand_graph(10, 20))
    x = torch.randn(10, 16)
    for conv in (dgl.nn.SAGEConv(16, 8, "pool"), dgl.nn.SAGEConv(16, 8, "lstm"),
                 dgl.nn.GINConv(torch.nn.Linear(16, 8), "max")):
        assert conv.k is None
        assert conv(g, x).shape == (10, 8)


def test_installed_k_leaves_layers_no_wider_than_k_dense():
    dgl_maxk.install(k=16)
    g = dgl.add_self_loop(dgl.rand_graph(10, 20))
    x = torch.randn(10, 8)
    for conv in (dgl.nn.SAGEConv(8, 4, "mean"), dgl.nn.GraphConv(16, 4),
                 dgl.nn.SAGEConv(16, 4, "gcn")):
        assert conv.k is None  # MaxK would keep every entry: the layer stays dense
    assert dgl.nn.GraphConv(17, 4).k == 16
    assert dgl.nn.SAGEConv(8, 4, "mean")(g, x).shape == (10, 4)
    with pytest.raises(ValueError, match="exceeds"):
        dgl.nn.SAGEConv(8, 4, "mean", k=9)  # an explicit k is never adjusted


def test_installed_k_leaves_layers_wider_than_cbsr_dense():
    """CBSR indexes at most MAX_WIDTH columns: existing code with wider inputs keeps working
    (dense) under install(k), at construction and, for GIN, at forward."""
    width = dgl_maxk.sparse.MAX_WIDTH + 1
    g = dgl.add_self_loop(dgl.rand_graph(6, 12))
    x = torch.randn(6, width)
    with dgl_maxk.installed(k=4):
        convs = (dgl.nn.SAGEConv(width, 2, "mean"), dgl.nn.GraphConv(width, 2),
                 dgl.nn.SAGEConv((8, width), 2, "mean"))
        assert all(conv.k is None for conv in convs)
        assert dgl.nn.GraphConv(8, 2).k == 4
        gin = dgl.nn.GINConv(torch.nn.Linear(width, 2), "sum")
        assert gin.k == 4 and gin(g, x).shape == (6, 2)
    with pytest.raises(ValueError, match="at most"):
        dgl_maxk.nn.GraphConv(width, 2, k=4)  # an explicit k is never adjusted


def test_numpy_integer_k_is_accepted():
    k = np.int64(3)
    assert dgl_maxk.nn.GraphConv(8, 4, k=k).k == 3
    assert dgl_maxk.maxk(torch.randn(5, 8), k).k == 3


def test_install_replaces_in_effect(h):
    """Code written for DGL computes the MaxK layer once installed."""
    g = dgl.add_self_loop(h.random_graph(20, 60))
    x = torch.randn(20, 16, dtype=torch.float64)
    stock = dgl.nn.SAGEConv(16, 8, "mean").double()
    with dgl_maxk.installed(k=3):
        conv = dgl.nn.SAGEConv(16, 8, "mean").double()
    conv.load_state_dict(stock.state_dict())
    expected = stock(g, dgl_maxk.maxk(x, 3).to_dense())
    torch.testing.assert_close(conv(g, x), expected, rtol=0, atol=1e-10)


def test_install_twice_then_uninstall_restores_dgl(clean_install):
    dgl_maxk.install(k=8)
    dgl_maxk.install(k=4)
    assert_installed(4)
    dgl_maxk.uninstall()
    assert_uninstalled(clean_install)


def test_install_some_layers_only(clean_install):
    dgl_maxk.install(k=4, layers=["GraphConv"])
    assert dgl.nn.GraphConv is dgl_maxk.nn.GraphConv
    assert dgl.nn.SAGEConv is clean_install[("dgl.nn", "SAGEConv")]
    assert dgl.nn.GraphConv(16, 8).k == 4
    dgl_maxk.uninstall()
    assert_uninstalled(clean_install)


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=0), "k"), (dict(k=-2), "k"), (dict(k=2.5), "k"), (dict(k="8"), "k"),
    (dict(k=4, layers=["GATConv"]), "GATConv"),
])
def test_install_rejects_bad_arguments(kwargs, match, clean_install):
    with pytest.raises(ValueError, match=match):
        dgl_maxk.install(**kwargs)
    assert_uninstalled(clean_install)


def test_installed_context_manager(clean_install):
    with dgl_maxk.installed(k=16):
        assert_installed(16)
    assert_uninstalled(clean_install)


def test_installed_restores_on_exception(clean_install):
    class Boom(Exception):
        pass
    with pytest.raises(Boom):
        with dgl_maxk.installed(k=16):
            assert_installed(16)
            raise Boom()
    assert_uninstalled(clean_install)


def test_installed_nested_restores_the_outer_install(clean_install):
    dgl_maxk.install(k=32)
    with pytest.raises(RuntimeError):
        with dgl_maxk.installed(k=16):
            assert_installed(16)
            raise RuntimeError("inner")
    assert_installed(32)
    with dgl_maxk.installed(k=8):
        assert_installed(8)
    assert_installed(32)
    dgl_maxk.uninstall()
    assert_uninstalled(clean_install)


def test_install_names_the_module_globals_that_still_hold_dgls_class(clean_install):
    """A module that bound DGL's class before install keeps building DGL's layer: install
    warns with each such global (module.name) once, also under a second name of the same
    module, for the layers it replaces only; odd sys.modules entries (None, a non-module, a
    lazy module whose attribute hooks raise) neither stop it nor run."""
    import types

    class Lazy(types.ModuleType):
        def __getattr__(self, name):
            raise ImportError("a lazy module imported on first use")

        @property
        def __dict__(self):
            raise ImportError("a lazy module imported on first use")
    early = types.ModuleType("early_model_code")
    early.GraphConv = clean_install[("dgl.nn", "GraphConv")]
    early.Conv = clean_install[("dgl.nn", "GINConv")]
    odd = {early.__name__: early, "early_alias": early, "odd_none": None,
           "odd_object": object(), "odd_lazy": Lazy("odd_lazy")}
    sys.modules.update(odd)
    try:
        with pytest.warns(UserWarning, match="early_model_code.GraphConv") as caught:
            dgl_maxk.install(8)
        message = str(caught[0].message)
        assert "early_model_code.Conv" in message and "early_alias" not in message
        assert caught[0].filename == __file__  # the warning points at the caller
        assert dgl_maxk.is_installed()
        dgl_maxk.uninstall()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with dgl_maxk.installed(8, layers=["SAGEConv"]):
                pass
        assert not any("early_model_code" in str(w.message) for w in caught)
        with pytest.warns(UserWarning, match="early_model_code.GraphConv") as caught:
            with dgl_maxk.installed(8, layers=["GraphConv"]):
                pass
        assert caught[0].filename == __file__
    finally:
        for name in odd:
            del sys.modules[name]


# --------------------------------------------------------------------------- import

IMPORT_PROBE = textwrap.dedent("""
    import json, os, socket, sys, warnings

    sys.modules["cupy"] = None  # CuPy missing: "import cupy" raises ImportError

    def no_network(*args, **kwargs):
        raise OSError("dgl_maxk tried to use the network")
    socket.socket.connect = no_network
    socket.create_connection = no_network

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import dgl_maxk
        import dgl_maxk.nn, dgl_maxk.models, dgl_maxk.ops, dgl_maxk.patch
        import dgl
        import torch
        # use it a little: a plan, an operator, a layer (all on the CPU)
        g = dgl.add_self_loop(dgl.rand_graph(20, 40))
        y = dgl_maxk.nn.SAGEConv(8, 4, "mean", k=2)(g, torch.randn(20, 8))
        y.sum().backward()
        with dgl_maxk.installed(k=2):
            dgl.nn.GraphConv(8, 4)
    print(json.dumps({
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "cuda": torch.cuda.is_available(),
        "backend": dgl_maxk.backends.for_tensor(torch.zeros(1)).__name__,
        "cupy": repr(sys.modules.get("cupy", "absent")),
        "dglbackend": os.environ.get("DGLBACKEND"),
    }))
""")


def test_import_needs_no_gpu_cupy_network_or_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("XDG_", "DGL", "TORCH_HOME", "CUDA_VISIBLE"))}
    env.update(HOME=str(home), CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cuda"] is False
    assert report["backend"] == "dgl_maxk.backends.reference"
    assert report["cupy"] == "None", "the missing CuPy must not be replaced by a real import"
    graphbolt = [w for w in report["warnings"] if "graphbolt" in w.lower()]
    assert len(graphbolt) <= 1, graphbolt
    others = [w for w in report["warnings"] if "graphbolt" not in w.lower()]
    assert not [w for w in others if "dgl_maxk" in w], others
    assert report["dglbackend"] == "pytorch"
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert written == [], f"import dgl_maxk wrote into HOME: {written}"
    assert "Traceback" not in proc.stderr


FILES_PROBE = textwrap.dedent("""
    import os
    from dgl_maxk._dgl import dgl
    import dgl.backend, dgl.data.utils
    del os.environ["DGLBACKEND"]
    dgl.backend.get_preferred_backend()  # DGL without a backend writes its config
    dgl.data.utils.get_download_dir()  # the datasets' default folder
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot  # the font cache
""")


def test_the_suite_keeps_dgl_and_matplotlib_files_out_of_home(tmp_path):
    """What DGL and matplotlib write for a test, in its process or a subprocess (pytest-xdist's
    workers included), goes into the folder conftest.py sets aside for the run."""
    home = tmp_path / "home"
    home.mkdir()
    # without XDG_*, HOME is where matplotlib would write
    env = {key: value for key, value in os.environ.items() if not key.startswith("XDG_")}
    env.update(HOME=str(home),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", FILES_PROBE], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    scratch = Path(os.environ["DGL_MAXK_TEST_SCRATCH"])
    assert Path(os.environ["DGLDEFAULTDIR"], "config.json").is_file()
    assert Path(os.environ["DGL_DOWNLOAD_DIR"]).is_dir()
    assert list(Path(os.environ["MPLCONFIGDIR"]).glob("fontlist-*.json"))
    assert all(Path(os.environ[name]).is_relative_to(scratch)
               for name in ("DGLDEFAULTDIR", "DGL_DOWNLOAD_DIR", "MPLCONFIGDIR"))


# --------------------------------------------------------------------------- start-up hook

def _finders():
    return [f for f in sys.meta_path if isinstance(f, _dgl_maxk_hook.DGLLibraryFinder)]


@pytest.mark.parametrize("value, installs", [(None, True), ("", True), ("0", True),
                                             ("1", False), ("yes", False)])
def test_hook_file_does_nothing_when_turned_off(value, installs, monkeypatch):
    """dgl_maxk_hook.pth's line, run as site runs it at start-up, installs the finder unless
    DGL_MAXK_NO_HOOK is set; ``import dgl_maxk`` installs it either way (it needs it)."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f not in _finders()])
    if value is None:
        monkeypatch.delenv("DGL_MAXK_NO_HOOK", raising=False)
    else:
        monkeypatch.setenv("DGL_MAXK_NO_HOOK", value)
    exec((REPO / "dgl_maxk_hook.pth").read_text(), {})
    assert len(_finders()) == int(installs)
    _dgl_maxk_hook.install()
    assert len(_finders()) == 1


def fake_dgl(root: Path, graphbolt_source: bytes) -> Path:
    """A DGL package folder without native libraries: graphbolt's and sparse's sources."""
    for name, source in (("graphbolt", graphbolt_source), ("sparse", b"")):
        (root / "dgl" / name).mkdir(parents=True)
        (root / "dgl" / name / "__init__.py").write_bytes(source)
    return root / "dgl"


@pytest.mark.parametrize("module", ["dgl.graphbolt", "dgl.sparse"])
def test_finder_leaves_a_dgl_with_an_unknown_graphbolt_loader_alone(module, tmp_path):
    """The finder changes DGL's imports only where DGL's graphbolt loader is one it knows
    (the installed DGL's, here): a changed one is left to DGL's own import."""
    installed = Path(dgl.__file__).parent
    assert _dgl_maxk_hook.known_graphbolt_loader(installed), "the DGL these tests run on"
    source = (installed / "graphbolt" / "__init__.py").read_bytes()
    finder = _dgl_maxk_hook.DGLLibraryFinder()
    known = fake_dgl(tmp_path / "known", source)
    spec = finder.find_spec(module, [str(known)])
    assert spec is not None and isinstance(spec.loader, _dgl_maxk_hook._MissingLibraryLoader)
    changed = fake_dgl(tmp_path / "changed", source.replace(b"load_graphbolt()\n",
                                                            b"load_graphbolt()  # v2\n"))
    assert finder.find_spec(module, [str(changed)]) is None
    assert not _dgl_maxk_hook.known_graphbolt_loader(tmp_path / "absent")
