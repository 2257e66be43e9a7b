"""The one place dgl_maxk imports DGL: quietly, offline, and on any torch.

* DGL's missing native libraries (graphbolt, dgl_sparse on torch > 2.2): the finder of
  ``_dgl_maxk_hook`` (shared with the start-up hook) imports DGL without them; using one of
  those features raises an error that names the cause. ``python -m dgl_maxk env`` lists them.
* Warnings that DGL's import raises from third-party code, and that say nothing to a dgl_maxk
  user, are silenced here, narrowly (category, message and module), and only during the import.
* No network: OGB (which DGL imports) starts a thread at import that asks PyPI for its latest
  version, through the package ``outdated``; ogb skips the check when ``outdated`` cannot be
  imported, so it cannot be while DGL is imported here (afterwards it can again).

Every other module of dgl_maxk gets DGL from here.
"""
import os
import sys
import warnings
from contextlib import contextmanager

import _dgl_maxk_hook

# DGL otherwise asks for a backend and writes ~/.dgl/config.json on first import.
os.environ.setdefault("DGLBACKEND", "pytorch")

_DGL_SOURCE = r".*[\\/]dgl[\\/]"
_IMPORT_NOISE = (
    _dgl_maxk_hook.TORCHDATA_BANNER,
    # invalid escapes in DGL's sources, reported when they are compiled (no .pyc yet)
    dict(category=SyntaxWarning, module=_DGL_SOURCE, message="invalid escape sequence"),
    dict(category=DeprecationWarning, module=_DGL_SOURCE, message="invalid escape sequence"),
)


@contextmanager
def _quiet_offline_import():
    outdated = sys.modules.get("outdated")
    sys.modules["outdated"] = None  # "import outdated" raises ImportError
    try:
        with warnings.catch_warnings():
            for noise in _IMPORT_NOISE:
                warnings.filterwarnings("ignore", **noise)
            ours = list(warnings.filters)
            yield
            added = [f for f in warnings.filters if f not in ours]
        # catch_warnings drops the filters the imported libraries set for themselves: keep them
        for action, message, category, module, lineno in reversed(added):
            warnings.filterwarnings(action, message.pattern if message else "", category,
                                    module.pattern if module else "", lineno)
    finally:
        if outdated is None:
            del sys.modules["outdated"]
        else:
            sys.modules["outdated"] = outdated


_dgl_maxk_hook.install()
with _quiet_offline_import():
    import dgl

from dgl import DGLError  # noqa: E402,F401

__all__ = ["dgl", "DGLError"]
