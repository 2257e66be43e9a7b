"""Where the real datasets' files live: the data root, each dataset's folder and files (the
layouts DGL and OGB read offline), the presence check that fails fast with
:class:`DatasetNotFound`, and the writable copy of a read-only folder.

The data root is the ``root`` argument, else ``$DGL_MAXK_DATA``, else ``./data``. DGL and OGB
write processed caches next to the raw files: when that folder is not writable, the raw files
are first copied to ``$DGL_MAXK_CACHE`` (default: ``dgl_maxk_cache`` in the temp directory),
again whenever the source files' sizes or modification times change.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from .._dgl import dgl
from .dataset import DatasetNotFound

_ROOT_HINT = "(set it with the 'root' option, dataset.root in a config, or $DGL_MAXK_DATA)"

#: The planetoid datasets, and the parts of each (its files: ind.<name>.<part>).
PLANETOID = ("cora", "citeseer", "pubmed")
PLANETOID_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
_SAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")

#: For each DGL dataset: (class name, DGL name, url path, raw files, where to get them).
DGL_SPECS = {
    "reddit": ("RedditDataset", "reddit", "dataset/reddit.zip",
               ("reddit_graph.npz", "reddit_data.npz"),
               "https://data.dgl.ai/dataset/reddit.zip"),
    "flickr": ("FlickrDataset", "flickr", "dataset/flickr.zip", _SAINT_FILES,
               "https://data.dgl.ai/dataset/flickr.zip"),
    "yelp": ("YelpDataset", "yelp", "dataset/yelp.zip", _SAINT_FILES,
             "https://data.dgl.ai/dataset/yelp.zip"),
    "cora": ("CoraGraphDataset", "cora_v2", "dataset/cora_v2.zip",
             tuple(f"ind.cora_v2.{s}" for s in PLANETOID_PARTS),
             "https://data.dgl.ai/dataset/cora_v2.zip"),
    "citeseer": ("CiteseerGraphDataset", "citeseer", "dataset/citeseer.zip",
                 tuple(f"ind.citeseer.{s}" for s in PLANETOID_PARTS),
                 "https://data.dgl.ai/dataset/citeseer.zip"),
    "pubmed": ("PubmedGraphDataset", "pubmed", "dataset/pubmed.zip",
               tuple(f"ind.pubmed.{s}" for s in PLANETOID_PARTS),
               "https://data.dgl.ai/dataset/pubmed.zip"),
}

#: For each OGB node dataset: (split folder, raw files).
OGB_SPECS = {
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

#: OGB's processed cache, relative to the dataset's folder.
OGB_CACHE = "processed/dgl_data_processed"

#: ogbn-papers100M, read without OGB (whose loader builds a DGL graph on the host): its
#: name, its folder under the data root and the files read there (the official zip's).
PAPERS = "ogbn-papers100m"
PAPERS_FOLDER = "ogbn_papers100M"
PAPERS_FILES = ("raw/data.npz", "raw/node-label.npz", "split/time/train.csv.gz",
                "split/time/valid.csv.gz", "split/time/test.csv.gz")


def data_root(root=None) -> Path:
    """The data root: ``root``, else ``$DGL_MAXK_DATA``, else ``./data``."""
    if root is None:
        root = os.environ.get("DGL_MAXK_DATA") or "data"
    return Path(root).expanduser()


# --------------------------------------------------------------------------- layouts


def _dgl_folder(name: str, url_path: str) -> str:
    """The folder DGL's built-in dataset looks for under raw_dir: name + '_' + sha1(url)."""
    url = dgl.data.utils._get_dgl_url(url_path)
    return name + "_" + hashlib.sha1(url.encode("utf-8")).hexdigest()[:8]


def dgl_layout(name: str, root=None) -> tuple[Path, tuple[str, ...], str]:
    """(folder, raw files, source) of a DGL dataset under the data root."""
    _, dgl_name, url_path, files, source = DGL_SPECS[name]
    return data_root(root) / _dgl_folder(dgl_name, url_path), files, source


def ogb_layout(name: str, root=None) -> tuple[Path, list[str]]:
    """(folder, files relative to it) of an OGB node dataset under the data root."""
    split, raw = OGB_SPECS[name]
    base = data_root(root)
    folder = base / name.replace("-", "_")
    if (base / (folder.name + "_dgl")).exists():  # OGB prefers this name when present
        folder = base / (folder.name + "_dgl")
    files = (["RELEASE_v1.txt"] + [f"raw/{f}" for f in raw]
             + [f"split/{split}/{s}.csv.gz" for s in ("train", "valid", "test")])
    return folder, files


def ogb_source(name: str, folder: Path) -> str:
    """Where an OGB dataset's files come from, in words."""
    short = name.split("-")[1]
    return (f"the official zip http://snap.stanford.edu/ogb/data/nodeproppred/{short}.zip "
            f"unpacked, with its top folder '{short}' renamed to '{folder.name}'")


def papers_source() -> str:
    """Where ogbn-papers100M's files come from, in words."""
    return ("the official zip http://snap.stanford.edu/ogb/data/nodeproppred/papers100M-bin.zip"
            f" unpacked, with its top folder 'papers100M-bin' renamed to '{PAPERS_FOLDER}'")


def describe_layout(name: str, root=None) -> str:
    """Where a real dataset's files go under the data root, in words."""
    if name in DGL_SPECS:
        folder, files, _ = dgl_layout(name, root)
        return f"{folder}/ {{{', '.join(files)}}}"
    if name == PAPERS:
        return f"{data_root(root) / PAPERS_FOLDER}/ {{{', '.join(PAPERS_FILES)}}}"
    folder, _ = ogb_layout(name, root)
    return (f"{folder}/ (the official {name.split('-')[1]}.zip unpacked and renamed; "
            "with RELEASE_v1.txt, raw/, split/)")


# --------------------------------------------------------------------------- presence


def dgl_cache_files(name: str) -> tuple[str, ...]:
    """The processed cache DGL's class for a dataset writes into its folder, and reads
    instead of the raw files when all of it is there: the graph file, and for the planetoid
    datasets an info pickle."""
    dgl_name = DGL_SPECS[name][1]
    if name in PLANETOID:
        return f"{dgl_name}_dgl_graph.bin", f"{dgl_name}_dgl_graph.pkl"
    return ("dgl_graph.bin",)


def _what_is_missing(root, folder: Path, needed: list, missing: list) -> str:
    """What keeps a dataset from being found, and where, in one line."""
    base = data_root(root)
    if base.exists() and not base.is_dir():
        return f"the data root {base} is a file, not a folder"
    if not base.exists():
        return f"the data root {base} does not exist"
    if folder.exists() and not folder.is_dir():
        return f"{folder} is a file, not the dataset's folder"
    if not folder.exists():
        return f"its folder {folder}/ does not exist"
    if missing == list(needed):
        return f"none of its {len(needed)} files is in {folder}/"
    return f"missing from {folder}/: {', '.join(missing)}"


def _not_found(name: str, root, folder: Path, needed: list, missing: list, files,
               put: str, note: str = "") -> DatasetNotFound:
    """The error for a dataset that is not on disk: a first line saying what is missing and
    where, then ``put`` (what to place there), the folder's files and ``note``."""
    return DatasetNotFound(
        f"dataset '{name}' is not on disk: {_what_is_missing(root, folder, needed, missing)}"
        f"\ndgl_maxk does not download. {put}, so that it holds:\n  "
        + "\n  ".join(files) + note
        + f"\nThe data root is {data_root(root)} {_ROOT_HINT}.")


def check_dgl_files(name: str, root) -> tuple[Path, bool]:
    """(folder, whether DGL's processed cache is all there); DatasetNotFound when neither the
    raw files nor a cache are."""
    folder, files, source = dgl_layout(name, root)
    has_cache = all((folder / f).is_file() for f in dgl_cache_files(name))
    missing = [f for f in files if not (folder / f).is_file()]
    if missing and not has_cache:
        raise _not_found(name, root, folder, files, missing, files,
                         f"Unpack {source} into {folder}/")
    return folder, has_cache


def check_ogb_files(name: str, root) -> tuple[Path, bool]:
    """(folder, whether OGB's processed cache is there); DatasetNotFound when a needed file
    is missing (which also keeps OGB from its interactive y/N prompt)."""
    folder, files = ogb_layout(name, root)
    has_cache = (folder / OGB_CACHE).is_file()
    needed = [f for f in files if not f.startswith("raw/")] if has_cache else files
    if name == "ogbn-proteins" and (folder / "raw" / "species.csv.gz").is_file():
        needed = [f for f in needed if f != "raw/node_species.csv.gz"]  # OGB renames it
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        note = ""
        if missing == ["RELEASE_v1.txt"]:
            note = ("\nWithout RELEASE_v1.txt OGB asks an interactive y/N question and "
                    "deletes the folder on 'y'. It ships in the official zip; restore it (an "
                    f"empty file is enough: touch {folder}/RELEASE_v1.txt).")
        raise _not_found(name, root, folder, needed, missing, files,
                         f"Put {ogb_source(name, folder)} at {folder}/", note)
    return folder, has_cache


def check_papers_files(name: str, root) -> Path:
    """ogbn-papers100M's folder; DatasetNotFound when one of its files is missing."""
    folder = data_root(root) / PAPERS_FOLDER
    missing = [f for f in PAPERS_FILES if not (folder / f).is_file()]
    if missing:
        raise _not_found(name, root, folder, PAPERS_FILES, missing, PAPERS_FILES,
                         f"Put {papers_source()} at {folder}/")
    return folder


# --------------------------------------------------------------------------- writable copy


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


def writable_parent(folder: Path, has_cache: bool) -> Path:
    """The directory to hand to DGL/OGB as the parent of ``folder``: its real parent when
    the loader can write its processed cache there (or already has it), else the cache root
    after copying ``folder`` into it. A copy is made once per state of the source's files
    (paths, sizes, modification times): a changed or replaced source file gets a fresh copy,
    and the copies of the source's earlier states are deleted then."""
    if has_cache or _can_write(folder):
        return folder.parent
    # the copies of one source folder side by side, each keeping the name DGL/OGB look for
    copies = _cache_root() / hashlib.sha1(str(folder.resolve()).encode("utf-8")).hexdigest()[:10]
    target = copies / _files_stamp(folder) / folder.name
    if not target.exists():
        _copy_writable(folder, target)
        # a run loading from an earlier copy at this moment loses it: only a run that began
        # before the source changed, whose copy is stale
        for stale in copies.iterdir():
            if stale != target.parent:
                shutil.rmtree(stale, ignore_errors=True)
    return target.parent


def _files_stamp(folder: Path) -> str:
    """A digest of the relative path, size and modification time of every file in
    ``folder``: it changes when a file is rewritten, touched, added or removed."""
    digest = hashlib.sha1()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        info = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{info.st_size}\0{info.st_mtime_ns}\n"
                      .encode("utf-8"))
    return digest.hexdigest()[:10]


def _copy_writable(folder: Path, target: Path) -> None:
    """Copy ``folder`` to ``target``, writable, atomically (another process copying the same
    folder at once may finish first: its copy is kept)."""
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
