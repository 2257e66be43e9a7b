"""dgl_maxk's fix for DGL's missing native libraries, shared by ``import dgl_maxk`` and the
start-up hook ``dgl_maxk_hook.pth``.

dgl 2.1.0 (the newest DGL on the package index) ships its graphbolt and dgl_sparse libraries
only for torch 2.0-2.2, and ``dgl/graphbolt/__init__.py`` loads its library unconditionally,
so ``import dgl`` fails on any newer torch. :class:`DGLLibraryFinder` changes two imports, and
only when DGL's library for the running torch is missing and the installed
``dgl/graphbolt/__init__.py`` is one it knows (:data:`KNOWN_GRAPHBOLT_LOADERS`; any other DGL
is left alone):

* ``dgl.graphbolt`` is imported without its module-level ``load_graphbolt()`` call. DGL's core
  (graphs, dgl.nn, neighbour sampling, DataLoader, datasets) then works as usual; a call of one
  of GraphBolt's C++ operators raises :class:`MissingDGLLibrary` naming the cause.
* ``import dgl.sparse`` raises :class:`MissingDGLLibrary` naming the cause.

``dgl_maxk/_dgl.py`` installs the finder before it imports DGL; ``dgl_maxk_hook.pth``, which
pip puts into site-packages with dgl_maxk, installs it at interpreter start-up
(:func:`install_at_startup`; ``DGL_MAXK_NO_HOOK=1`` turns that off), so that a script may
``import dgl`` before ``dgl_maxk``. So this module imports only the standard library (it runs
at every start-up of the environment), and whether a library is missing is only looked at
when DGL imports one of the two modules (torch is loaded by then).
"""
import importlib.machinery
import os
import sys
import warnings

# module -> (folder inside DGL's package, library name stem), as DGL's loaders spell them
_LIBRARIES = {"dgl.graphbolt": ("graphbolt", "graphbolt_pytorch"),
              "dgl.sparse": ("dgl_sparse", "dgl_sparse_pytorch")}

#: SHA-256 of the ``dgl/graphbolt/__init__.py`` files the finder knows how to import without
#: their library (one module-level ``load_graphbolt()`` call, which it leaves out).
KNOWN_GRAPHBOLT_LOADERS = {
    "74b428ef410df40e8a2784853351fa15a6a87f83b6ab212c3acf4455e74922ac": "dgl 2.1.0",
}

#: Set to anything but "" or "0" to make dgl_maxk_hook.pth do nothing at start-up.
NO_HOOK_VARIABLE = "DGL_MAXK_NO_HOOK"


#: torchdata's deprecation banner for torchdata.datapipes, which DGL's graphbolt imports: it
#: says nothing to a DGL user, so it is silenced (only) while graphbolt is imported.
TORCHDATA_BANNER = dict(
    category=UserWarning, module=r"torchdata(\.|$)",
    message=r"\s*#+\s*WARNING!\s*The 'datapipes', 'dataloader2' modules are deprecated")


class MissingDGLLibrary(ImportError):
    """A DGL feature whose native library does not exist for the running torch."""


def library_file(dgl_dir, module: str, torch_version: str) -> str:
    """Where DGL looks for the library of ``module`` ("dgl.graphbolt" or "dgl.sparse")."""
    folder, stem = _LIBRARIES[module]
    version = torch_version.split("+", maxsplit=1)[0]
    if sys.platform.startswith("win"):
        name = f"{stem}_{version}.dll"
    else:
        name = f"lib{stem}_{version}.{'dylib' if sys.platform == 'darwin' else 'so'}"
    return os.path.join(dgl_dir, folder, name)


def missing_library_reason(dgl_dir, module: str, torch_version: str):
    """Why ``module`` is unavailable under this torch, or None when its library is there."""
    if os.path.exists(library_file(dgl_dir, module, torch_version)):
        return None
    folder, pattern = os.path.split(library_file(dgl_dir, module, "*"))
    prefix, suffix = pattern.split("*")
    shipped = sorted(name[len(prefix):-len(suffix)]
                     for name in (os.listdir(folder) if os.path.isdir(folder) else [])
                     if name.startswith(prefix) and name.endswith(suffix))
    dgl_version = getattr(sys.modules.get("dgl"), "__version__", "")
    return (f"DGL {dgl_version} has no {_LIBRARIES[module][0]} library for torch "
            f"{torch_version} (it ships one for torch {', '.join(shipped) or 'no version'}); "
            f"install one of those torch versions, or a DGL built for torch {torch_version}, "
            f"to use {module}")


def unavailable_features(dgl_dir, torch_version: str) -> dict:
    """{module: why it is unavailable} for dgl.graphbolt and dgl.sparse under this torch."""
    reasons = {module: missing_library_reason(dgl_dir, module, torch_version)
               for module in _LIBRARIES}
    return {module: reason for module, reason in reasons.items() if reason is not None}


def known_graphbolt_loader(dgl_dir) -> bool:
    """Whether ``dgl_dir``/graphbolt/__init__.py is one of :data:`KNOWN_GRAPHBOLT_LOADERS`."""
    import hashlib  # here, not at every interpreter start: its import takes about 4 ms
    try:
        with open(os.path.join(dgl_dir, "graphbolt", "__init__.py"), "rb") as file:
            digest = hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return False
    return digest in KNOWN_GRAPHBOLT_LOADERS


def install():
    """Put :class:`DGLLibraryFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, DGLLibraryFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, DGLLibraryFinder())


def install_at_startup():
    """What dgl_maxk_hook.pth runs at every interpreter start: :func:`install`, unless the
    environment variable ``DGL_MAXK_NO_HOOK`` is set (to anything but "" or "0")."""
    if os.environ.get(NO_HOOK_VARIABLE, "") in ("", "0"):
        install()


class DGLLibraryFinder:  # an importlib.abc.MetaPathFinder (importing that costs ~15 ms)
    """Finds dgl.graphbolt and dgl.sparse when their library is missing, in a DGL whose
    graphbolt loader it knows; nothing else."""

    def find_spec(self, fullname, path, target=None):
        torch = sys.modules.get("torch")
        if fullname not in _LIBRARIES or torch is None or not path:
            return None
        if (os.path.exists(library_file(path[0], fullname, torch.__version__))
                or not known_graphbolt_loader(path[0])):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            loader = _GraphboltWithoutLibrary if fullname == "dgl.graphbolt" else _Unavailable
            spec.loader = loader(path[0], torch.__version__)
        return spec


class _MissingLibraryLoader:  # an importlib.abc.Loader
    def __init__(self, dgl_dir, torch_version: str):
        self.dgl_dir = dgl_dir
        self.torch_version = torch_version

    def create_module(self, spec):
        return None

    def reason(self, module: str) -> str:
        # asked only when an error is raised: DGL is fully imported then (its version known)
        return missing_library_reason(self.dgl_dir, module, self.torch_version)


class _GraphboltWithoutLibrary(_MissingLibraryLoader):
    """Runs dgl/graphbolt/__init__.py without its ``load_graphbolt()`` call, and makes the
    missing operators fail with the reason (instead of an AttributeError of torch.ops)."""

    def exec_module(self, module):
        origin = module.__spec__.origin
        with open(origin, encoding="utf-8") as file:
            lines = [line for line in file if line.strip() != "load_graphbolt()"]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", **TORCHDATA_BANNER)
            exec(compile("".join(lines), origin, "exec"), module.__dict__)
        ops = sys.modules["torch"].ops
        ops.graphbolt = _GraphboltOps(ops.graphbolt, lambda: self.reason(module.__name__))


class _GraphboltOps:
    """``torch.ops.graphbolt`` without DGL's library: an operator registered by other means is
    still found; any other name raises MissingDGLLibrary with the reason."""

    def __init__(self, namespace, reason):
        self._namespace = namespace
        self._reason = reason  # a function: the text needs DGL's version, known later

    def __getattr__(self, name):
        if name.startswith("_"):  # no operator: protocol probes (copy, inspect), own fields
            raise AttributeError(name)
        try:
            return getattr(self._namespace, name)
        except AttributeError:
            raise MissingDGLLibrary(f"torch.ops.graphbolt.{name} is unavailable: "
                                    f"{self._reason()}") from None


class _Unavailable(_MissingLibraryLoader):
    """Fails the import with the reason (DGL would raise a bare FileNotFoundError)."""

    def exec_module(self, module):
        raise MissingDGLLibrary(f"{module.__name__} is unavailable: "
                                f"{self.reason(module.__name__)}")
