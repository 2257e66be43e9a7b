"""Datasets of ogbn-papers100M's size, whose graph is a :class:`DeviceGraph` built on the
training device (no DGL graph on the host): mini-batch training with the device sampler,
evaluation layer by layer.

- ``papers100m-sized`` (:func:`load_papers100m_sized`) -- generated: papers100M's shape
  (111,059,956 nodes, 1,615,685,872 edges, 128 features, 172 classes, its split sizes) with
  log-normal in-degrees and uniform sources (:func:`power_law_csr`), N(0, 1) features and
  labels from a planted rule (:func:`planted_labels`), so that accuracy measures learning;
- ``ogbn-papers100M`` (:func:`load_ogbn_papers100m`) -- the real files, read without OGB
  (whose loader builds a DGL graph on the host): OGB's layout under the data root.

The features stay in host memory (pinned when the device is a GPU, whence the loader copies
each batch's rows over, and the GPU reads rows directly in layer-wise evaluation:
``sampling.features: host``), the labels and masks too; nodes outside the splits have label
-1 (papers100M labels only those).
"""
from __future__ import annotations

import zipfile

import numpy as np
import torch

from ..sampling import DeviceGraph
from ..sampling.sampler import sample_block
from .checks import check_raw
from .dataset import Dataset, index_to_mask
from .device_graphs import CHUNK_EDGES, canonical_rows, csr_from_edges, source_dtype
from .files import PAPERS_FILES, check_papers_files, papers_source
from .formats import Damaged, in_range, npy_header, npz_array, reading, require, table_column
from .generators import power_law_csr
from .params import Param, check_values
from .unreadable import Source, reporting

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

#: ogbn-papers100M's classes.
PAPERS_CLASSES = 172


def load_ogbn_papers100m(name: str, root, self_loops: bool, device,
                         to_bidirected: bool = True) -> Dataset:
    """ogbn-papers100M from OGB's files, its graph built on ``device`` from the edge list
    (its citations in both directions, each pair once, with ``to_bidirected``). The files
    are checked before and as they are read: a damaged one raises DatasetError naming it."""
    folder = check_papers_files(name, root)
    device = torch.device(device)
    with reporting(Source(name, folder, folder, PAPERS_FILES, (), papers_source())):
        check_raw(name, folder, PAPERS_FILES)
        n = int(npz_array(folder, PAPERS_FILES[0], "num_nodes_list")[0])
        src, dst, features = _read_data(folder, PAPERS_FILES[0], n, device)
        labels, splits = _read_labels(folder, PAPERS_FILES, n)
    graph = csr_from_edges(lambda: _edge_chunks(src, dst, to_bidirected), n, device)
    del src, dst
    if to_bidirected or self_loops:
        graph = canonical_rows(graph, dedupe=to_bidirected, self_loops=self_loops)
    masks = [index_to_mask(torch.tensor(ids), n) for ids in splits]
    return Dataset(name=name, graph=graph, features=features, labels=labels,
                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                   num_classes=PAPERS_CLASSES, evaluator="ogbn-papers100M",
                   notes="nodes outside the splits have label -1",
                   info={"to_bidirected": to_bidirected, "self_loops": bool(self_loops)})


def _read_data(folder, rel: str, n: int, device):
    """(sources, destinations, features) of the .npz ``rel`` of ``n`` nodes: the edges as
    host arrays, the features as float32 host rows (pinned for a GPU), each read a chunk at
    a time, the edges' node ids checked as they come."""
    with reading(folder, rel) as path, zipfile.ZipFile(path) as archive:
        src, dst = _edge_index(archive, rel, n)
        return src, dst, _node_features(archive, rel, n, device)


def _member(archive, key: str):
    """(stream at the data, shape, dtype, Fortran order) of array ``key`` of an .npz."""
    stream = archive.open(f"{key}.npy")
    shape, fortran, dtype = npy_header(stream)
    return stream, shape, dtype, fortran


def _values(stream, dtype, count: int, chunk: int, rel: str):
    """``count`` values of ``dtype`` from ``stream``, ``chunk`` at a time."""
    while count > 0:
        m = min(chunk, count)
        raw = stream.read(m * dtype.itemsize)
        require(len(raw) == m * dtype.itemsize, rel, "an array ends early (a cut file)")
        yield np.frombuffer(raw, dtype)
        count -= m


def _edge_index(archive, rel: str, n: int):
    """(sources, destinations) of the .npz's edge_index (2 x E), as int32 (int64 from 2^31
    nodes) host arrays, read a chunk at a time; ids outside [0, n) make the file Damaged."""
    stream, shape, dtype, fortran = _member(archive, "edge_index")
    num_edges = shape[1]
    out = np.empty((2, num_edges), dtype=np.int32 if n < 2 ** 31 else np.int64)
    written = 0  # values read: C order holds all sources, then all destinations;
    # Fortran order (source, destination) pairs (an even number a chunk)
    for values in _values(stream, dtype, 2 * num_edges, 2 * CHUNK_EDGES, rel):
        in_range(values, n, rel, "'edge_index' node ids")
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


def _node_features(archive, rel: str, n: int, device) -> torch.Tensor:
    """node_feat (N x F) as float32 host rows (pinned for a GPU), read a chunk at a time."""
    stream, shape, dtype, fortran = _member(archive, "node_feat")
    require(dtype.kind == "f" and not fortran, rel,
            f"'node_feat' holds {dtype}{' in Fortran order' if fortran else ''}, not floats "
            "in C order")
    features = host_rows(shape, torch.float32, device)
    flat = features.view(-1)
    written = 0
    for values in _values(stream, dtype, n * shape[1], FEATURE_CHUNK_ROWS * shape[1], rel):
        flat[written:written + values.size] = torch.from_numpy(values.astype(np.float32))
        written += values.size
    return features


def _read_labels(folder, files, n: int):
    """(labels: int64, -1 outside the splits; the train, valid and test node ids): every
    node of a split labelled with a class."""
    rel = files[1]
    labels = npz_array(folder, rel, "node_label").reshape(-1)
    splits = [table_column(folder, f) for f in files[2:]]
    ids = np.concatenate(splits)
    require(np.issubdtype(labels.dtype, np.number), rel, f"labels of {labels.dtype}")
    labelled = labels[ids]
    bad = ~(np.isfinite(labelled) & (labelled >= 0) & (labelled < PAPERS_CLASSES)
            & (labelled == np.round(labelled)))
    if bad.any():
        first = int(np.argmax(bad))
        raise Damaged(rel, f"node {int(ids[first])} of a split has the label "
                           f"{labelled[first]}, not a class 0..{PAPERS_CLASSES - 1}")
    labels = torch.from_numpy(np.where(np.isnan(labels), -1, labels).astype(np.int64))
    return labels, splits
