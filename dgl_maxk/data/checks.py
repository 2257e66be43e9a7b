"""What the raw files of each real dataset must agree on, checked before DGL or OGB reads
them: each file read by its format (:mod:`.formats`), then the sizes, counts and index ranges
that its format implies across the dataset's files. A file that breaks them raises
:class:`~.formats.Damaged` naming it.

DGL and OGB fail on some damaged files with the parser's own words, and train on what is left
of others: a cut ``ind.*.test.index`` gives a smaller test split, a CSV table re-packed with
fewer rows a graph with fewer edges, a split listing a node twice or one that does not exist
a wrong mask. Where two files disagree, the one a cut or a stray edit can leave readable is
named (the index list, not the pickle; the table, not the count it must match).
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from .files import OGB_SPECS, PAPERS, PLANETOID, PLANETOID_PARTS
from .formats import (Damaged, in_range, npy_shape, npz_array, npz_shapes, read_integers,
                      read_json, read_pickle, require, sparse_shape, table_column,
                      table_stats)

#: The planetoid split: the training nodes are the rows of ``x``, the next ones validation.
PLANETOID_VALIDATION = 500


def _planetoid_parts(folder: Path, rel: dict) -> dict:
    """The seven pickles of a planetoid dataset, each of the type its name says."""
    parts = {part: read_pickle(folder, rel[part]) for part in PLANETOID_PARTS[:7]}
    for part in ("x", "tx", "allx"):
        require(sp.issparse(parts[part]) and parts[part].ndim == 2, rel[part],
                "not a scipy sparse feature matrix")
    for part in ("y", "ty", "ally"):
        labels = parts[part]
        require(isinstance(labels, np.ndarray) and labels.ndim == 2, rel[part],
                "not a 2-D array of one-hot labels")
        require(np.isin(labels, (0, 1)).all(), rel[part], "labels other than 0 and 1")
    require(isinstance(parts["graph"], dict), rel["graph"], "not a dict of adjacency lists")
    return parts


def _planetoid_sizes(parts: dict, rel: dict) -> None:
    """Feature widths, label widths and row counts that must agree between the pickles."""
    width, classes = parts["allx"].shape[1], parts["ally"].shape[1]
    for feats, labels in (("x", "y"), ("tx", "ty"), ("allx", "ally")):
        rows = parts[feats].shape[0]
        require(parts[feats].shape[1] == width, rel[feats],
                f"{parts[feats].shape[1]} feature columns, but {rel['allx']} has {width}")
        require(parts[labels].shape[1] == classes, rel[labels],
                f"{parts[labels].shape[1]} label columns, but {rel['ally']} has {classes}")
        require(parts[labels].shape[0] == rows, rel[labels],
                f"{parts[labels].shape[0]} label rows for the {rows} rows of {rel[feats]}")
    labelled = parts["y"].shape[0] + PLANETOID_VALIDATION
    require(labelled <= parts["allx"].shape[0], rel["y"],
            f"{parts['y'].shape[0]} training rows and {PLANETOID_VALIDATION} validation "
            f"nodes after them: more than the {parts['allx'].shape[0]} rows of {rel['allx']}")


def _planetoid_test_nodes(folder: Path, rel: dict, parts: dict, gaps: bool) -> int:
    """The test node ids: one per row of ``tx``, distinct, numbered on from the rows of
    ``allx`` (with ids left out only where ``gaps``: citeseer's isolated nodes). Returns the
    number of nodes."""
    index, name = read_integers(folder, rel["test.index"]), rel["test.index"]
    tests, first = parts["tx"].shape[0], parts["allx"].shape[0]
    require(len(index) == tests, name,
            f"{len(index)} test node ids, but {rel['tx']} has {tests} rows")
    require(len(np.unique(index)) == tests, name, "a node id listed twice")
    if tests == 0:
        return first
    last = first + tests - 1
    require(index.min() == first and (gaps or index.max() == last), name,
            f"node ids from {index.min()} to {index.max()}; the {tests} test nodes follow the "
            f"{first} rows of {rel['allx']}: {first} to {last}")
    return int(index.max()) + 1


def _planetoid_graph(graph: dict, nodes: int, rel: str) -> None:
    """Every node of the adjacency lists is a node of the dataset, and every node is in
    them (DGL's graph takes its node count from them)."""
    ids = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
    ends = np.fromiter((v for adjacent in graph.values() for v in adjacent), dtype=np.int64)
    in_range(np.concatenate([ids, ends]), nodes, rel, "node ids")
    found = len(np.unique(np.concatenate([ids, ends])))
    require(found == nodes, rel, f"{found} nodes, not the {nodes} of the features")


def _planetoid(name: str, folder: Path, files) -> None:
    rel = dict(zip(PLANETOID_PARTS, files))
    parts = _planetoid_parts(folder, rel)
    _planetoid_sizes(parts, rel)
    nodes = _planetoid_test_nodes(folder, rel, parts, gaps=name == "citeseer")
    try:
        _planetoid_graph(parts["graph"], nodes, rel["graph"])
    except (TypeError, ValueError) as err:  # keys or lists of something else than ids
        raise Damaged(rel["graph"], "its adjacency lists hold something else than node "
                                    f"ids ({type(err).__name__})") from err


def _reddit(name: str, folder: Path, files) -> None:
    graph, data = files
    shapes = npz_shapes(folder, data)
    require({"feature", "label", "node_types"} <= set(shapes), data,
            "it lacks one of the arrays feature, label, node_types")
    require(len(shapes["feature"]) == 2, data, f"features of shape {shapes['feature']}")
    nodes = shapes["feature"][0]
    for member in ("label", "node_types"):
        require(shapes[member] == (nodes,), data,
                f"'{member}' of shape {shapes[member]}, not ({nodes},) as 'feature'")
    in_range(npz_array(folder, data, "label"), np.iinfo(np.int64).max, data, "labels")
    require(np.isin(npz_array(folder, data, "node_types"), (1, 2, 3)).all(), data,
            "node types other than 1, 2, 3 (train, validation, test)")
    _square(folder, graph, nodes, data)


def _square(folder: Path, rel: str, nodes: int, features: str) -> None:
    shape = sparse_shape(folder, rel)
    require(shape == (nodes, nodes), rel,
            f"an adjacency matrix of shape {shape}, but {features} has {nodes} nodes")


def _saint_labels(class_map, nodes: int, rel: str) -> None:
    """One label per node, keyed '0' .. 'N-1': a class number, or (multi-label) a list of
    0/1 of one length."""
    require(isinstance(class_map, dict) and len(class_map) == nodes
            and set(class_map) == {str(i) for i in range(nodes)}, rel,
            f"not one label for each of the {nodes} nodes, keyed '0' to '{nodes - 1}'")
    try:
        labels = np.array(list(class_map.values()))
    except ValueError as err:  # lists of different lengths
        raise Damaged(rel, "multi-label lists of different lengths") from err
    require(np.issubdtype(labels.dtype, np.integer) and labels.ndim in (1, 2), rel,
            "labels that are not all class numbers or all lists of 0 and 1")
    if labels.ndim == 2:
        require(np.isin(labels, (0, 1)).all(), rel, "multi-label lists with other than 0, 1")
    else:
        in_range(labels, np.iinfo(np.int64).max, rel, "class numbers")


def _disjoint_splits(parts: dict, nodes: int) -> None:
    """Each split's node ids in range and distinct, and no id in two splits; ``parts``: the
    split's name -> (the file that lists it, its ids), in order."""
    seen = np.zeros(nodes, dtype=bool)
    for part, (rel, ids) in parts.items():
        in_range(ids, nodes, rel, f"'{part}' node ids")
        require(len(np.unique(ids)) == len(ids), rel, f"a node id twice in '{part}'")
        require(not seen[ids].any(), rel, f"'{part}' shares node ids with an earlier split")
        seen[ids] = True


def _saint(name: str, folder: Path, files) -> None:
    adj, feats, class_map, role = files
    shape = npy_shape(folder, feats)
    require(len(shape) == 2, feats, f"features of shape {shape}")
    nodes = shape[0]
    _square(folder, adj, nodes, feats)
    _saint_labels(read_json(folder, class_map), nodes, class_map)
    splits = read_json(folder, role)
    require(isinstance(splits, dict) and {"tr", "va", "te"} <= set(splits), role,
            "not a dict with the node lists 'tr', 'va', 'te'")
    try:
        ids = {part: np.asarray(splits[part], dtype=np.int64) for part in ("tr", "va", "te")}
    except (TypeError, ValueError) as err:
        raise Damaged(role, "its node lists hold something else than node ids") from err
    for part, values in ids.items():
        require(values.ndim == 1, role, f"'{part}' is not a list of node ids")
    _disjoint_splits({part: (role, values) for part, values in ids.items()}, nodes)


class Table(NamedTuple):
    """What an OGB raw table holds: a row per node or per edge, of integers or numbers,
    ``columns`` of them if fixed, none below ``low``, and all of them node ids if ``ids``."""

    rows: str
    integers: bool
    columns: int | None = None
    low: int | None = None
    ids: bool = False


OGB_TABLES = {
    "edge.csv.gz": Table("edges", True, 2, ids=True),
    "edge-feat.csv.gz": Table("edges", False),
    "node-feat.csv.gz": Table("nodes", False),
    "node-label.csv.gz": Table("nodes", True, low=0),
    "node_year.csv.gz": Table("nodes", True, 1),
    "node_species.csv.gz": Table("nodes", True, 1),
}


def _ogb_count(folder: Path, rel: str, low: int) -> int:
    """The single number of num-node-list / num-edge-list (one graph)."""
    rows, cols, value, _ = table_stats(folder, rel, np.int64)
    require(rows == 1 and cols == 1, rel,
            f"{rows} rows of {cols} numbers, not one number (the dataset is one graph)")
    require(value >= low, rel, f"the count {int(value)}")
    return int(value)


def _ogb(name: str, folder: Path, files) -> None:
    counts = {"nodes": _ogb_count(folder, "raw/num-node-list.csv.gz", 1),
              "edges": _ogb_count(folder, "raw/num-edge-list.csv.gz", 0)}
    for rel in files:
        table = OGB_TABLES.get(Path(rel).name)
        if table is None:
            continue
        if rel == "raw/node_species.csv.gz" and not (folder / rel).is_file():
            rel = "raw/species.csv.gz"  # the official zip's name, which OGB renames
        rows, cols, low, high = table_stats(folder, rel, np.int64 if table.integers
                                            else np.float64)
        expected = counts[table.rows]
        source = f"num-{table.rows[:-1]}-list.csv.gz"
        require(rows == expected, rel, f"{rows} rows, but {source} says {expected} {table.rows}")
        require(table.columns in (None, cols), rel, f"{cols} columns, not {table.columns}")
        if rows:
            require(table.low is None or low >= table.low, rel, f"a value {int(low)} < 0")
            require(not table.ids or (low >= 0 and high < counts["nodes"]), rel,
                    f"node ids from {int(low)} to {int(high)}, outside 0.."
                    f"{counts['nodes'] - 1}")


def check_ogb_split(folder: Path, files, nodes: int) -> None:
    """An OGB dataset's split (read on every load): node ids in range, distinct, and in one
    of train, valid, test only."""
    _disjoint_splits({Path(rel).name.split(".")[0]: (rel, table_column(folder, rel))
                      for rel in files if rel.startswith("split/")}, nodes)


def _papers(name: str, folder: Path, files) -> None:
    """ogbn-papers100M's arrays (from their headers: its 26 GB edge list is read later, a
    chunk at a time, its ids checked then) and its split."""
    data, labels = files[:2]
    shapes = npz_shapes(folder, data)
    require({"edge_index", "node_feat", "num_nodes_list"} <= set(shapes), data,
            "it lacks one of the arrays edge_index, node_feat, num_nodes_list")
    counts = npz_array(folder, data, "num_nodes_list")
    require(counts.shape == (1,) and np.issubdtype(counts.dtype, np.integer)
            and counts[0] >= 1, data,
            f"'num_nodes_list' is {counts.tolist()}, not one node count (the dataset is one "
            "graph)")
    nodes = int(counts[0])
    require(len(shapes["edge_index"]) == 2 and shapes["edge_index"][0] == 2, data,
            f"'edge_index' of shape {shapes['edge_index']}, not 2 x E")
    require(len(shapes["node_feat"]) == 2 and shapes["node_feat"][0] == nodes, data,
            f"'node_feat' of shape {shapes['node_feat']}, not a row for each of the {nodes} "
            "nodes of 'num_nodes_list'")
    label = npz_shapes(folder, labels).get("node_label")
    require(label in ((nodes,), (nodes, 1)), labels,
            f"'node_label' of shape {label}, not a label for each of the {nodes} nodes of "
            f"{data}")
    check_ogb_split(folder, files, nodes)


_RULES = {**{name: _planetoid for name in PLANETOID}, **{name: _ogb for name in OGB_SPECS},
          "reddit": _reddit, "flickr": _saint, "yelp": _saint, PAPERS: _papers}


def check_raw(name: str, folder: Path, files) -> None:
    """Check the raw files of a real dataset (``files``: its layout, relative to
    ``folder``) before DGL or OGB processes them; Damaged names the first bad one."""
    _RULES[name](name, folder, files)
