"""Install dgl_maxk's layers in place of DGL's, so existing code gets MaxK without edits.

>>> import dgl_maxk, dgl
>>> dgl_maxk.install(k=32)            # dgl.nn.SAGEConv(...) now builds dgl_maxk.nn.SAGEConv
>>> conv = dgl.nn.SAGEConv(256, 256, "mean")
>>> conv.k
32
>>> dgl_maxk.uninstall()              # DGL's own classes again
>>> with dgl_maxk.installed(k=16):    # or for a block of code only
...     model = build_my_model()

While installed, ``dgl.nn.SAGEConv``, ``GraphConv`` and ``GINConv`` (and the same names in
``dgl.nn.pytorch`` and ``dgl.nn.pytorch.conv``) are the dgl_maxk classes, and a layer built
without an explicit ``k`` gets the installed one (``k=None`` keeps a layer dense; so does a
layer whose input is at most k wide, where MaxK would keep every entry). Code that
bound DGL's class to a name before ``install`` (``from dgl.nn import SAGEConv`` at the top of a
module imported earlier) keeps DGL's class: call ``install`` first (``install`` warns, naming
each such module global it finds). So does the module that
defines each class (``dgl.nn.pytorch.conv.sageconv``): DGL's code there calls
``super(SAGEConv, self)`` by name, which the replacement, a subclass, would send round in
circles.

This module owns the install state; the layers of :mod:`dgl_maxk.nn` register themselves
here as the replacements (:func:`register`) and ask for the installed k
(:func:`installed_k`), so it imports nothing of theirs.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import types
import warnings

from .sparse import check_k

LAYERS = ("SAGEConv", "GraphConv", "GINConv")
_NAMESPACES = ("dgl.nn", "dgl.nn.pytorch", "dgl.nn.pytorch.conv")
_replacements: dict = {}   # layer name -> dgl_maxk class (filled by dgl_maxk.nn)
_originals: dict = {}      # (namespace, layer name) -> DGL's class, while installed
_installed_k: dict = {}    # layer name -> k, while installed


def register(**classes):
    """Called by :mod:`dgl_maxk.nn`: the classes that replace DGL's layers of those names."""
    _replacements.update(classes)


def installed_k(layer: str):
    """The k that :func:`install` set for ``layer`` (None when it is not installed)."""
    return _installed_k.get(layer)


def install(k: int, layers=LAYERS):
    """Make ``dgl.nn.<layer>`` build dgl_maxk layers with MaxK at ``k`` by default.
    ``layers``: names among :data:`LAYERS` (a single name may be given as a string). Warns
    when a module already holds DGL's class of one of them under a name of its own."""
    _warn_bound_before(_install(k, layers), stacklevel=3)


def _install(k, layers) -> tuple:
    k = check_k(k)
    layers = (layers,) if isinstance(layers, str) else tuple(layers)
    unknown = set(layers) - set(LAYERS)
    if unknown:
        raise ValueError(f"dgl_maxk has no replacement for {sorted(unknown)}; it replaces "
                         f"{LAYERS}")
    for name in layers:
        for namespace in _NAMESPACES:
            module = importlib.import_module(namespace)
            _originals.setdefault((namespace, name), getattr(module, name))
            setattr(module, name, _replacements[name])
        _installed_k[name] = k
    return layers


def _warn_bound_before(layers, stacklevel):
    stale = _bound_before(layers)
    if stale:
        warnings.warn(f"dgl_maxk.install: DGL's own class is still bound to {', '.join(stale)} "
                      "(bound before install()), so code that builds layers through those "
                      "names builds DGL's, without MaxK (harmless where a name only serves "
                      "isinstance checks); call install() before importing that code, or build "
                      "dgl_maxk.nn layers there", stacklevel=stacklevel)


#: a module's own namespace, read past any __dict__ property a lazy module defines
_MODULE_DICT = types.ModuleType.__dict__["__dict__"]


def _bound_before(layers) -> list:
    """``module.name`` of each module global outside DGL and dgl_maxk that holds DGL's class
    of one of ``layers``: code that imported it before :func:`install` keeps building it.
    Only real modules are read, each once (``__main__`` may also be ``__mp_main__``), their
    own namespaces only (a lazy module's hooks do not run): the scan only ever warns."""
    originals = {id(_originals[(_NAMESPACES[0], name)]) for name in layers}
    found, seen = [], set()
    for module_name, module in list(sys.modules.items()):
        if (not isinstance(module, types.ModuleType) or id(module) in seen
                or module_name.split(".")[0] in ("dgl", "dgl_maxk")):
            continue
        seen.add(id(module))
        try:
            names = list(_MODULE_DICT.__get__(module).items())
        except RuntimeError:  # another thread's import changed it while it was read
            continue
        found += [f"{module_name}.{attr}" for attr, value in names if id(value) in originals]
    return found


def uninstall():
    """Put DGL's own layer classes back (a no-op when nothing is installed)."""
    for (namespace, name), cls in _originals.items():
        setattr(importlib.import_module(namespace), name, cls)
    _originals.clear()
    _installed_k.clear()


def is_installed() -> bool:
    """Whether some DGL layer is currently replaced."""
    return bool(_originals)


@contextlib.contextmanager
def installed(k: int, layers=LAYERS):
    """:func:`install` for the duration of a ``with`` block; restores what was there before,
    exceptions included."""
    outer = dict(_installed_k)
    _warn_bound_before(_install(k, layers), stacklevel=4)  # past contextlib, to the with
    try:
        yield
    finally:
        uninstall()
        for name, outer_k in outer.items():
            _install(outer_k, [name])
