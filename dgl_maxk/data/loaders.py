"""One loader per kind of dataset, each ``(name, root, self_loops, **params) -> Dataset``:
DGL's dataset classes and OGB's ``DglNodePropPredDataset`` read offline from the data root
(nothing is downloaded), and the two generators.

What DGL or OGB is about to read is checked first: its processed cache (:mod:`.processed`)
when all of it is there, else the raw files (:mod:`.checks`); an OGB split on every load. A
damaged file raises :class:`DatasetError` naming the dataset, the file and the way on,
instead of training on it, crashing, or failing with the reader's own error.
"""
from __future__ import annotations

import contextlib
import io
import warnings

import torch

from .._dgl import dgl
from .checks import check_ogb_split, check_raw
from .dataset import Dataset, build_dataset, index_to_mask
from .files import (DGL_SPECS, OGB_CACHE, check_dgl_files, check_ogb_files, dgl_cache_files,
                    dgl_layout, ogb_layout, ogb_source, writable_parent)
from .generators import (PLANTED_PARAMS, POWER_LAW_PARAMS, planted_partition,
                         power_law_graph)
from .processed import check_processed, record_processed
from .unreadable import Source, reporting


def _check_before_reading(source: Source, has_cache: bool) -> None:
    """Check what DGL or OGB is about to read: its processed cache when all of it is there
    (they read it instead of the raw files), else the raw files."""
    if has_cache:
        check_processed(source.read_from, source.cache_files)
    else:
        check_raw(source.name, source.read_from, source.raw_files)


def load_dgl(name: str, root, self_loops: bool) -> Dataset:
    """reddit, flickr, yelp, cora, citeseer, pubmed through DGL's dataset classes."""
    folder, has_cache = check_dgl_files(name, root)
    parent = writable_parent(folder, has_cache)
    _, raw_files, origin = dgl_layout(name, root)
    source = Source(name, folder, parent / folder.name, raw_files, dgl_cache_files(name),
                    f"the contents of {origin}")
    with reporting(source):
        _check_before_reading(source, has_cache)
        g = getattr(dgl.data, DGL_SPECS[name][0])(raw_dir=str(parent), verbose=False)[0]
        record_processed(source.read_from, source.caches())
    labels = g.ndata["label"]
    multilabel = labels.dim() == 2
    if multilabel:
        labels = labels.to(torch.float32)
        num_classes = labels.shape[1]
    else:
        num_classes = int(labels.max()) + 1  # DGL's Reddit class says 41 whatever the data
    return build_dataset(name, g, g.ndata["feat"], labels, g.ndata["train_mask"],
                         g.ndata["val_mask"], g.ndata["test_mask"], num_classes, multilabel,
                         "micro_f1" if multilabel else "accuracy", None, self_loops)


def _read_ogb(name: str, root):
    """OGB's dataset object and its split, with a damaged file reported as DatasetError."""
    # Imported here, not at the top: importing ogb takes 0.7 s and starts a thread that asks
    # PyPI for ogb's latest version, which only a load of an OGB dataset should cause.
    from ogb.nodeproppred import DglNodePropPredDataset
    folder, has_cache = check_ogb_files(name, root)
    parent = writable_parent(folder, has_cache)  # a copy keeps the folder's name
    source = Source(name, folder, parent / folder.name, ogb_layout(name, root)[1],
                    (OGB_CACHE,), ogb_source(name, folder))
    with reporting(source):
        _check_before_reading(source, has_cache)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            # OGB prints 'Saving...' etc., and hands torch a read-only numpy array
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                                    category=UserWarning)
            ds = DglNodePropPredDataset(name=name, root=str(parent))
        record_processed(source.read_from, source.caches())
        check_ogb_split(source.read_from, source.raw_files, ds[0][0].num_nodes())
        return ds, ds.get_idx_split()


def load_ogb(name: str, root, self_loops: bool, to_bidirected: bool = True) -> Dataset:
    """ogbn-arxiv, ogbn-products, ogbn-proteins through OGB's DGL dataset class; proteins
    gets node features = the sum of its incoming edges' 8 features, and 112 binary tasks."""
    ds, split = _read_ogb(name, root)
    g, labels = ds[0]
    n = g.num_nodes()
    masks = [index_to_mask(split[s], n) for s in ("train", "valid", "test")]
    if name == "ogbn-proteins":
        _, dst = g.edges()
        efeat = g.edata["feat"].to(torch.float32)
        feat = torch.zeros(n, efeat.shape[1]).index_add_(0, dst.long(), efeat)
        labels = labels.to(torch.float32)
        return build_dataset(name, g, feat, labels, *masks, labels.shape[1], True, "rocauc",
                             name, self_loops)
    feat = g.ndata["feat"].to(torch.float32)
    labels = labels.reshape(-1).long()
    if to_bidirected:
        g = _bidirected(g)
    return build_dataset(name, g, feat, labels, *masks, int(ds.num_classes), False,
                         "accuracy", name, self_loops, info={"to_bidirected": to_bidirected})


def _bidirected(g):
    """The graph with every edge in both directions, duplicates removed (pure torch)."""
    src, dst = g.edges()
    n = g.num_nodes()
    s = torch.cat([src, dst]).long()
    d = torch.cat([dst, src]).long()
    key = torch.unique(d * n + s)
    return dgl.graph((key % n, key // n), num_nodes=n)


def load_planted(name: str, root, self_loops: bool, **params) -> Dataset:
    """The ``planted`` generator (:func:`planted_partition`); ``root`` is unused."""
    src, dst, feat, labels, *masks = planted_partition(**params)
    g = dgl.graph((src, dst), num_nodes=feat.shape[0])
    num_classes = params.get("num_classes", PLANTED_PARAMS["num_classes"].default)
    return build_dataset(name, g, feat, labels, *masks, num_classes, False, "accuracy", None,
                         self_loops, info={"params": params})


def load_powerlaw(name: str, root, self_loops: bool, **params) -> Dataset:
    """The ``powerlaw`` generator (:func:`power_law_graph`); ``root`` is unused."""
    src, dst, feat, labels, *masks = power_law_graph(**params)
    g = dgl.graph((src, dst), num_nodes=feat.shape[0])
    num_classes = params.get("num_classes", POWER_LAW_PARAMS["num_classes"].default)
    return build_dataset(name, g, feat, labels, *masks, num_classes, False, "accuracy", None,
                         self_loops, notes="random features and labels: for speed work "
                         "only; its accuracy is chance level", info={"params": params})
