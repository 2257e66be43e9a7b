"""The datasets by name: each one's loader and parameters (:data:`DATASETS`), name lookup,
parameter checks and :func:`load_dataset`."""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .dataset import Dataset
from .files import DGL_SPECS, OGB_SPECS, PAPERS, describe_layout
from .generators import PLANTED_PARAMS, POWER_LAW_PARAMS, check_planted, check_power_law
from .loaders import load_dgl, load_ogb, load_planted, load_powerlaw
from .papers import (PAPERS_SIZED_PARAMS, check_papers_sized, load_ogbn_papers100m,
                     load_papers100m_sized)
from .params import Param, check_values, with_defaults


class DatasetSpec(NamedTuple):
    """A dataset's loader ``(name, root, self_loops, **params) -> Dataset``, its parameters
    ``{name: Param}``, and the check of those parameters together (all of them given, with
    the prefix for messages), if any. ``on_device``: its graph is a DeviceGraph, built on
    the device the loader is given (``device=``)."""

    loader: Callable
    params: dict
    check: Callable | None = None
    on_device: bool = False


#: name -> DatasetSpec: everything ``load_dataset`` can load, with the parameters it takes.
DATASETS = {
    **{name: DatasetSpec(load_dgl, {}) for name in DGL_SPECS},
    "ogbn-arxiv": DatasetSpec(load_ogb, {"to_bidirected": Param(bool, True)}),
    "ogbn-products": DatasetSpec(load_ogb, {}),
    "ogbn-proteins": DatasetSpec(load_ogb, {}),
    "planted": DatasetSpec(load_planted, PLANTED_PARAMS, check_planted),
    "powerlaw": DatasetSpec(load_powerlaw, POWER_LAW_PARAMS, check_power_law),
    "papers100m-sized": DatasetSpec(load_papers100m_sized, PAPERS_SIZED_PARAMS,
                                    check_papers_sized, on_device=True),
    PAPERS: DatasetSpec(load_ogbn_papers100m, {"to_bidirected": Param(bool, True)},
                        on_device=True),
}


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def canonical_name(name: str) -> str:
    """Lower case; 'ogbn_arxiv' and 'ogbn-arxiv' are the same. Raises ValueError if unknown."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}")
    return key


def layout(name: str, root=None) -> str:
    """Where a dataset's files go under the data root, in words (generators: none)."""
    name = canonical_name(name)
    if name in DGL_SPECS or name in OGB_SPECS or name == PAPERS:
        return describe_layout(name, root)
    return "generated (no files)"


def check_params(name: str, params: dict, where: str = "params") -> dict:
    """Validate a dataset's parameters: unknown keys, wrong types, values out of range and
    values that do not fit together raise ValueError naming ``<where>.<key>`` and what is
    allowed. Returns the given parameters with numbers converted to their types."""
    name = canonical_name(name)
    spec = DATASETS[name]
    out = check_values(spec.params, params, where, name)
    if spec.check is not None:
        spec.check(with_defaults(spec.params, out), where)
    return out


def load_dataset(name: str, root=None, self_loops: bool = True, device=None,
                 **params) -> Dataset:
    """Load a dataset by name (see :mod:`dgl_maxk.data` for the names and their params).

    Parameters
    ----------
    name : str
        One of reddit, flickr, yelp, ogbn-arxiv, ogbn-products, ogbn-proteins,
        ogbn-papers100M, cora, citeseer, pubmed, planted, powerlaw, papers100m-sized
    root : str or Path, optional
        Data root (default ``$DGL_MAXK_DATA``, else ``./data``)
    self_loops : bool
        Remove existing self-loops and add one per node
    device : torch.device or str, optional
        Where the datasets whose graph is a DeviceGraph (papers100m-sized, ogbn-papers100M)
        build it (default: the GPU when there is one, else the CPU); the others ignore it
        (their DGL graph is on the CPU)
    **params
        Generator parameters (``planted``, ``powerlaw``, ``papers100m-sized``), or
        ``to_bidirected`` for ogbn-arxiv and ogbn-papers100M (default True: their citation
        edges are directed)

    Raises
    ------
    DatasetNotFound
        A real dataset is missing; the message lists the files and folder
    DatasetError
        A file is there but cannot be read; the message names it and the way on
    ValueError
        Unknown name, or a parameter unknown, of the wrong type or out of range
    """
    key = canonical_name(name)
    params = check_params(key, params)
    if not DATASETS[key].on_device:
        return DATASETS[key].loader(key, root, self_loops, **params)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return DATASETS[key].loader(key, root, self_loops, device=device, **params)
