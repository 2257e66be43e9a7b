"""Datasets of ogbn-papers100M's size, whose graph is a :class:`DeviceGraph` built on the
training device (no DGL graph on the host): mini-batch training with the device sampler,
evaluation layer by layer.

- ``papers100m-sized`` (:func:`load_papers100m_sized`) -- generated: papers100M's shape
  (111,059,956 nodes, 1,615,685,872 edges, 128 features, 172 classes, its split sizes) with
  log-normal in-degrees and uniform sources (:func:`power_law_csr`), N(0, 1) features and
  labels from a planted rule (:func:`planted_labels`), so that accuracy measures learning;
- ``ogbn-papers100M`` (:func:`load_ogbn_papers100m`) -- the real files, read without OGB
  (whose loader builds a DGL graph on the host): OGB's layout under the data root.

The features stay in host memory (pinned when the device is a GPU, so that the GPU can read
their rows directly: ``sampling.features: host``), the labels and masks too; nodes outside
the splits have label -1 (papers100M labels only those).
"""
from __future__ import annotations

import gzip
import zipfile
import zlib

import numpy as np
import torch

from ..sampling import DeviceGraph
from ..sampling.sampler import sample_block
from .dataset import Dataset, DatasetError, DatasetNotFound, index_to_mask
from .device_graphs import CHUNK_EDGES, canonical_rows, csr_from_edges, source_dtype
from .files import data_root
from .generators import power_law_csr
from .params import Param, check_values

#: ogbn-papers100M's sizes, the defaults of ``papers100m-sized``.
PAPERS_SIZED_PARAMS = {
    "num_nodes": Param(int, 111_059_956, 1), "num_edges": Param(int, 1_615_685_872, 0),
    "num_features": Param(int, 128, 1), "num_classes": Param(int, 172, 2),
    "num_train": Param(int, 1_207_179, 1), "num_valid": Param(int, 125_265, 1),
    "num_test": Param(int, 214_338, 1), "seed": Param(int, 0, 0, 2**63 - 1)}

#: Rows of features made (or read) at a time.
FEATURE_CHUNK_ROWS = 1 << 20
#: The planted rule's projection width (:func:`planted_labels`).
RULE_WIDTH = 16


def check_papers_sized(params: dict, where: str = "papers100m-sized") -> None:
    """ValueError naming ``<where>.<key>`` when the splits do not fit in the nodes."""
    p = check_values(PAPERS_SIZED_PARAMS, params, where, "papers100m-sized")
    labelled = p["num_train"] + p["num_valid"] + p["num_test"]
    if labelled > p["num_nodes"]:
        raise ValueError(f"'{where}.num_train' + num_valid + num_test = {labelled} exceeds "
                         f"num_nodes = {p['num_nodes']}")


def host_rows(shape, dtype, device) -> torch.Tensor:
    """An empty host tensor, pinned when ``device`` is a GPU (its rows readable by it)."""
    return torch.empty(shape, dtype=dtype, pin_memory=torch.device(device).type == "cuda")


# --------------------------------------------------------------------------- generated


def load_papers100m_sized(name: str, root, self_loops: bool, device, **params) -> Dataset:
    """The ``papers100m-sized`` generator on ``device``; ``root`` is unused. Everything is a
    function of ``seed`` (and of the device's random streams)."""
    p = {key: params.get(key, spec.default) for key, spec in PAPERS_SIZED_PARAMS.items()}
    device, n, seed = torch.device(device), p["num_nodes"], p["seed"]
    graph = DeviceGraph(*power_law_csr(n, p["num_edges"], seed, device,
                                       index_dtype=source_dtype(n), chunk_edges=CHUNK_EDGES),
                        n)
    if self_loops:
        graph = canonical_rows(graph, dedupe=False, self_loops=True)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    features, projected = _random_features(n, p["num_features"], gen, device)
    perm = torch.randperm(n, generator=gen, device=device)
    ends = np.cumsum([p["num_train"], p["num_valid"], p["num_test"]]).tolist()
    labelled = perm[:ends[-1]]
    labels = torch.full((n,), -1, dtype=torch.int64)
    labels[labelled.cpu()] = planted_labels(graph, projected, labelled, p["num_classes"],
                                            gen).cpu()
    del projected
    masks = [index_to_mask(part.cpu(), n) for part in
             (perm[:ends[0]], perm[ends[0]:ends[1]], perm[ends[1]:ends[2]])]
    return Dataset(name=name, graph=graph, features=features, labels=labels,
                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                   num_classes=p["num_classes"],
                   notes="generated: random features, labels planted by a rule over each "
                         "node's and its in-neighbours' features; nodes outside the splits "
                         "have label -1",
                   info={"params": params, "self_loops": bool(self_loops)})


def _random_features(n: int, width: int, gen, device):
    """(N x width float32 N(0, 1) features in host memory, their projection X W (N x
    RULE_WIDTH, float32, on ``device``) for :func:`planted_labels`), made a chunk of rows at
    a time on ``device``. The projection is computed in float64 (the same whatever the
    matmul precision setting)."""
    weight = torch.randn(width, RULE_WIDTH, generator=gen, device=device,
                         dtype=torch.float64) / width ** 0.5
    features = host_rows((n, width), torch.float32, device)
    projected = torch.empty((n, RULE_WIDTH), dtype=torch.float32, device=device)
    for start in range(0, n, FEATURE_CHUNK_ROWS):
        rows = min(FEATURE_CHUNK_ROWS, n - start)
        x = torch.randn((rows, width), generator=gen, device=device)
        projected[start:start + rows] = x.double() @ weight
        features[start:start + rows].copy_(x, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the copies into host memory
    return features, projected


def planted_labels(graph: DeviceGraph, projected, nodes, num_classes: int, gen):
    """The class of each of ``nodes``: argmax over c of (z_v + mean of z_u over v's
    in-neighbours u) . V_c, where z = ``projected`` (the features times a random matrix) and
    the V_c are random unit vectors. A one-layer mean-aggregating GNN can represent the
    rule; chance is about 1 / num_classes. Computed in float64, a chunk of nodes at a time,
    with deterministic sums."""
    classes = torch.randn(RULE_WIDTH, num_classes, generator=gen, device=projected.device,
                          dtype=torch.float64)
    classes /= classes.norm(dim=0, keepdim=True)
    out = []
    for chunk in nodes.split(FEATURE_CHUNK_ROWS):
        block = sample_block(graph, chunk, -1)
        plan = block.plan
        neighbours = projected[block.src_nodes].double()[plan.indices]
        sums = torch.segment_reduce(neighbours, "sum", lengths=plan.in_degrees)
        mean = sums / plan.in_degrees.clamp(min=1).unsqueeze(1)
        out.append(((projected[chunk].double() + mean) @ classes).argmax(1))
    return torch.cat(out) if out else nodes.new_empty(0)


# --------------------------------------------------------------------------- real files

#: The files of ogbn-papers100M under its folder (OGB's layout).
PAPERS_FILES = ("raw/data.npz", "raw/node-label.npz", "split/time/train.csv.gz",
                "split/time/valid.csv.gz", "split/time/test.csv.gz")
PAPERS_SOURCE = ("the official zip http://snap.stanford.edu/ogb/data/nodeproppred/"
                 "papers100M-bin.zip unpacked, with its top folder 'papers100M-bin' renamed "
                 "to 'ogbn_papers100M'")


def papers_folder(root=None):
    return data_root(root) / "ogbn_papers100M"


def papers_layout(root=None) -> str:
    """Where ogbn-papers100M's files go, in words."""
    return f"{papers_folder(root)}/ {{{', '.join(PAPERS_FILES)}}}"


def load_ogbn_papers100m(name: str, root, self_loops: bool, device,
                         to_bidirected: bool = True) -> Dataset:
    """ogbn-papers100M from OGB's files, its graph built on ``device`` from the edge list
    (its citations in both directions, each pair once, with ``to_bidirected``)."""
    folder = papers_folder(root)
    missing = [f for f in PAPERS_FILES if not (folder / f).is_file()]
    if missing:
        raise DatasetNotFound(
            f"dataset '{name}' is not on disk and dgl_maxk does not download. Put "
            f"{PAPERS_SOURCE} at {folder}/ , so that it holds:\n  " + "\n  ".join(PAPERS_FILES)
            + f"\n(missing: {', '.join(missing)}). The data root is {data_root(root)} (set it "
            "with the 'root' option, dataset.root in a config, or $DGL_MAXK_DATA).")
    device = torch.device(device)
    npz = folder / "raw" / "data.npz"
    with _reading(npz), zipfile.ZipFile(npz) as zf:
        n = int(_whole(zf, "num_nodes_list").sum())
        src, dst = _edge_index(zf, n)
        features = _node_features(zf, n, device)
    graph = csr_from_edges(lambda: _edge_chunks(src, dst, to_bidirected), n, device)
    del src, dst
    if to_bidirected or self_loops:
        graph = canonical_rows(graph, dedupe=to_bidirected, self_loops=self_loops)
    labels_file = folder / "raw" / "node-label.npz"
    with _reading(labels_file), np.load(labels_file) as z:
        labels = torch.from_numpy(z["node_label"].reshape(-1))
    if labels.numel() != n:
        raise DatasetError(f"{labels_file} labels {labels.numel()} nodes, but {npz} has {n}")
    labels = torch.where(torch.isnan(labels), -1, labels).long()
    masks = [index_to_mask(_split(folder / f"split/time/{s}.csv.gz", n), n)
             for s in ("train", "valid", "test")]
    return Dataset(name=name, graph=graph, features=features, labels=labels,
                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                   num_classes=172, evaluator="ogbn-papers100M",
                   notes="nodes outside the splits have label -1",
                   info={"to_bidirected": to_bidirected, "self_loops": bool(self_loops)})


class _reading:
    """A file's read errors as DatasetError naming it (the reader's own errors say little)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if isinstance(err, (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile,
                            zlib.error)) and not isinstance(err, DatasetError):
            raise DatasetError(f"{self.path} cannot be read ({type(err).__name__}: {err}); "
                               f"replace it with the file from {PAPERS_SOURCE}") from err
        return False


def _array(zf, key):
    """(stream at the data, shape, dtype, Fortran order) of array ``key`` of an npz."""
    if f"{key}.npy" not in zf.namelist():
        raise DatasetError(f"{zf.filename} holds no array '{key}' (it has "
                           f"{', '.join(sorted(zf.namelist()))})")
    stream = zf.open(f"{key}.npy")
    version = np.lib.format.read_magic(stream)
    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
              else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = header(stream)
    return stream, shape, dtype, fortran


def _whole(zf, key) -> np.ndarray:
    stream, shape, dtype, fortran = _array(zf, key)
    count = int(np.prod(shape))
    values = np.frombuffer(stream.read(count * dtype.itemsize), dtype)
    if values.size != count:
        raise EOFError("the array ends early (a truncated file)")
    return values.reshape(shape, order="F" if fortran else "C")


def _values(stream, dtype, count: int, chunk: int):
    """``count`` values of ``dtype`` from ``stream``, ``chunk`` at a time."""
    while count > 0:
        m = min(chunk, count)
        raw = stream.read(m * dtype.itemsize)
        if len(raw) != m * dtype.itemsize:
            raise EOFError("the array ends early (a truncated file)")
        yield np.frombuffer(raw, dtype)
        count -= m


def _edge_index(zf, n: int):
    """(sources, destinations) of the npz's edge_index (2 x E), as int32 (int64 from 2^31
    nodes) host arrays, read a chunk at a time; ids outside [0, n) are a DatasetError."""
    stream, shape, dtype, fortran = _array(zf, "edge_index")
    if len(shape) != 2 or shape[0] != 2 or dtype.kind not in "iu":
        raise DatasetError(f"{zf.filename}: edge_index must be 2 x E integers, got "
                           f"{shape} {dtype}")
    num_edges = shape[1]
    out = np.empty((2, num_edges), dtype=np.int32 if n < 2 ** 31 else np.int64)
    written = 0  # values read: C order holds all sources, then all destinations;
    # Fortran order (source, destination) pairs (an even number a chunk)
    for values in _values(stream, dtype, 2 * num_edges, 2 * CHUNK_EDGES):
        if values.size and (values.min() < 0 or values.max() >= n):
            raise DatasetError(f"{zf.filename}: edge_index holds node ids outside "
                               f"[0, {n}) (num_nodes_list says {n} nodes)")
        if fortran:
            pairs = slice(written // 2, (written + values.size) // 2)
            out[0, pairs], out[1, pairs] = values[0::2], values[1::2]
        else:
            out.reshape(-1)[written:written + values.size] = values
        written += values.size
    return out[0], out[1]


def _edge_chunks(src, dst, both_ways: bool):
    for start in range(0, src.size, CHUNK_EDGES):
        s = torch.from_numpy(src[start:start + CHUNK_EDGES])
        d = torch.from_numpy(dst[start:start + CHUNK_EDGES])
        yield s, d
        if both_ways:
            yield d, s


def _node_features(zf, n: int, device) -> torch.Tensor:
    """node_feat (N x F) as float32 host rows (pinned for a GPU), read a chunk at a time."""
    stream, shape, dtype, fortran = _array(zf, "node_feat")
    if len(shape) != 2 or shape[0] != n or fortran or dtype.kind != "f":
        raise DatasetError(f"{zf.filename}: node_feat must be {n} x F floats in C order, got "
                           f"{shape} {dtype}{' (Fortran order)' if fortran else ''}")
    features = host_rows(shape, torch.float32, device)
    flat = features.view(-1)
    written = 0
    for values in _values(stream, dtype, n * shape[1], FEATURE_CHUNK_ROWS * shape[1]):
        flat[written:written + values.size] = torch.from_numpy(values.astype(np.float32))
        written += values.size
    return features


def _split(path, n: int) -> torch.Tensor:
    with _reading(path), gzip.open(path, "rt") as f:
        index = torch.from_numpy(np.loadtxt(f, dtype=np.int64, ndmin=1))
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n):
        raise DatasetError(f"{path} holds node ids outside [0, {n})")
    return index
