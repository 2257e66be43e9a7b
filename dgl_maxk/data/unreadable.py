"""Which file of a dataset is damaged, found after DGL or OGB failed to read it, and the
:class:`DatasetError` that names it and the way on.

DGL's and OGB's readers fail on a junk or truncated file with the parser's own words
("This file contains pickled (object) data", "Not a gzipped file", a failed check in DGL's
graph serializer), which name neither the dataset nor the file. Only after such a failure is
each file checked on its own, by the rules of its format, to find the one to replace.
"""
from __future__ import annotations

import codecs
import gzip
import json
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np

from .._dgl import dgl
from .dataset import DatasetError

#: What DGL's and OGB's readers raise on a damaged or missing file (numpy, zipfile, gzip,
#: json, pickle, pandas, DGL's graph serializer): caught around their calls only.
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, IndexError, zipfile.BadZipFile,
               pickle.UnpicklingError, dgl.DGLError)

_NPY_MAGIC = b"\x93NUMPY"


def _check_npz(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise ValueError(f"its member {bad} fails the CRC check")


def _check_npy(path: Path) -> None:
    with open(path, "rb") as f:
        if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise ValueError("not a NumPy .npy file")
    np.load(path, mmap_mode="r")  # reads the header and checks the size, not the data


def _check_json(path: Path) -> None:
    with open(path, encoding="utf-8") as f:
        json.load(f)


def _check_gzip_text(path: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            decoder.decode(chunk)
    decoder.decode(b"", final=True)


def _check_pickle(path: Path) -> None:
    with open(path, "rb") as f, warnings.catch_warnings():
        # the planetoid pickles name scipy.sparse.csr, which scipy now calls deprecated
        warnings.filterwarnings("ignore", message="Please import `csr_matrix`",
                                category=DeprecationWarning)
        pickle.load(f, encoding="latin1")  # as DGL reads the planetoid files and its .pkl


def _check_index(path: Path) -> None:
    with open(path, encoding="utf-8") as f:
        for line in f:
            int(line)


def _check_graphs(path: Path) -> None:
    dgl.load_graphs(str(path))


def _check_for(rel: str):
    """The check for a dataset file (by its path relative to the dataset folder), or None
    for a file whose contents nobody reads (RELEASE_v1.txt)."""
    name = Path(rel).name
    if name.endswith(".bin") or name == "dgl_data_processed":
        return _check_graphs
    if name.endswith(".index"):
        return _check_index
    if name.startswith("ind.") or name.endswith(".pkl"):
        return _check_pickle
    return {".npz": _check_npz, ".npy": _check_npy, ".json": _check_json,
            ".gz": _check_gzip_text}.get(Path(name).suffix)


def find_unreadable(folder: Path, files) -> tuple[str, str] | None:
    """(file, why) for the first of ``files`` (relative to ``folder``) that is present and
    cannot be read as its format says; None when all of them can."""
    for rel in files:
        check = _check_for(rel)
        if check is None or not (folder / rel).is_file():
            continue
        if (folder / rel).stat().st_size == 0:  # valid to some readers (gzip), never here
            return rel, "the file is empty"
        try:
            check(folder / rel)
        except READ_ERRORS as err:
            return rel, _first_line(err)
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def unreadable_error(name: str, folder: Path, read_from: Path, raw_files, cache_files,
                     source: str, err: BaseException) -> DatasetError:
    """The error for a dataset DGL or OGB failed to read.

    ``folder`` is the dataset's folder under the data root, ``read_from`` the folder the
    loader read (``folder`` itself, or dgl_maxk's writable copy of it), ``raw_files`` and
    ``cache_files`` are relative to it, and ``source`` says where good raw files come from.
    """
    found = find_unreadable(read_from, [*raw_files, *cache_files])
    copy_note = "" if read_from == folder else (
        f" Then delete {read_from}/ (dgl_maxk's writable copy of the read-only folder; the "
        "next load copies it again).")
    if found is None:
        caches = ", ".join(cache_files) or "none"
        return DatasetError(
            f"dataset '{name}' cannot be read from {read_from}/ ({_first_line(err)}). "
            f"Replace its files with good copies from {source}, and delete the processed "
            f"cache there (now: {caches}).{copy_note}")
    rel, why = found
    if rel in cache_files:
        missing = [f for f in raw_files if not (read_from / f).is_file()]
        way = "Delete it: the next load rebuilds it from the raw files"
        if missing:
            way += (f", which must then be in {folder}/ (missing: {', '.join(missing)}; "
                    f"get them from {source})")
        return DatasetError(f"dataset '{name}': its processed cache {read_from / rel} "
                            f"cannot be read ({why}). {way}.")
    return DatasetError(f"dataset '{name}': cannot read {folder / rel} ({why}). Replace it "
                        f"with a good copy from {source}.{copy_note}")
