"""Datasets for MaxK-GNN experiments behind one loader: :func:`load_dataset`.

Real datasets (read offline from a data root; nothing is downloaded here):

- ``reddit``, ``flickr``, ``yelp`` -- DGL's dataset classes (``raw_dir`` = the data root);
- ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-proteins`` -- OGB's ``DglNodePropPredDataset``;
  proteins gets node features = sum of its incoming edges' 8 features, 112 binary tasks;
- ``cora``, ``citeseer``, ``pubmed`` -- DGL's planetoid classes (the standard public split).

Generators owned by the package (no files needed, reproducible from ``seed``):

- ``planted`` -- a contextual stochastic block model: planted classes, edges inside a class
  with probability ``p_in`` and across with ``p_out`` (or equivalently ``mean_degree`` and
  ``homophily``), and node features = ``feature_snr`` x (class mean) + N(0, I) noise;
- ``powerlaw`` -- a graph of chosen size and mean degree with log-normal in-degrees
  (:func:`dgl_maxk.synthetic.power_law_csr`), for speed work. Its features and labels are
  RANDOM: accuracy on it is chance level and means nothing.

The data root is the ``root`` argument, else the environment variable ``DGL_MAXK_DATA``, else
``./data``. A missing dataset raises :class:`DatasetNotFound` at once, naming the files to
place and where (see :data:`LAYOUTS`); OGB's interactive y/N prompt and download are never
reached. DGL and OGB write processed caches next to the raw files: when that directory is not
writable, the raw files are first copied to ``DGL_MAXK_CACHE`` (default: a ``dgl_maxk_cache``
folder in the system temp directory).
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ._dgl import dgl

__all__ = ["Dataset", "DatasetError", "DatasetNotFound", "load_dataset", "dataset_names", "DATASETS",
           "data_root", "layout", "planted_partition", "power_law_graph"]


class DatasetError(ValueError):
    """A dataset cannot be loaded (missing or unreadable files, bad parameters); the message
    names the dataset, the file and what to do."""


class DatasetNotFound(DatasetError, FileNotFoundError):
    """A real dataset is not on disk; the message says which files to put where."""


@dataclass
class Dataset:
    """A node-classification dataset, ready for full-graph training.

    Attributes
    ----------
    name : str
    graph : DGLGraph -- on the CPU; self-loops as requested
    features : Tensor (N, F) float32
    labels : Tensor (N,) int64, or (N, C) float32 when ``multilabel``
    train_mask, val_mask, test_mask : Tensor (N,) bool
    num_classes : int -- classes, or tasks (labels per node) when ``multilabel``
    multilabel : bool
    metric : str -- 'accuracy', 'micro_f1' or 'rocauc'
    evaluator : str or None -- the OGB dataset name whose ``Evaluator`` scores it
    notes : str -- anything a reader of the results must know (e.g. random labels)
    """

    name: str
    graph: object
    features: torch.Tensor
    labels: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    multilabel: bool = False
    metric: str = "accuracy"
    evaluator: str | None = None
    notes: str = ""
    info: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return self.features.shape[0]

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    def summary(self) -> dict:
        return {"name": self.name, "num_nodes": self.num_nodes,
                "num_edges": int(self.graph.num_edges()), "num_features": self.num_features,
                "num_classes": self.num_classes, "multilabel": self.multilabel,
                "metric": self.metric, "train": int(self.train_mask.sum()),
                "val": int(self.val_mask.sum()), "test": int(self.test_mask.sum()),
                "notes": self.notes, **self.info}


# --------------------------------------------------------------------------- data root


def data_root(root=None) -> Path:
    """The data root: ``root``, else ``$DGL_MAXK_DATA``, else ``./data``."""
    if root is None:
        root = os.environ.get("DGL_MAXK_DATA") or "data"
    return Path(root).expanduser()


def _cache_root() -> Path:
    return Path(os.environ.get("DGL_MAXK_CACHE")
                or Path(tempfile.gettempdir()) / "dgl_maxk_cache").expanduser()


def _can_write(folder: Path) -> bool:
    """Whether a loader may write in ``folder``: it is not marked read-only (checked on the
    mode bits too, since root ignores them) and a file can be created there."""
    if not folder.stat().st_mode & stat.S_IWUSR or not os.access(folder, os.W_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".dgl_maxk_probe", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _writable_parent(folder: Path, has_cache: bool) -> Path:
    """The directory to hand to DGL/OGB as the parent of ``folder``: its real parent when
    the loader can write its processed cache there (or already has it), else the cache root
    after copying ``folder`` into it (once)."""
    if has_cache or _can_write(folder):
        return folder.parent
    # one cache folder per source folder, keeping the name DGL/OGB look for
    tag = hashlib.sha1(str(folder.resolve()).encode("utf-8")).hexdigest()[:10]
    target = _cache_root() / tag / folder.name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=target.parent))
        shutil.copytree(folder, partial / folder.name)
        for sub in (partial / folder.name).rglob("*"):
            sub.chmod(sub.stat().st_mode | 0o200)
        (partial / folder.name).chmod(0o755)
        try:
            os.replace(partial / folder.name, target)
        except OSError:  # another process finished first
            pass
        shutil.rmtree(partial, ignore_errors=True)
    return target.parent


# --------------------------------------------------------------------------- DGL datasets


def _dgl_folder(name: str, url_path: str) -> str:
    """The folder DGL's built-in dataset looks for under raw_dir: name + '_' + sha1(url)."""
    from dgl.data.utils import _get_dgl_url
    return name + "_" + hashlib.sha1(_get_dgl_url(url_path).encode("utf-8")).hexdigest()[:8]


_PLANETOID_FILES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
_SAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")

#: For each DGL dataset: (class name, DGL name, url path, raw files, where to get them).
_DGL_SPECS = {
    "reddit": ("RedditDataset", "reddit", "dataset/reddit.zip",
               ("reddit_graph.npz", "reddit_data.npz"),
               "https://data.dgl.ai/dataset/reddit.zip"),
    "flickr": ("FlickrDataset", "flickr", "dataset/flickr.zip", _SAINT_FILES,
               "https://data.dgl.ai/dataset/flickr.zip"),
    "yelp": ("YelpDataset", "yelp", "dataset/yelp.zip", _SAINT_FILES,
             "https://data.dgl.ai/dataset/yelp.zip"),
    "cora": ("CoraGraphDataset", "cora_v2", "dataset/cora_v2.zip",
             tuple(f"ind.cora_v2.{s}" for s in _PLANETOID_FILES),
             "https://data.dgl.ai/dataset/cora_v2.zip"),
    "citeseer": ("CiteseerGraphDataset", "citeseer", "dataset/citeseer.zip",
                 tuple(f"ind.citeseer.{s}" for s in _PLANETOID_FILES),
                 "https://data.dgl.ai/dataset/citeseer.zip"),
    "pubmed": ("PubmedGraphDataset", "pubmed", "dataset/pubmed.zip",
               tuple(f"ind.pubmed.{s}" for s in _PLANETOID_FILES),
               "https://data.dgl.ai/dataset/pubmed.zip"),
}


def dgl_layout(name: str, root=None) -> tuple[Path, tuple[str, ...], str]:
    """(folder, raw files, source) of a DGL dataset under the data root."""
    _, dgl_name, url_path, files, source = _DGL_SPECS[name]
    return data_root(root) / _dgl_folder(dgl_name, url_path), files, source


def _check_dgl_files(name: str, root) -> tuple[Path, bool]:
    folder, files, source = dgl_layout(name, root)
    has_cache = folder.is_dir() and any(folder.glob("*.bin"))
    missing = [f for f in files if not (folder / f).is_file()]
    if missing and not has_cache:
        raise DatasetNotFound(
            f"dataset '{name}' is not on disk and dgl_maxk does not download. Put these "
            f"files in {folder}/ :\n  " + "\n  ".join(files)
            + f"\n(missing: {', '.join(missing)}). They are the contents of {source} "
            f"unpacked into that folder. The data root is {data_root(root)} (set it with "
            "the 'root' option, dataset.root in a config, or $DGL_MAXK_DATA).")
    return folder, has_cache


def _load_dgl(name: str, root, self_loops: bool) -> Dataset:
    folder, has_cache = _check_dgl_files(name, root)
    raw_dir = _writable_parent(folder, has_cache)
    cls = getattr(dgl.data, _DGL_SPECS[name][0])
    kwargs = {"raw_dir": str(raw_dir), "verbose": False}
    ds = cls(**kwargs)
    g = ds[0]
    labels = g.ndata["label"]
    multilabel = labels.dim() == 2
    if multilabel:
        labels = labels.to(torch.float32)
        num_classes = labels.shape[1]
    else:
        num_classes = int(labels.max()) + 1  # DGL's Reddit class says 41 whatever the data
    return _finish(name, g, g.ndata["feat"], labels, g.ndata["train_mask"],
                   g.ndata["val_mask"], g.ndata["test_mask"], num_classes, multilabel,
                   "micro_f1" if multilabel else "accuracy", None, self_loops)


# --------------------------------------------------------------------------- OGB datasets

_OGB_FILES = {
    "ogbn-arxiv": ("time", ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz",
                            "node_year.csv.gz", "num-edge-list.csv.gz",
                            "num-node-list.csv.gz")),
    "ogbn-products": ("sales_ranking", ("edge.csv.gz", "node-feat.csv.gz",
                                        "node-label.csv.gz", "num-edge-list.csv.gz",
                                        "num-node-list.csv.gz")),
    "ogbn-proteins": ("species", ("edge.csv.gz", "edge-feat.csv.gz", "node-label.csv.gz",
                                  "node_species.csv.gz", "num-edge-list.csv.gz",
                                  "num-node-list.csv.gz")),
}


def ogb_layout(name: str, root=None) -> tuple[Path, list[str]]:
    """(folder, files relative to it) of an OGB node dataset under the data root."""
    split, raw = _OGB_FILES[name]
    base = data_root(root)
    folder = base / name.replace("-", "_")
    if (base / (folder.name + "_dgl")).exists():  # OGB prefers this name when present
        folder = base / (folder.name + "_dgl")
    files = (["RELEASE_v1.txt"] + [f"raw/{f}" for f in raw]
             + [f"split/{split}/{s}.csv.gz" for s in ("train", "valid", "test")])
    return folder, files


def _check_ogb_files(name: str, root) -> tuple[Path, bool]:
    folder, files = ogb_layout(name, root)
    short = name.split("-")[1]
    source = (f"the official zip http://snap.stanford.edu/ogb/data/nodeproppred/{short}.zip "
              f"unpacked, with its top folder '{short}' renamed to '{folder.name}'")
    has_cache = (folder / "processed" / "dgl_data_processed").is_file()
    needed = [f for f in files if not f.startswith("raw/")] if has_cache else files
    if name == "ogbn-proteins" and (folder / "raw" / "species.csv.gz").is_file():
        needed = [f for f in needed if f != "raw/node_species.csv.gz"]  # OGB renames it
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        why = ""
        if missing == ["RELEASE_v1.txt"]:
            why = ("\nRELEASE_v1.txt is missing: without it OGB asks an interactive y/N "
                   "question and deletes the folder on 'y'. It ships in the official zip; "
                   f"restore it (an empty file is enough: touch {folder}/RELEASE_v1.txt).")
        raise DatasetNotFound(
            f"dataset '{name}' is not on disk and dgl_maxk does not download. Put "
            f"{source} at {folder}/ , so that it holds:\n  " + "\n  ".join(files)
            + f"\n(missing: {', '.join(missing)}).{why} The data root is {data_root(root)}"
            " (set it with the 'root' option, dataset.root in a config, or $DGL_MAXK_DATA).")
    return folder, has_cache


def _load_ogb(name: str, root, self_loops: bool, to_bidirected: bool = True) -> Dataset:
    folder, has_cache = _check_ogb_files(name, root)
    parent = _writable_parent(folder, has_cache)  # a copy keeps the folder's name
    from ogb.nodeproppred import DglNodePropPredDataset
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):  # OGB prints 'Saving...' etc.
        ds = DglNodePropPredDataset(name=name, root=str(parent))
        split = ds.get_idx_split()
    g, labels = ds[0]
    n = g.num_nodes()
    masks = [_index_to_mask(split[s], n) for s in ("train", "valid", "test")]
    if name == "ogbn-proteins":
        # node features = sum of the features of the node's incoming edges
        src, dst = g.edges()
        efeat = g.edata["feat"].to(torch.float32)
        feat = torch.zeros(n, efeat.shape[1]).index_add_(0, dst.long(), efeat)
        labels = labels.to(torch.float32)
        return _finish(name, g, feat, labels, *masks, labels.shape[1], True, "rocauc", name,
                       self_loops, ogb_graph=True)
    feat = g.ndata["feat"].to(torch.float32)
    labels = labels.reshape(-1).long()
    if to_bidirected:
        g = _bidirected(g)
    return _finish(name, g, feat, labels, *masks, int(ds.num_classes), False, "accuracy",
                   name, self_loops, ogb_graph=True, info={"to_bidirected": to_bidirected})


def _index_to_mask(index, n):
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.as_tensor(index).long()] = True
    return mask


def _bidirected(g):
    """The graph with every edge in both directions, duplicates removed (pure torch)."""
    src, dst = g.edges()
    n = g.num_nodes()
    s = torch.cat([src, dst]).long()
    d = torch.cat([dst, src]).long()
    key = torch.unique(d * n + s)
    return dgl.graph((key % n, key // n), num_nodes=n)


# --------------------------------------------------------------------------- generators


def planted_partition(num_nodes=2000, num_classes=5, mean_degree=10.0, homophily=0.8,
                      p_in=None, p_out=None, num_features=32, feature_snr=1.0,
                      train_fraction=0.1, val_fraction=0.2, seed=0):
    """A contextual stochastic block model (undirected, no self-loops, no multi-edges).

    Nodes get one of ``num_classes`` labels uniformly. About ``num_nodes * mean_degree / 2``
    undirected edges are drawn; each joins two nodes of the same class with probability
    ``homophily`` and of different classes otherwise. Giving ``p_in`` and ``p_out`` (edge
    probabilities within / across classes) sets ``mean_degree`` and ``homophily`` to the
    values they imply for equal class sizes. Features: ``feature_snr * mu[label] + noise``,
    where the ``mu`` are random unit vectors and the noise is N(0, I) in ``num_features``
    dimensions, so ``feature_snr`` sets how separable the classes are from features alone
    and ``homophily`` how much the graph helps. Splits are random with the given fractions.
    Everything is a function of ``seed``.

    Returns (src, dst, features, labels, train_mask, val_mask, test_mask).
    """
    if num_classes < 2 or num_nodes < 2 * num_classes:
        raise ValueError(f"planted: need num_classes >= 2 and num_nodes >= 2 * num_classes, "
                         f"got {num_classes} classes and {num_nodes} nodes")
    if (p_in is None) != (p_out is None):
        raise ValueError("planted: give both p_in and p_out, or neither")
    if p_in is not None:
        size = num_nodes / num_classes
        expected_in, expected_out = p_in * (size - 1), p_out * (num_nodes - size)
        mean_degree = expected_in + expected_out
        if mean_degree <= 0:
            raise ValueError("planted: p_in and p_out give no edges")
        homophily = expected_in / mean_degree
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"planted: homophily must be in [0, 1], got {homophily}")
    if not (0 < train_fraction and 0 < val_fraction and train_fraction + val_fraction < 1):
        raise ValueError("planted: need 0 < train_fraction, 0 < val_fraction, sum < 1")
    gen = torch.Generator().manual_seed(int(seed))
    labels = torch.randint(num_classes, (num_nodes,), generator=gen)
    # make every class non-empty
    labels[torch.randperm(num_nodes, generator=gen)[:num_classes]] = torch.arange(num_classes)
    order = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=num_classes)
    starts = torch.cumsum(counts, 0) - counts

    num_edges = int(round(num_nodes * mean_degree / 2))
    u = torch.randint(num_nodes, (num_edges,), generator=gen)
    same = torch.rand(num_edges, generator=gen) < homophily
    cu = labels[u]
    # the class of the other end: its own, or a uniformly chosen other class
    shift = torch.randint(1, num_classes, (num_edges,), generator=gen)
    cv = torch.where(same, cu, (cu + shift) % num_classes)
    pick = (torch.rand(num_edges, generator=gen) * counts[cv]).long().clamp(
        max=(counts[cv] - 1))
    v = order[starts[cv] + pick]
    keep = u != v
    u, v = u[keep], v[keep]
    key = torch.unique(torch.minimum(u, v) * num_nodes + torch.maximum(u, v))
    a, b = key // num_nodes, key % num_nodes
    src, dst = torch.cat([a, b]), torch.cat([b, a])

    mu = torch.randn(num_classes, num_features, generator=gen)
    mu = mu / mu.norm(dim=1, keepdim=True)
    features = feature_snr * mu[labels] + torch.randn(num_nodes, num_features, generator=gen)

    perm = torch.randperm(num_nodes, generator=gen)
    n_train = max(num_classes, int(round(train_fraction * num_nodes)))
    n_val = max(1, int(round(val_fraction * num_nodes)))
    masks = []
    for part in (perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]):
        masks.append(_index_to_mask(part, num_nodes))
    return (src, dst, features.to(torch.float32), labels, *masks)


def power_law_graph(num_nodes=100_000, mean_degree=50.0, num_features=128, num_classes=41,
                    max_degree=None, seed=0):
    """A graph with log-normal in-degrees of the given mean and uniform random sources
    (:func:`dgl_maxk.synthetic.power_law_csr`), with RANDOM features (N(0, 1)) and RANDOM
    labels: for speed measurements only. Splits: random 60/20/20.

    Returns (src, dst, features, labels, train_mask, val_mask, test_mask).
    """
    from .synthetic import power_law_csr
    num_edges = int(round(num_nodes * mean_degree))
    indptr, indices = power_law_csr(num_nodes, num_edges, seed=int(seed), device="cpu",
                                    max_degree=max_degree)
    dst = torch.repeat_interleave(torch.arange(num_nodes), indptr[1:] - indptr[:-1])
    gen = torch.Generator().manual_seed(int(seed) + 1)
    features = torch.randn(num_nodes, num_features, generator=gen)
    labels = torch.randint(num_classes, (num_nodes,), generator=gen)
    perm = torch.randperm(num_nodes, generator=gen)
    a, b = int(0.6 * num_nodes), int(0.8 * num_nodes)
    masks = [_index_to_mask(p, num_nodes) for p in (perm[:a], perm[a:b], perm[b:])]
    return (indices.long(), dst, features, labels, *masks)


def _load_planted(name, root, self_loops, **params):
    src, dst, feat, labels, *masks = planted_partition(**params)
    g = dgl.graph((src, dst), num_nodes=feat.shape[0])
    num_classes = int(params.get("num_classes", 5))
    return _finish(name, g, feat, labels, *masks, num_classes, False, "accuracy", None,
                   self_loops, info={"params": params})


def _load_powerlaw(name, root, self_loops, **params):
    src, dst, feat, labels, *masks = power_law_graph(**params)
    g = dgl.graph((src, dst), num_nodes=feat.shape[0])
    num_classes = int(params.get("num_classes", 41))
    return _finish(name, g, feat, labels, *masks, num_classes, False, "accuracy", None,
                   self_loops, notes="random features and labels: for speed work only; "
                   "its accuracy is chance level", info={"params": params})


# --------------------------------------------------------------------------- common


def _finish(name, g, feat, labels, train, val, test, num_classes, multilabel, metric,
            evaluator, self_loops, notes="", info=None, ogb_graph=False):
    g = dgl.graph(g.edges(), num_nodes=g.num_nodes())  # structure only, data kept below
    if self_loops:
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    return Dataset(name=name, graph=g, features=feat.to(torch.float32).contiguous(),
                   labels=labels, train_mask=train.bool(), val_mask=val.bool(),
                   test_mask=test.bool(), num_classes=int(num_classes),
                   multilabel=multilabel, metric=metric, evaluator=evaluator, notes=notes,
                   info=dict(info or {}, self_loops=bool(self_loops)))


def _dgl_loader(name):
    def load(_name, root, self_loops):
        return _load_dgl(name, root, self_loops)
    return load


def _ogb_loader(name, **fixed):
    def load(_name, root, self_loops, **params):
        return _load_ogb(name, root, self_loops, **params)
    return load


#: name -> (loader, {parameter: (type, default)}) -- the parameters ``load_dataset`` accepts.
DATASETS = {
    **{n: (_dgl_loader(n), {}) for n in ("reddit", "flickr", "yelp", "cora", "citeseer",
                                         "pubmed")},
    "ogbn-arxiv": (_ogb_loader("ogbn-arxiv"), {"to_bidirected": (bool, True)}),
    "ogbn-products": (_ogb_loader("ogbn-products"), {}),
    "ogbn-proteins": (_ogb_loader("ogbn-proteins"), {}),
    "planted": (_load_planted, {
        "num_nodes": (int, 2000), "num_classes": (int, 5), "mean_degree": (float, 10.0),
        "homophily": (float, 0.8), "p_in": (float, None), "p_out": (float, None),
        "num_features": (int, 32), "feature_snr": (float, 1.0),
        "train_fraction": (float, 0.1), "val_fraction": (float, 0.2), "seed": (int, 0)}),
    "powerlaw": (_load_powerlaw, {
        "num_nodes": (int, 100_000), "mean_degree": (float, 50.0), "num_features": (int, 128),
        "num_classes": (int, 41), "max_degree": (int, None), "seed": (int, 0)}),
}

def layout(name: str, root=None) -> str:
    """Where a dataset's files go under the data root, in words (generators: none)."""
    name = canonical_name(name)
    if name in _DGL_SPECS:
        folder, files, _ = dgl_layout(name, root)
        return f"{folder}/ {{{', '.join(files)}}}"
    if name in _OGB_FILES:
        folder, _ = ogb_layout(name, root)
        return (f"{folder}/ (the official {name.split('-')[1]}.zip unpacked and renamed; "
                "with RELEASE_v1.txt, raw/, split/)")
    return "generated (no files)"


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def canonical_name(name: str) -> str:
    """Lower case; 'ogbn_arxiv' and 'ogbn-arxiv' are the same. Raises ValueError if unknown."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}")
    return key


def check_params(name: str, params: dict, where: str = "params") -> dict:
    """Validate generator/loader parameters: unknown keys and wrong types raise ValueError
    naming the key. Returns the parameters with numbers converted to their types."""
    name = canonical_name(name)
    spec = DATASETS[name][1]
    out = {}
    for key, value in (params or {}).items():
        if key not in spec:
            known = ", ".join(sorted(spec)) or "none"
            raise ValueError(f"unknown key '{where}.{key}' for dataset '{name}' "
                             f"(known: {known})")
        typ = spec[key][0]
        if value is None:
            out[key] = None
        elif typ is bool:
            if not isinstance(value, bool):
                raise ValueError(f"'{where}.{key}' must be true or false, got {value!r}")
            out[key] = value
        elif typ is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"'{where}.{key}' must be an integer, got {value!r}")
            out[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value):
                raise ValueError(f"'{where}.{key}' must be a number, got {value!r}")
            out[key] = float(value)
    return out


def load_dataset(name: str, root=None, self_loops: bool = True, **params) -> Dataset:
    """Load a dataset by name (see the module docstring for the names and their params).

    Parameters
    ----------
    name : str -- reddit, flickr, yelp, ogbn-arxiv, ogbn-products, ogbn-proteins, cora,
        citeseer, pubmed, planted, powerlaw
    root : str or Path, optional -- data root (default ``$DGL_MAXK_DATA``, else ``./data``)
    self_loops : bool -- remove existing self-loops and add one per node
    **params -- generator parameters (``planted``, ``powerlaw``) or ``to_bidirected`` for
        ogbn-arxiv (default True: arxiv's citation edges are directed)

    Raises
    ------
    DatasetNotFound -- a real dataset is missing; the message lists the files and folder
    ValueError -- unknown name or parameter
    """
    key = canonical_name(name)
    params = check_params(key, params)
    loader = DATASETS[key][0]
    return loader(key, root, self_loops, **params)
