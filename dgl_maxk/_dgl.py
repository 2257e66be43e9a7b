"""The one place dgl_maxk imports DGL.

dgl 2.1.0 (the newest DGL on the package index) ships its graphbolt library only for torch
2.0-2.2, and ``dgl/graphbolt/__init__.py`` loads it unconditionally, so ``import dgl`` fails on
any newer torch. When (and only when) the library for the running torch is missing, this module
imports ``dgl.graphbolt`` without that load; DGL's core (graphs, nn, sampling, DataLoader,
datasets) works as usual and only GraphBolt's C++ sampling and ``dgl.sparse`` are unavailable.
Every other module of dgl_maxk gets DGL from here.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import warnings
from pathlib import Path

import torch

# DGL otherwise asks for a backend and writes ~/.dgl/config.json on first import.
os.environ.setdefault("DGLBACKEND", "pytorch")


def _graphbolt_library_missing() -> bool:
    spec = importlib.util.find_spec("dgl")
    if spec is None or spec.origin is None:
        return False
    version = torch.__version__.split("+", maxsplit=1)[0]
    return not (Path(spec.origin).parent / "graphbolt" /
                f"libgraphbolt_pytorch_{version}.so").exists()


class _GraphboltWithoutLibrary(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports dgl.graphbolt with its module-level ``load_graphbolt()`` call removed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "dgl.graphbolt":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            spec.loader = self
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        origin = module.__spec__.origin
        source = Path(origin).read_text()
        source = re.sub(r"^load_graphbolt\(\)\s*$", "", source, flags=re.MULTILINE)
        exec(compile(source, origin, "exec"), module.__dict__)


def _import_dgl():
    with warnings.catch_warnings():
        # dgl imports torchdata.datapipes, whose deprecation banner says nothing to a DGL user.
        warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2'")
        import dgl
    return dgl


GRAPHBOLT_PATCHED = "dgl" not in sys.modules and _graphbolt_library_missing()
if GRAPHBOLT_PATCHED:
    _finder = _GraphboltWithoutLibrary()
    sys.meta_path.insert(0, _finder)
    try:
        dgl = _import_dgl()
    finally:
        sys.meta_path.remove(_finder)
    warnings.warn(
        f"dgl_maxk: DGL {dgl.__version__} has no graphbolt library for torch "
        f"{torch.__version__}; GraphBolt C++ sampling and dgl.sparse are unavailable "
        "(graphs, dgl.nn, neighbour sampling and DataLoader work).", stacklevel=2)
else:
    dgl = _import_dgl()

from dgl import DGLError  # noqa: E402,F401

__all__ = ["dgl", "DGLError", "GRAPHBOLT_PATCHED"]
