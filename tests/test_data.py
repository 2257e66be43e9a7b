"""dgl_maxk.data: loaders on small fake datasets written in the real on-disk layouts, the
generators, and the fail-fast messages for missing data."""
from __future__ import annotations

import builtins
import gzip
import json
import os
import shutil
import stat
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import dgl_maxk  # noqa: F401  (imports DGL through the package's compatibility fix)
from dgl_maxk import data as D
from dgl_maxk.data.files import PAPERS, PAPERS_FILES

#: Cora's raw files, shared by every test: read only through :func:`copy_cora` (a load from
#: the shared folder itself writes DGL's processed cache there whenever it is writable).
SHARED_CORA = Path(__file__).resolve().parents[2] / "shared/data/dgl-raw/cora_v2_d697a464"

needs_cora = pytest.mark.skipif(not SHARED_CORA.is_dir(),
                                reason=f"Cora's raw files are not at {SHARED_CORA}")


# --------------------------------------------------------------------------- fake layouts


def _fake_graph(n, m, rng):
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    keep = src != dst
    return src[keep], dst[keep]


def write_fake_reddit(root: Path, n=60, m=300, feats=7, classes=4, seed=0):
    """DGL's Reddit layout: <root>/reddit_69f818f5/{reddit_graph.npz, reddit_data.npz}."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    src, dst = _fake_graph(n, m, rng)
    folder = root / "reddit_69f818f5"
    folder.mkdir(parents=True)
    adj = sp.coo_matrix((np.ones(len(src), dtype=np.float32), (src, dst)), shape=(n, n))
    sp.save_npz(folder / "reddit_graph.npz", adj)
    features = rng.normal(size=(n, feats)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    labels[:classes] = np.arange(classes)
    node_types = np.array([1] * (n // 2) + [2] * (n // 4) + [3] * (n - n // 2 - n // 4))
    np.savez(folder / "reddit_data.npz", feature=features, label=labels,
             node_types=node_types)
    return folder, features, labels, node_types, (src, dst)


def write_fake_saint(root: Path, folder_name, n=50, m=200, feats=6, classes=5,
                     multilabel=False, seed=0):
    """The GraphSAINT layout of DGL's Flickr/Yelp: adj_full.npz, feats.npy, class_map.json,
    role.json."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    src, dst = _fake_graph(n, m, rng)
    folder = root / folder_name
    folder.mkdir(parents=True)
    adj = sp.csr_matrix((np.ones(len(src), dtype=np.float32), (src, dst)), shape=(n, n))
    sp.save_npz(folder / "adj_full.npz", adj)
    features = rng.normal(size=(n, feats)).astype(np.float32)
    np.save(folder / "feats.npy", features)
    if multilabel:
        labels = (rng.random((n, classes)) < 0.3).astype(int)
        class_map = {str(i): labels[i].tolist() for i in range(n)}
    else:
        labels = rng.integers(0, classes, n)
        labels[:classes] = np.arange(classes)
        class_map = {str(i): int(labels[i]) for i in range(n)}
    (folder / "class_map.json").write_text(json.dumps(class_map))
    perm = rng.permutation(n).tolist()
    role = {"tr": perm[: n // 2], "va": perm[n // 2: 3 * n // 4], "te": perm[3 * n // 4:]}
    (folder / "role.json").write_text(json.dumps(role))
    return folder, features, labels, role


def _csv_gz(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def write_fake_ogb(root: Path, name, n=40, m=120, release=True, seed=0):
    """The official OGB zip of an ogbn dataset, unpacked and renamed: <root>/ogbn_<x>/ with
    RELEASE_v1.txt, raw/*.csv.gz and split/<kind>/{train,valid,test}.csv.gz."""
    rng = np.random.default_rng(seed)
    folder = root / name.replace("-", "_")
    src, dst = _fake_graph(n, m, rng)
    edges = np.stack([src, dst], 1)
    _csv_gz(folder / "raw/edge.csv.gz", edges)
    _csv_gz(folder / "raw/num-node-list.csv.gz", [n])
    _csv_gz(folder / "raw/num-edge-list.csv.gz", [len(src)])
    out = {"folder": folder, "edges": edges}
    if name == "ogbn-proteins":
        efeat = rng.random((len(src), 8)).round(3)
        _csv_gz(folder / "raw/edge-feat.csv.gz", efeat)
        labels = (rng.random((n, 112)) < 0.5).astype(int)
        _csv_gz(folder / "raw/node-label.csv.gz", labels)
        _csv_gz(folder / "raw/node_species.csv.gz", rng.integers(0, 3, n))
        split = "species"
        out.update(efeat=efeat, labels=labels)
    else:
        feats = rng.normal(size=(n, 5)).round(4)
        _csv_gz(folder / "raw/node-feat.csv.gz", feats)
        labels = rng.integers(0, 40 if name == "ogbn-arxiv" else 47, n)
        _csv_gz(folder / "raw/node-label.csv.gz", labels)
        if name == "ogbn-arxiv":
            _csv_gz(folder / "raw/node_year.csv.gz", rng.integers(2000, 2020, n))
        split = "time" if name == "ogbn-arxiv" else "sales_ranking"
        out.update(feats=feats, labels=labels)
    perm = rng.permutation(n)
    parts = {"train": perm[: n // 2], "valid": perm[n // 2: 3 * n // 4],
             "test": perm[3 * n // 4:]}
    for part, idx in parts.items():
        _csv_gz(folder / f"split/{split}/{part}.csv.gz", idx)
    if release:
        (folder / "RELEASE_v1.txt").write_text("fake release\n")
    out["split"] = parts
    return out


def papers_files(root: Path, n=300, fortran=False):
    """ogbn-papers100M's files in OGB's layout, tiny: (sources, destinations, features,
    labels, splits) written, citations some both ways, nodes outside the splits unlabelled
    (NaN), features float16 (the loader makes them float32)."""
    src, dst = torch.randint(0, n, (2000,)), torch.randint(0, n, (2000,))
    src[:50], dst[:50] = dst[50:100], src[50:100]
    feat = torch.randn(n, 6).to(torch.float16)
    label = torch.randint(0, 172, (n,)).double()
    perm = torch.randperm(n)
    splits = {"train": perm[:40], "valid": perm[40:60], "test": perm[60:90]}
    label[perm[90:]] = float("nan")
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    (folder / "split" / "time").mkdir(parents=True)
    edges = np.stack([src.numpy(), dst.numpy()])
    np.savez_compressed(folder / "raw" / "data.npz",
                        edge_index=np.asfortranarray(edges) if fortran else edges,
                        node_feat=feat.numpy(), num_nodes_list=np.array([n]),
                        num_edges_list=np.array([src.numel()]))
    np.savez_compressed(folder / "raw" / "node-label.npz", node_label=label.numpy()[:, None])
    for name, index in splits.items():
        with gzip.open(folder / "split" / "time" / f"{name}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in index.tolist()))
    return src, dst, feat, label, splits


@pytest.fixture
def no_prompt(monkeypatch):
    """OGB must never reach its interactive prompt: input() fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("OGB asked an interactive question (input() was called)")
    monkeypatch.setattr(builtins, "input", refuse)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("DGL_MAXK_CACHE", str(path))
    return path


def _edge_set(graph):
    s, d = graph.edges()
    return set(zip(s.tolist(), d.tolist()))


# --------------------------------------------------------------------------- DGL layouts


def test_reddit_layout(tmp_path):
    folder, features, labels, node_types, (src, dst) = write_fake_reddit(tmp_path)
    ds = D.load_dataset("reddit", root=tmp_path)
    n = len(labels)
    assert ds.num_nodes == n and ds.num_classes == 4 and not ds.multilabel
    assert ds.metric == "accuracy"
    assert (ds.train_mask.sum(), ds.val_mask.sum(), ds.test_mask.sum()) == \
        ((node_types == 1).sum(), (node_types == 2).sum(), (node_types == 3).sum())
    # DGL reorders Reddit's nodes; the (feature, label, split) rows must still match up
    rows = {tuple(np.round(f, 5)): (l, t) for f, l, t in zip(features, labels, node_types)}
    split = torch.where(ds.train_mask, 1, torch.where(ds.val_mask, 2, 3))
    for f, l, t in zip(ds.features.numpy(), ds.labels.tolist(), split.tolist()):
        assert rows[tuple(np.round(f, 5))] == (l, t)
    # self-loops: exactly one per node, plus the original (directed) edges
    s, d = ds.graph.edges()
    assert int((s == d).sum()) == n
    assert ds.graph.num_edges() == len(src) + n


def test_reddit_without_self_loops(tmp_path):
    write_fake_reddit(tmp_path)
    ds = D.load_dataset("reddit", root=tmp_path, self_loops=False)
    s, d = ds.graph.edges()
    assert int((s == d).sum()) == 0


def test_flickr_layout(tmp_path):
    folder, features, labels, role = write_fake_saint(tmp_path, "flickr_b05c56ca")
    ds = D.load_dataset("flickr", root=tmp_path)
    assert torch.allclose(ds.features, torch.from_numpy(features))
    assert torch.equal(ds.labels, torch.from_numpy(labels))
    assert sorted(ds.train_mask.nonzero().flatten().tolist()) == sorted(role["tr"])
    assert sorted(ds.test_mask.nonzero().flatten().tolist()) == sorted(role["te"])
    assert not ds.multilabel and ds.num_classes == 5


def test_yelp_layout_is_multilabel(tmp_path):
    folder, features, labels, role = write_fake_saint(tmp_path, "yelp_76020611",
                                                      multilabel=True, classes=9)
    ds = D.load_dataset("yelp", root=tmp_path)
    assert ds.multilabel and ds.metric == "micro_f1" and ds.num_classes == 9
    assert ds.labels.dtype == torch.float32
    assert torch.equal(ds.labels, torch.from_numpy(labels).float())


@pytest.mark.parametrize("name", ["reddit", "flickr", "yelp", "cora", "citeseer", "pubmed"])
def test_missing_dgl_dataset_fails_fast_naming_files(tmp_path, name):
    start = time.monotonic()
    with pytest.raises(D.DatasetNotFound) as err:
        D.load_dataset(name, root=tmp_path)
    assert time.monotonic() - start < 5
    folder, files, _ = D.dgl_layout(name, tmp_path)
    msg = str(err.value)
    assert msg.splitlines()[0] == \
        f"dataset '{name}' is not on disk: its folder {folder}/ does not exist"
    assert all(msg.count(f) == 1 for f in files)  # each named once
    assert not any(tmp_path.iterdir()), "a failed load must not create anything"


def test_reddit_folder_name_is_dgls():
    folder, files, _ = D.dgl_layout("reddit", "/r")
    assert folder == Path("/r/reddit_69f818f5")
    assert files == ("reddit_graph.npz", "reddit_data.npz")
    assert D.dgl_layout("cora", "/r")[0] == Path("/r/cora_v2_d697a464")


def test_partial_dgl_dataset_names_missing_file(tmp_path):
    folder, *_ = write_fake_reddit(tmp_path)
    (folder / "reddit_data.npz").unlink()
    with pytest.raises(D.DatasetNotFound) as err:
        D.load_dataset("reddit", root=tmp_path)
    assert str(err.value).splitlines()[0] == \
        f"dataset 'reddit' is not on disk: missing from {folder}/: reddit_data.npz"


@pytest.mark.parametrize("case", ["no_root", "root_is_file", "no_folder", "empty_folder",
                                  "one_missing"])
def test_missing_dataset_leads_with_one_error_line(tmp_path, capsys, case):
    """The command line's error names what is missing and where in its first line; the
    files to place follow."""
    from dgl_maxk.cli import EXIT_DATA, main
    root = tmp_path / "data"
    folder, files, _ = D.dgl_layout("cora", root)
    if case == "root_is_file":
        root.write_text("")
    elif case != "no_root":
        folder.mkdir(parents=True, exist_ok=True)
    if case == "one_missing":
        for name in files[1:]:
            (folder / name).write_bytes(b"")
    expected = {"no_root": f"the data root {root} does not exist",
                "root_is_file": f"the data root {root} is a file, not a folder",
                "no_folder": f"its folder {folder}/ does not exist",
                "empty_folder": f"none of its 8 files is in {folder}/",
                "one_missing": f"missing from {folder}/: {files[0]}"}[case]
    if case == "no_folder":
        folder.rmdir()
    config = Path(__file__).resolve().parents[1] / "configs/cora_sage.yaml"
    status = main(["train", "--config", str(config), "--set", f"dataset.root={root}",
                   "--out", str(tmp_path / "runs")])
    first, *rest = capsys.readouterr().err.splitlines()
    assert status == EXIT_DATA
    assert first == f"error: dataset 'cora' is not on disk: {expected}"
    assert [line.strip() for line in rest[1:9]] == list(files)
    assert not (tmp_path / "runs").exists()


def test_data_root_from_environment(tmp_path, monkeypatch):
    write_fake_saint(tmp_path, "flickr_b05c56ca")
    monkeypatch.setenv("DGL_MAXK_DATA", str(tmp_path))
    assert D.data_root() == tmp_path
    assert D.load_dataset("flickr").num_nodes == 50
    monkeypatch.delenv("DGL_MAXK_DATA")
    assert D.data_root() == Path("data")


def test_read_only_raw_dir_is_copied_not_written(tmp_path, cache_dir):
    folder, *_ = write_fake_saint(tmp_path / "ro", "flickr_b05c56ca")
    before = sorted(p.name for p in folder.iterdir())
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        ds = D.load_dataset("flickr", root=tmp_path / "ro")
        assert sorted(p.name for p in folder.iterdir()) == before
        copies = list(cache_dir.rglob("flickr_b05c56ca"))
        assert len(copies) == 1 and (copies[0] / "dgl_graph.bin").exists()
        again = D.load_dataset("flickr", root=tmp_path / "ro")  # from the cached copy
        assert torch.equal(again.features, ds.features)
    finally:
        folder.chmod(0o755)


# --------------------------------------------------------------------------- OGB layouts


def test_ogbn_arxiv_layout(tmp_path, no_prompt, cache_dir):
    fake = write_fake_ogb(tmp_path, "ogbn-arxiv")
    ds = D.load_dataset("ogbn-arxiv", root=tmp_path)
    assert ds.num_classes == 40 and ds.evaluator == "ogbn-arxiv"
    assert torch.allclose(ds.features, torch.tensor(fake["feats"], dtype=torch.float32))
    assert torch.equal(ds.labels, torch.as_tensor(fake["labels"]))
    assert sorted(ds.train_mask.nonzero().flatten().tolist()) == \
        sorted(fake["split"]["train"].tolist())
    # made bidirected (citations are directed), with self-loops
    edges = _edge_set(ds.graph)
    for s, d in fake["edges"]:
        assert (s, d) in edges and (d, s) in edges
    assert all((i, i) in edges for i in range(ds.num_nodes))
    directed = D.load_dataset("ogbn-arxiv", root=tmp_path, self_loops=False,
                              to_bidirected=False)
    assert _edge_set(directed.graph) == set(map(tuple, fake["edges"].tolist()))


def test_ogbn_proteins_features_are_summed_edge_features(tmp_path, no_prompt):
    fake = write_fake_ogb(tmp_path, "ogbn-proteins")
    ds = D.load_dataset("ogbn-proteins", root=tmp_path, self_loops=False)
    assert ds.multilabel and ds.num_classes == 112 and ds.metric == "rocauc"
    assert torch.equal(ds.labels, torch.tensor(fake["labels"], dtype=torch.float32))
    # OGB adds the inverse of each edge (same features): node i sums every edge touching it
    expected = np.zeros((ds.num_nodes, 8))
    for (s, d), f in zip(fake["edges"], fake["efeat"]):
        expected[d] += f
        expected[s] += f
    assert np.allclose(ds.features.numpy(), expected, atol=1e-4)


def test_ogb_without_release_file_fails_fast_without_prompt(tmp_path, no_prompt):
    fake = write_fake_ogb(tmp_path, "ogbn-arxiv", release=False)
    start = time.monotonic()
    with pytest.raises(D.DatasetNotFound) as err:
        D.load_dataset("ogbn-arxiv", root=tmp_path)
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert "RELEASE_v1.txt" in msg and str(fake["folder"]) in msg
    assert msg.splitlines()[0] == \
        f"dataset 'ogbn-arxiv' is not on disk: missing from {fake['folder']}/: RELEASE_v1.txt"
    # nothing was deleted or processed
    assert (fake["folder"] / "raw" / "edge.csv.gz").exists()
    assert not (fake["folder"] / "processed").exists()


def test_missing_ogb_dataset_lists_layout(tmp_path, no_prompt):
    with pytest.raises(D.DatasetNotFound) as err:
        D.load_dataset("ogbn-products", root=tmp_path)
    msg = str(err.value)
    for f in ("RELEASE_v1.txt", "raw/edge.csv.gz", "raw/node-feat.csv.gz",
              "split/sales_ranking/train.csv.gz"):
        assert f in msg
    assert str(tmp_path / "ogbn_products") in msg and "products.zip" in msg
    assert msg.splitlines()[0] == ("dataset 'ogbn-products' is not on disk: its folder "
                                   f"{tmp_path / 'ogbn_products'}/ does not exist")
    assert not any(tmp_path.iterdir())


def test_missing_ogbn_papers100m_lists_its_files(tmp_path):
    folder = tmp_path / "ogbn_papers100M"
    with pytest.raises(D.DatasetNotFound) as err:
        D.load_dataset("ogbn-papers100M", root=tmp_path, device="cpu")
    first, *rest = str(err.value).splitlines()
    assert first == f"dataset 'ogbn-papers100m' is not on disk: its folder {folder}/ does not exist"
    assert "papers100M-bin.zip" in rest[0] and [line.strip() for line in rest[1:6]] == list(
        PAPERS_FILES)
    papers_files(tmp_path)
    (folder / PAPERS_FILES[-1]).unlink()
    with pytest.raises(D.DatasetNotFound, match=rf"missing from {folder}/: {PAPERS_FILES[-1]}"):
        D.load_dataset("ogbn-papers100M", root=tmp_path, device="cpu")
    assert D.layout("ogbn-papers100M", tmp_path) == f"{folder}/ {{{', '.join(PAPERS_FILES)}}}"


# --------------------------------------------------------------------------- Cora (real)


def copy_cora(root: Path) -> Path:
    """A private, writable copy of Cora's raw files (only those: not a processed cache that
    the shared folder may hold) in ``root``'s Cora folder, which it returns."""
    _, files, _ = D.dgl_layout("cora", root)
    folder = root / SHARED_CORA.name
    folder.mkdir(parents=True)
    for name in files:
        shutil.copyfile(SHARED_CORA / name, folder / name)
    return folder


def _listing(folder: Path) -> list:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


@needs_cora
def test_cora_from_a_copy_of_the_shared_files(tmp_path):
    shared = _listing(SHARED_CORA)
    folder = copy_cora(tmp_path)
    ds = D.load_dataset("cora", root=tmp_path)
    assert ds.num_nodes == 2708 and ds.num_features == 1433 and ds.num_classes == 7
    assert (int(ds.train_mask.sum()), int(ds.val_mask.sum()), int(ds.test_mask.sum())) == \
        (140, 500, 1000)
    assert ds.graph.num_edges() == 10556 + 2708  # the directed edges plus self-loops
    assert all((folder / f).is_file() for f in D.files.dgl_cache_files("cora"))  # in the copy
    assert _listing(SHARED_CORA) == shared


# --------------------------------------------------------------------------- generators


def test_planted_is_reproducible_from_seed():
    a = D.load_dataset("planted", num_nodes=300, seed=3)
    b = D.load_dataset("planted", num_nodes=300, seed=3)
    c = D.load_dataset("planted", num_nodes=300, seed=4)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert _edge_set(a.graph) == _edge_set(b.graph)
    assert torch.equal(a.train_mask, b.train_mask)
    assert not torch.equal(a.features, c.features)
    assert _edge_set(a.graph) != _edge_set(c.graph)


def test_planted_parameters_shape_the_graph():
    ds = D.load_dataset("planted", num_nodes=3000, num_classes=4, mean_degree=12,
                        homophily=0.9, num_features=16, self_loops=False, seed=1)
    s, d = ds.graph.edges()
    assert ds.num_classes == 4 and ds.num_features == 16
    assert abs(ds.graph.num_edges() / 3000 - 12) < 1.0
    same = (ds.labels[s] == ds.labels[d]).float().mean().item()
    assert abs(same - 0.9) < 0.03
    assert _edge_set(ds.graph) == {(b, a) for a, b in _edge_set(ds.graph)}  # undirected
    assert int((s == d).sum()) == 0
    # the masks partition the nodes
    total = ds.train_mask.int() + ds.val_mask.int() + ds.test_mask.int()
    assert torch.equal(total, torch.ones_like(total))
    # features carry the class signal: class means differ far more than the noise allows
    means = torch.stack([ds.features[ds.labels == c].mean(0) for c in range(4)])
    assert torch.cdist(means, means).fill_diagonal_(9).min() > 0.5


def test_planted_p_in_p_out():
    ds = D.load_dataset("planted", num_nodes=2000, num_classes=2, p_in=0.01, p_out=0.002,
                        self_loops=False)
    s, d = ds.graph.edges()
    # expected degree 0.01 * 999 + 0.002 * 1000 ~ 12, homophily ~ 0.83
    assert abs(ds.graph.num_edges() / 2000 - 12) < 1.0
    assert abs((ds.labels[s] == ds.labels[d]).float().mean().item() - 0.833) < 0.03


def test_powerlaw_is_reproducible_and_sized():
    a = D.load_dataset("powerlaw", num_nodes=2000, mean_degree=20, num_features=8, seed=5,
                       self_loops=False)
    b = D.load_dataset("powerlaw", num_nodes=2000, mean_degree=20, num_features=8, seed=5,
                       self_loops=False)
    c = D.load_dataset("powerlaw", num_nodes=2000, mean_degree=20, num_features=8, seed=6,
                       self_loops=False)
    assert a.graph.num_edges() == 40000
    assert torch.equal(a.graph.edges()[0], b.graph.edges()[0])
    assert torch.equal(a.graph.edges()[1], b.graph.edges()[1])
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.graph.edges()[0], c.graph.edges()[0])
    deg = a.graph.in_degrees().float()
    assert deg.max() > 5 * deg.mean()  # heavy-tailed
    assert "random" in a.notes


def test_unknown_dataset_and_params():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        D.load_dataset("mnist")
    with pytest.raises(ValueError, match=r"params\.nodes"):
        D.load_dataset("planted", nodes=10)
    with pytest.raises(ValueError, match=r"params\.num_nodes' must be an integer"):
        D.load_dataset("planted", num_nodes=10.5)
    with pytest.raises(ValueError, match=r"unknown key 'params\.seed' for dataset 'cora'"):
        D.load_dataset("cora", seed=1)
    assert D.canonical_name("OGBN_Arxiv") == "ogbn-arxiv"


@pytest.fixture
def rng():
    """A numpy generator from the test's seed (conftest: fresh per test, reported on failure)."""
    return np.random.default_rng(np.random.randint(2**31))


def test_public_names():
    for name in D.__all__:
        assert getattr(D, name) is not None, name
    assert D.power_law_csr is D.generators.power_law_csr


def test_power_law_csr_rows_list_their_sources_in_ascending_order():
    from dgl_maxk.sparse import GraphPlan
    seed = int(torch.randint(0, 2 ** 31, ()))
    indptr, indices = D.power_law_csr(300, 5000, seed=seed, num_src=70)
    rows = torch.repeat_interleave(torch.arange(300), indptr.diff())
    key = rows * 70 + indices
    assert bool((key[1:] >= key[:-1]).all()), seed
    assert GraphPlan(indptr, indices, None, 70, 300).rows_sorted_by_source()
    assert int(indices.min()) >= 0 and int(indices.max()) < 70


# --------------------------------------------------------------------------- parameter ranges


@pytest.mark.parametrize("name,params,expected", [
    ("planted", {"num_nodes": -5}, "'dataset.params.num_nodes' must be an integer >= 2, got -5"),
    ("planted", {"num_classes": 1},
     "'dataset.params.num_classes' must be an integer >= 2, got 1"),
    ("planted", {"mean_degree": -3},
     "'dataset.params.mean_degree' must be a number >= 0, got -3"),
    ("planted", {"train_fraction": 1.0},
     "'dataset.params.train_fraction' must be a number in (0, 1), got 1.0"),
    ("planted", {"val_fraction": 0},
     "'dataset.params.val_fraction' must be a number in (0, 1), got 0"),
    ("planted", {"homophily": 1.25},
     "'dataset.params.homophily' must be a number in [0, 1], got 1.25"),
    ("planted", {"num_features": 0},
     "'dataset.params.num_features' must be an integer >= 1, got 0"),
    ("planted", {"num_nodes": None},
     "'dataset.params.num_nodes' must be an integer >= 2, got None"),
    ("powerlaw", {"num_nodes": -100},
     "'dataset.params.num_nodes' must be an integer >= 1, got -100"),
    ("powerlaw", {"num_features": 0},
     "'dataset.params.num_features' must be an integer >= 1, got 0"),
    ("powerlaw", {"max_degree": 0},
     "'dataset.params.max_degree' must be an integer >= 1, got 0"),
    # parameters that do not fit together
    ("planted", {"num_nodes": 6, "num_classes": 4},
     "'dataset.params.num_nodes' must be >= 2 * num_classes = 8, got 6"),
    ("planted", {"p_in": 0.1}, "'dataset.params.p_in' and 'dataset.params.p_out': give both"),
    ("planted", {"p_in": 0, "p_out": 0.0}, "are both 0: no edges"),
    ("planted", {"train_fraction": 0.5, "val_fraction": 0.5},
     "'dataset.params.train_fraction' + 'dataset.params.val_fraction' must be < 1"),
    ("powerlaw", {"mean_degree": 10, "max_degree": 4},
     "'dataset.params.max_degree' must be >= mean_degree = 10, got 4"),
])
def test_generator_parameters_out_of_range_are_rejected(name, params, expected):
    with pytest.raises(ValueError) as err:
        D.check_params(name, params, "dataset.params")
    assert expected in str(err.value)
    with pytest.raises(ValueError, match=r"'params\."):  # the same check guards the loader
        D.load_dataset(name, **params)


def _outside(param, rng):
    """A random value outside ``param``'s range (its open bound itself, half the time)."""
    step = int(rng.integers(1, 1000)) if param.type is int else float(rng.uniform(1e-3, 1e3))
    sides = []
    if param.low is not None:
        sides.append(param.low if param.open_low and rng.random() < 0.5 else param.low - step)
    if param.high is not None:
        sides.append(param.high if param.open_high and rng.random() < 0.5 else param.high + step)
    return sides[int(rng.integers(len(sides)))]


def _inside(param, rng):
    """A random value inside ``param``'s range."""
    low = param.low if param.low is not None else -1e3
    high = param.high if param.high is not None else low + 1e3
    if param.type is int:
        return int(rng.integers(low + param.open_low, high + 1 - param.open_high))
    return float(rng.uniform(low, high))


RANGED = [(name, key) for name in ("planted", "powerlaw")
          for key, param in D.DATASETS[name].params.items()
          if param.low is not None or param.high is not None]


@pytest.mark.parametrize("name,key", RANGED)
def test_every_ranged_parameter_is_checked(name, key, rng):
    param = D.DATASETS[name].params[key]
    bad = _outside(param, rng)
    with pytest.raises(ValueError) as err:
        D.check_params(name, {key: bad}, "dataset.params")
    assert f"'dataset.params.{key}' must be {param.describe()}, got {bad!r}" in str(err.value)
    good = _inside(param, rng)
    assert param.check(key, good) == good


def test_generators_called_directly_check_their_parameters():
    with pytest.raises(ValueError, match=r"'planted\.num_nodes' must be an integer >= 2"):
        D.planted_partition(num_nodes=-5)
    with pytest.raises(ValueError, match=r"'powerlaw\.num_features' must be an integer >= 1"):
        D.power_law_graph(num_nodes=100, num_features=0)


def test_cli_rejects_out_of_range_params_before_any_work(tmp_path, rng, capsys):
    from dgl_maxk.cli import main
    config = str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
    bad = int(rng.integers(-10**6, 2))
    status = main(["validate", config, "--set", f"dataset.params.num_nodes={bad}"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    assert f"'dataset.params.num_nodes' must be an integer >= 2, got {bad}" in err
    status = main(["train", "--config", config, "--out", str(tmp_path / "runs"), "--set",
                   "dataset.params.train_fraction=1.5"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert "'dataset.params.train_fraction' must be a number in (0, 1)" in err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- damaged files


def damage(path: Path, how: str, rng) -> None:
    """Junk (an invalid first byte for every format read here, then random bytes), a random
    truncation, or an empty file."""
    data = path.read_bytes()
    path.chmod(0o644)
    if how == "junk":
        path.write_bytes(b"\xff" + rng.bytes(int(rng.integers(16, 400))))
    elif how == "truncated":
        path.write_bytes(data[: int(len(data) * rng.uniform(0.2, 0.8))])
    else:
        path.write_bytes(b"")


def assert_names_damaged_file(err, name, path, way):
    msg = str(err.value)
    assert not isinstance(err.value, D.DatasetNotFound), msg
    assert f"dataset '{name}'" in msg and str(path) in msg and way in msg, msg
    assert "pickled" not in msg and "\n" not in msg, msg


def fake_dataset(name: str, root: Path) -> Path:
    """A small valid copy of a real dataset in its on-disk layout; returns its folder."""
    if name == "reddit":
        return write_fake_reddit(root)[0]
    if name in ("flickr", "yelp"):
        folder = D.dgl_layout(name, root)[0].name
        return write_fake_saint(root, folder, multilabel=name == "yelp", classes=9)[0]
    if name == "cora":
        return copy_cora(root)
    if name == PAPERS:
        papers_files(root)
        return root / "ogbn_papers100M"
    return write_fake_ogb(root, name)["folder"]


def _files_of(name: str) -> list:
    """Every file of a real dataset that a loader reads."""
    if name == PAPERS:
        return list(PAPERS_FILES)
    if name.startswith("ogbn-"):
        return [f for f in D.ogb_layout(name, "/")[1] if f != "RELEASE_v1.txt"]
    return list(D.dgl_layout(name, "/")[1])


EVERY_FILE = [pytest.param(name, file, marks=[needs_cora] if name == "cora" else [])
              for name in ("reddit", "flickr", "yelp", "cora", "ogbn-arxiv", "ogbn-proteins",
                           PAPERS)
              for file in _files_of(name)]


@pytest.mark.parametrize("name,file", EVERY_FILE)
def test_every_damaged_raw_file_is_named(tmp_path, no_prompt, cache_dir, name, file, rng):
    """Each file of each loader, junk, cut at a random place or empty (drawn at random)."""
    folder = fake_dataset(name, tmp_path)
    damage(folder / file, rng.choice(["junk", "truncated", "empty"]), rng)
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset(name, root=tmp_path)
    origin = ("the contents of " + D.dgl_layout(name, "/")[2] if not name.startswith("ogbn-")
              else f"the official zip http://snap.stanford.edu/ogb/data/nodeproppred/"
                   f"{'papers100M-bin' if name == PAPERS else name[5:]}.zip")
    assert_names_damaged_file(err, name, folder / file,
                              f"Replace it with a good copy from {origin}")


def test_a_damaged_compressed_array_is_named(tmp_path):
    """An .npz archive whose compressed array is damaged inside (an invalid deflate block:
    zlib's error, which the archive's structure does not show) is named like a cut one."""
    folder = fake_dataset(PAPERS, tmp_path)
    path = folder / "raw" / "data.npz"
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("node_feat.npy")
    name_and_extra = int.from_bytes(data[info.header_offset + 26:info.header_offset + 30],
                                    "little")  # the local header's lengths (two uint16)
    start = info.header_offset + 30 + (name_and_extra & 0xFFFF) + (name_and_extra >> 16)
    data[start] = 0b111  # BFINAL, then the reserved block type 11
    path.write_bytes(bytes(data))
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset(PAPERS, root=tmp_path, device="cpu")
    assert_names_damaged_file(err, PAPERS, path, "Replace it with a good copy")
    assert "invalid block type" in str(err.value)


def _lines(change):
    """A damage that rewrites a text file (gzip or plain) as ``change`` (of its lines) says,
    in a valid file of its format."""
    def apply(path: Path):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            lines = f.read().splitlines()
        with opener(path, "wt") as f:
            f.write("".join(line + "\n" for line in change(lines)))
    return apply


def _pickled(change):
    """A damage that rewrites a pickle (as DGL reads it) with ``change`` of its object."""
    def apply(path: Path):
        import pickle
        import warnings
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            obj = pickle.load(f, encoding="latin1")
        path.write_bytes(pickle.dumps(change(obj), protocol=2))
    return apply


def _arrays(change):
    """A damage that rewrites a .npz archive after ``change`` of its arrays (a dict)."""
    def apply(path: Path):
        with np.load(path) as archive:
            arrays = dict(archive)
        change(arrays)
        np.savez(path, **arrays)
    return apply


def _json(change):
    """A damage that rewrites a JSON file after ``change`` of its (mutable) object."""
    def apply(path: Path):
        obj = json.loads(path.read_text())
        change(obj)
        path.write_text(json.dumps(obj))
    return apply


def _set(key, index, value):
    """A change of ``obj[key][index]`` to ``value``, for :func:`_arrays` or :func:`_json`."""
    def change(obj):
        obj[key][index] = value
    return change


def _without_last_node(graph: dict) -> dict:
    last = max(graph)
    return {k: [v for v in adjacent if v != last] for k, adjacent in graph.items() if k != last}


def _one_more_neighbour(graph: dict) -> dict:
    graph[0] = list(graph[0]) + [len(graph)]
    return graph


def _with_a_training_node(path: Path):
    """A damage of an OGB split file: it lists a node of the training split as well."""
    with gzip.open(path.parent / "train.csv.gz", "rt") as f:
        first = f.readline()
    with gzip.open(path, "at") as f:
        f.write(first)


def _split_node_label(value):
    """A damage of ogbn-papers100M's labels: the first training node's becomes ``value``."""
    def apply(path: Path):
        with gzip.open(path.parents[1] / "split" / "time" / "train.csv.gz", "rt") as f:
            first = int(f.readline())
        _arrays(_set("node_label", (first, 0), value))(path)
    return apply


def _resized(key, rows):
    """A change of array ``key`` (for :func:`_arrays`) to its first ``rows`` rows, or to
    integers (``rows`` None)."""
    def change(arrays):
        arrays[key] = arrays[key][:rows] if rows is not None else arrays[key].astype(np.int32)
    return change


def _one_hot_two(labels):
    labels = labels.copy()
    labels[0, 0] = 2
    return labels


# (dataset, file, a valid-looking damage, why (in the message), the file named if another)
DISAGREEING = [
    ("cora", "ind.cora_v2.test.index", _lines(lambda lines: lines[:500]),
     "500 test node ids, but ind.cora_v2.tx has 1000 rows", None),
    ("cora", "ind.cora_v2.test.index", _lines(lambda lines: lines[:-1] + lines[:1]),
     "a node id listed twice", None),
    ("cora", "ind.cora_v2.test.index", _lines(lambda lines: lines[:-1] + ["2708"]),
     "node ids from 1708 to 2708; the 1000 test nodes follow the 1708 rows of "
     "ind.cora_v2.allx: 1708 to 2707", None),
    ("cora", "ind.cora_v2.ty", _pickled(lambda ty: ty[:-1]),
     "999 label rows for the 1000 rows of ind.cora_v2.tx", None),
    ("cora", "ind.cora_v2.tx", _pickled(lambda tx: tx[:, :-1]),
     "1432 feature columns, but ind.cora_v2.allx has 1433", None),
    ("cora", "ind.cora_v2.y", _pickled(lambda y: y[:, :-1]),
     "6 label columns, but ind.cora_v2.ally has 7", None),
    ("cora", "ind.cora_v2.ally", _pickled(_one_hot_two), "labels other than 0 and 1", None),
    ("cora", "ind.cora_v2.allx", _pickled(lambda allx: allx.toarray()),
     "not a scipy sparse feature matrix", None),
    ("cora", "ind.cora_v2.graph", _pickled(_one_more_neighbour),
     "node ids from 0 to 2708, outside 0..2707", None),
    ("cora", "ind.cora_v2.graph", _pickled(_without_last_node),
     "2707 nodes, not the 2708 of the features", None),
    ("cora", "ind.cora_v2.graph", _pickled(lambda graph: list(graph.items())),
     "not a dict of adjacency lists", None),
    ("reddit", "reddit_data.npz", _arrays(lambda a: a.update(label=a["label"][:-1])),
     "'label' of shape (59,), not (60,) as 'feature'", None),
    ("reddit", "reddit_data.npz", _arrays(_set("node_types", 0, 4)),
     "node types other than 1, 2, 3", None),
    ("reddit", "reddit_data.npz", _arrays(_set("label", 0, -1)), "labels from -1 to", None),
    ("reddit", "reddit_graph.npz", _arrays(lambda a: a.update(shape=np.array([61, 61]))),
     "an adjacency matrix of shape (61, 61), but reddit_data.npz has 60 nodes", None),
    ("reddit", "reddit_graph.npz", _arrays(_set("row", 0, 60)),
     "row indices from 0 to 60, outside 0..59", None),
    ("flickr", "adj_full.npz", _arrays(_set("indices", 0, 50)),
     "indices from 0 to 50, outside 0..49", None),
    ("flickr", "adj_full.npz", _arrays(lambda a: a.update(indptr=a["indptr"][::-1])),
     "its CSR pointers do not fit", None),
    ("flickr", "class_map.json", _json(lambda labels: labels.pop("7")),
     "not one label for each of the 50 nodes", None),
    ("flickr", "class_map.json", _json(lambda labels: labels.update({"0": -1})),
     "class numbers from -1", None),
    ("flickr", "role.json", _json(lambda role: role["te"].append(role["tr"][0])),
     "'te' shares node ids with an earlier split", None),
    ("flickr", "role.json", _json(_set("va", 0, 50)), "'va' node ids from", None),
    ("flickr", "role.json", _json(lambda role: role["tr"].append(role["tr"][0])),
     "a node id twice in 'tr'", None),
    ("yelp", "class_map.json", _json(lambda labels: labels["3"].pop()),
     "multi-label lists of different lengths", None),
    ("yelp", "class_map.json", _json(lambda labels: labels["3"].__setitem__(0, 2)),
     "multi-label lists with other than 0, 1", None),
    ("ogbn-arxiv", "raw/edge.csv.gz", _lines(lambda lines: lines[:-1]),
     "rows, but num-edge-list.csv.gz says", None),
    ("ogbn-arxiv", "raw/edge.csv.gz", _lines(lambda lines: ["0,40"] + lines[1:]),
     "node ids from 0 to 40, outside 0..39", None),
    ("ogbn-arxiv", "raw/node-feat.csv.gz", _lines(lambda lines: lines[:-1]),
     "39 rows, but num-node-list.csv.gz says 40 nodes", None),
    ("ogbn-arxiv", "raw/node-feat.csv.gz",
     _lines(lambda lines: lines[:3] + [lines[3] + ",0.5"] + lines[4:]),
     "Expected 5 fields in line 4, saw 6", None),
    ("ogbn-arxiv", "raw/node-feat.csv.gz",
     _lines(lambda lines: lines[:3] + ["," + lines[3].split(",", 1)[1]] + lines[4:]),
     "row 4 has a field that is not a number", None),
    ("ogbn-arxiv", "raw/node-label.csv.gz", _lines(lambda lines: ["-1"] + lines[1:]),
     "a value -1 < 0", None),
    ("ogbn-arxiv", "raw/node_year.csv.gz", _lines(lambda lines: lines + ["2001"]),
     "41 rows, but num-node-list.csv.gz says 40 nodes", None),
    ("ogbn-arxiv", "raw/num-node-list.csv.gz", _lines(lambda lines: lines * 2),
     "2 rows of 1 numbers, not one number", None),
    ("ogbn-arxiv", "raw/num-edge-list.csv.gz", _lines(lambda lines: [str(int(lines[0]) + 1)]),
     "rows, but num-edge-list.csv.gz says", "raw/edge.csv.gz"),
    ("ogbn-arxiv", "split/time/train.csv.gz", _lines(lambda lines: lines + lines[:1]),
     "a node id twice in 'train'", None),
    ("ogbn-arxiv", "split/time/valid.csv.gz", _with_a_training_node,
     "'valid' shares node ids with an earlier split", None),
    ("ogbn-arxiv", "split/time/test.csv.gz", _lines(lambda lines: ["40"] + lines[1:]),
     "'test' node ids from", None),
    ("ogbn-arxiv", "split/time/test.csv.gz", _lines(lambda lines: ["1.5"] + lines[1:]),
     "ValueError", None),
    ("ogbn-proteins", "raw/edge-feat.csv.gz", _lines(lambda lines: lines[:-1]),
     "rows, but num-edge-list.csv.gz says", None),
    ("ogbn-proteins", "raw/node_species.csv.gz", _lines(lambda lines: lines[:-1]),
     "39 rows, but num-node-list.csv.gz says 40 nodes", None),
    ("ogbn-proteins", "raw/node-label.csv.gz", _lines(lambda lines: lines[:1] + lines[2:]),
     "39 rows", None),
    (PAPERS, "raw/data.npz", _arrays(_set("edge_index", (1, 7), 300)),
     "to 300, outside 0..299", None),
    (PAPERS, "raw/data.npz", _arrays(_resized("node_feat", -1)),
     "'node_feat' of shape (299, 6), not a row for each of the 300 nodes", None),
    (PAPERS, "raw/data.npz", _arrays(_resized("node_feat", None)),
     "'node_feat' holds int32, not floats", None),
    (PAPERS, "raw/data.npz", _arrays(_resized("num_nodes_list", 0)),
     "'num_nodes_list' is [], not one node count", None),
    (PAPERS, "raw/node-label.npz", _arrays(_resized("node_label", -1)),
     "'node_label' of shape (299, 1), not a label for each of the 300 nodes", None),
    (PAPERS, "raw/node-label.npz", _split_node_label(np.nan),
     "of a split has the label nan, not a class 0..171", None),
    (PAPERS, "raw/node-label.npz", _split_node_label(172),
     "of a split has the label 172.0, not a class 0..171", None),
    (PAPERS, "split/time/train.csv.gz", _lines(lambda lines: lines + lines[:1]),
     "a node id twice in 'train'", None),
    (PAPERS, "split/time/valid.csv.gz", _with_a_training_node,
     "'valid' shares node ids with an earlier split", None),
    (PAPERS, "split/time/test.csv.gz", _lines(lambda lines: ["300"] + lines[1:]),
     "'test' node ids from", None),
]


@pytest.mark.parametrize("name,file,change,why,named", [
    pytest.param(*case, marks=[needs_cora] if case[0] == "cora" else [],
                 id=f"{case[0]}-{Path(case[1]).name}-{i}")
    for i, case in enumerate(DISAGREEING)])
def test_raw_file_that_disagrees_with_its_format_is_named(tmp_path, no_prompt, cache_dir, name,
                                                          file, change, why, named):
    """Readable files that DGL or OGB would train on, or fail on in their own words: sizes
    that disagree between files, ids out of range or listed twice, values of the wrong kind."""
    folder = fake_dataset(name, tmp_path)
    change(folder / file)
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset(name, root=tmp_path)
    assert_names_damaged_file(err, name, folder / (named or file), "Replace it with a good copy")
    assert why in str(err.value)


@needs_cora
def test_damaged_file_in_read_only_folder_names_the_copy_to_delete(tmp_path, cache_dir, rng):
    folder = copy_cora(tmp_path)
    file = folder / "ind.cora_v2.tx"
    good = file.read_bytes()
    damage(file, "junk", rng)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(D.DatasetError) as err:
            D.load_dataset("cora", root=tmp_path)
        assert_names_damaged_file(err, "cora", file, "Replace it with a good copy")
        copies = list(cache_dir.rglob("cora_v2_d697a464"))
        assert len(copies) == 1 and f"Then delete {copies[0]}/" in str(err.value)
        # the way on, as the message says, works
        folder.chmod(0o755)
        file.write_bytes(good)
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        shutil.rmtree(copies[0])
        assert D.load_dataset("cora", root=tmp_path).num_nodes == 2708
    finally:
        folder.chmod(0o755)


def test_unreadable_dgl_cache_without_raw_files_says_both(tmp_path, rng):
    folder, *_ = write_fake_reddit(tmp_path)
    D.load_dataset("reddit", root=tmp_path)
    caches = sorted(folder.glob("*.bin"))
    assert caches
    for raw in ("reddit_graph.npz", "reddit_data.npz"):
        (folder / raw).unlink()
    damage(caches[0], "junk", rng)
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset("reddit", root=tmp_path)
    assert_names_damaged_file(err, "reddit", caches[0], "Delete it")
    assert "missing: reddit_graph.npz, reddit_data.npz" in str(err.value)


@needs_cora
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_cut_processed_cache_is_reported_before_dgl_reads_it(tmp_path, fraction):
    """DGL's reader crashes the process on a cut graph file: the cache is checked against
    what was recorded when it was written, and never reaches DGL."""
    folder = copy_cora(tmp_path)
    first = D.load_dataset("cora", root=tmp_path)
    cache = folder / "cora_v2_dgl_graph.bin"
    data = cache.read_bytes()
    cache.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset("cora", root=tmp_path)
    assert_names_damaged_file(err, "cora", cache,
                              "Delete it: the next load rebuilds it from the raw files.")
    assert f"({int(len(data) * fraction)} bytes, not the {len(data)} " in str(err.value)
    cache.unlink()  # the way on, as the message says
    assert torch.equal(D.load_dataset("cora", root=tmp_path).features, first.features)


def test_processed_cache_changed_in_place_is_caught_by_its_digest(tmp_path, rng):
    folder = fake_dataset("flickr", tmp_path)
    first = D.load_dataset("flickr", root=tmp_path)
    cache = folder / "dgl_graph.bin"
    data, was = cache.read_bytes(), cache.stat()
    os.utime(cache, ns=(was.st_atime_ns, was.st_mtime_ns + 1_000_000_000))
    assert torch.equal(D.load_dataset("flickr", root=tmp_path).features, first.features)
    at = int(rng.integers(len(data)))
    cache.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset("flickr", root=tmp_path)
    assert_names_damaged_file(err, "flickr", cache, "Delete it")
    assert "it changed since it was written" in str(err.value)


@needs_cora
def test_unrecorded_processed_cache_is_first_read_in_a_child_process(tmp_path):
    """A cache that DGL wrote alone (no record) is read by DGL in a child process first:
    a good one is then used and recorded, a cut one reported."""
    folder = copy_cora(tmp_path)
    first = D.load_dataset("cora", root=tmp_path)
    record = folder / D.processed.RECORD
    record.unlink()
    assert torch.equal(D.load_dataset("cora", root=tmp_path).features, first.features)
    assert record.is_file()
    record.unlink()
    cache = folder / "cora_v2_dgl_graph.bin"
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset("cora", root=tmp_path)
    assert_names_damaged_file(err, "cora", cache, "Delete it")
    assert "DGL's graph reader" in str(err.value)


def test_damaged_ogb_cache_is_named_and_deleting_it_recovers(tmp_path, no_prompt, rng):
    fake = write_fake_ogb(tmp_path, "ogbn-arxiv")
    first = D.load_dataset("ogbn-arxiv", root=tmp_path)
    cache = fake["folder"] / "processed" / "dgl_data_processed"
    damage(cache, rng.choice(["junk", "truncated"]),
           rng)
    with pytest.raises(D.DatasetError) as err:
        D.load_dataset("ogbn-arxiv", root=tmp_path)
    assert_names_damaged_file(err, "ogbn-arxiv", cache, "Delete it")
    cache.unlink()
    again = D.load_dataset("ogbn-arxiv", root=tmp_path)
    assert torch.equal(again.features, first.features)


@pytest.mark.parametrize("change", ["same_size", "resized"])
def test_copy_of_a_read_only_folder_follows_its_changed_files(tmp_path, cache_dir, change, rng):
    """The copy of a read-only folder is made again when a source file changes, in size or
    only in its modification time (it was reused by path alone, with the old contents);
    the stale copy is removed."""
    folder, features, *_ = write_fake_saint(tmp_path / "ro", "flickr_b05c56ca")
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        first = D.load_dataset("flickr", root=tmp_path / "ro")
        assert torch.equal(first.features, torch.from_numpy(features))
        [copy] = cache_dir.rglob("flickr_b05c56ca")
        processed = (copy / "dgl_graph.bin").stat().st_mtime_ns
        D.load_dataset("flickr", root=tmp_path / "ro")  # unchanged: the same copy, as it was
        assert (copy / "dgl_graph.bin").stat().st_mtime_ns == processed
        width = features.shape[1] + (change == "resized")
        new = rng.normal(size=(features.shape[0], width)).astype(np.float32)
        feats = folder / "feats.npy"
        was = feats.stat()
        np.save(feats, new)
        if change == "same_size":  # a later time than a coarse file-system clock may give
            assert feats.stat().st_size == was.st_size
            os.utime(feats, ns=(was.st_atime_ns, was.st_mtime_ns + 1_000_000_000))
        again = D.load_dataset("flickr", root=tmp_path / "ro")
        assert torch.equal(again.features, torch.from_numpy(new))
        [fresh] = cache_dir.rglob("flickr_b05c56ca")  # the stale copy is gone
        assert fresh != copy
    finally:
        folder.chmod(0o755)
