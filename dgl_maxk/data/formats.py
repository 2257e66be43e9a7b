"""Readers of the real datasets' file formats that fail with :class:`Damaged` (the file, and
why) where a file does not hold what its format says: NumPy .npy and .npz, scipy's sparse
.npz, JSON, pickles, text lists of integers, gzip CSV tables of numbers and DGL graph files
(read in a child process); and :func:`find_damaged`, which reads each file of a dataset by
its format to find the one that made DGL or OGB fail.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import warnings
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from .._dgl import dgl

#: What DGL's, OGB's and these readers raise on a damaged or missing file (numpy, zipfile,
#: zlib, gzip, json, pickle, pandas, DGL's graph serializer): caught around their calls only.
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, IndexError, OverflowError,
               zipfile.BadZipFile, zlib.error, pickle.UnpicklingError, dgl.DGLError)

_NPY_MAGIC = b"\x93NUMPY"


class Damaged(Exception):
    """A dataset's file (``rel``, its path relative to the dataset's folder) does not hold
    what its format, or the dataset's other files, say it must (``why``)."""

    def __init__(self, rel: str, why: str):
        super().__init__(f"{rel}: {why}")
        self.rel, self.why = rel, why


def first_line(err: BaseException) -> str:
    """An error in one short line: its type and the first line of its message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def require(ok, rel: str, why: str) -> None:
    """Damaged(rel, why) unless ``ok``."""
    if not ok:
        raise Damaged(rel, why)


@contextmanager
def reading(folder: Path, rel: str):
    """The path of ``folder / rel``, to be read in the block: an empty file, or a reader's
    error in the block, raises Damaged naming it."""
    path = folder / rel
    require(path.stat().st_size > 0, rel, "the file is empty")
    try:
        yield path
    except READ_ERRORS as err:
        raise Damaged(rel, first_line(err)) from err


def in_range(values: np.ndarray, stop: int, rel: str, what: str) -> None:
    """Damaged unless every one of ``values`` (integers) is in [0, stop)."""
    require(np.issubdtype(values.dtype, np.integer), rel, f"its {what} are not integers")
    if values.size:
        low, high = int(values.min()), int(values.max())
        require(low >= 0 and high < stop, rel,
                f"{what} from {low} to {high}, outside 0..{stop - 1}")


# --------------------------------------------------------------------------- readers


def read_pickle(folder: Path, rel: str):
    """A pickled object, read as DGL reads the planetoid files."""
    with reading(folder, rel) as path, open(path, "rb") as f, warnings.catch_warnings():
        # the planetoid pickles name scipy.sparse.csr, which scipy now calls deprecated
        warnings.filterwarnings("ignore", message="Please import `csr_matrix`",
                                category=DeprecationWarning)
        try:
            return pickle.load(f, encoding="latin1")
        except (TypeError, AttributeError, ImportError) as err:  # junk read as opcodes
            raise Damaged(rel, first_line(err)) from err


def read_integers(folder: Path, rel: str) -> np.ndarray:
    """The integers of a text file holding one per line."""
    with reading(folder, rel) as path, open(path, encoding="utf-8") as f:
        return np.array([int(line) for line in f], dtype=np.int64)


def read_json(folder: Path, rel: str):
    with reading(folder, rel) as path, open(path, encoding="utf-8") as f:
        return json.load(f)


def npy_shape(folder: Path, rel: str) -> tuple:
    """The shape of a .npy array, from its header; Damaged unless the file is as long as the
    header says (the data itself is not read)."""
    with reading(folder, rel) as path:
        with open(path, "rb") as f:
            require(f.read(len(_NPY_MAGIC)) == _NPY_MAGIC, rel, "not a NumPy .npy file")
        return np.load(path, mmap_mode="r", allow_pickle=False).shape


def npz_shapes(folder: Path, rel: str) -> dict:
    """{member: shape} of a .npz archive, from each member's header; Damaged unless each
    member is as long as its header says (the data itself is not read)."""
    shapes = {}
    with reading(folder, rel) as path, zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            require(info.filename.endswith(".npy"), rel,
                    f"its member {info.filename} is not a NumPy array")
            with archive.open(info) as f:
                shape, _, dtype = npy_header(f)
                size = f.tell() + math.prod(shape) * dtype.itemsize
            require(info.file_size == size, rel,
                    f"its member {info.filename} holds {info.file_size} bytes, not {size}")
            shapes[info.filename[:-4]] = shape
    return shapes


def npy_header(f) -> tuple:
    """(shape, Fortran order, dtype) from the header of the .npy stream ``f``, which is then
    at the array's data."""
    version = np.lib.format.read_magic(f)
    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
              else np.lib.format.read_array_header_2_0)
    return header(f)


def _npz(path: Path, rel: str):
    """A .npz archive opened by NumPy (which calls any file that is not one a pickle)."""
    require(zipfile.is_zipfile(path), rel, "not a .npz (zip) archive")
    return np.load(path, allow_pickle=False)


def npz_array(folder: Path, rel: str, member: str) -> np.ndarray:
    """One array of a .npz archive."""
    with reading(folder, rel) as path, _npz(path, rel) as archive:
        require(member in archive.files, rel, f"it has no array '{member}'")
        return archive[member]


def sparse_shape(folder: Path, rel: str) -> tuple[int, int]:
    """The shape of a matrix saved by ``scipy.sparse.save_npz`` (COO, CSR or CSC), after
    checking that its arrays agree: lengths, index ranges, row or column pointers."""
    with reading(folder, rel) as path, _npz(path, rel) as arrays:
        require({"format", "shape", "data"} <= set(arrays.files), rel,
                "not a scipy sparse matrix (no 'format', 'shape' or 'data')")
        kind = arrays["format"].item()
        kind = kind.decode("ascii") if isinstance(kind, bytes) else str(kind)
        shape = tuple(int(v) for v in arrays["shape"])
        require(len(shape) == 2 and min(shape) >= 0, rel, f"a matrix shape {shape}")
        nnz = len(arrays["data"])
        if kind == "coo":
            row, col = arrays["row"], arrays["col"]
            require(len(row) == len(col) == nnz, rel, "its row, column and value counts differ")
            in_range(row, shape[0], rel, "row indices")
            in_range(col, shape[1], rel, "column indices")
        elif kind in ("csr", "csc"):
            major, minor = shape if kind == "csr" else shape[::-1]
            indptr, indices = arrays["indptr"], arrays["indices"]
            require(len(indptr) == major + 1 and indptr[0] == 0 and indptr[-1] == nnz
                    == len(indices) and (np.diff(indptr) >= 0).all(), rel,
                    f"its {kind.upper()} pointers do not fit its {nnz} entries")
            in_range(indices, minor, rel, "indices")
        else:
            raise Damaged(rel, f"a sparse format scipy's load_npz does not read: {kind!r}")
    return shape


def table_stats(folder: Path, rel: str, dtype) -> tuple[int, int, float, float]:
    """(rows, columns, smallest, largest value) of a gzip CSV table of numbers (integers
    when ``dtype`` is int64), read in chunks: Damaged unless every row has the same number
    of fields, each a finite number of that type."""
    rows, cols, low, high = 0, 0, math.inf, -math.inf
    with reading(folder, rel) as path:
        for chunk in pd.read_csv(path, header=None, compression="gzip", dtype=dtype,
                                 chunksize=1 << 18):
            values = chunk.to_numpy()
            finite = np.isfinite(values).all(axis=1)
            require(finite.all(), rel,
                    f"row {rows + int(np.argmin(finite)) + 1} has a field that is not a number")
            require(cols in (0, values.shape[1]), rel, f"rows of {cols} and of "
                    f"{values.shape[1]} fields")
            rows, cols = rows + len(values), values.shape[1]
            low, high = min(low, values.min()), max(high, values.max())
    return rows, cols, low, high


def table_column(folder: Path, rel: str) -> np.ndarray:
    """The integers of a gzip CSV table of one column."""
    with reading(folder, rel) as path:
        values = pd.read_csv(path, header=None, compression="gzip", dtype=np.int64).to_numpy()
    require(values.shape[1] == 1, rel, f"{values.shape[1]} columns, not 1")
    return values[:, 0]


# --------------------------------------------------------------------------- after a failure


def _check_npz(folder: Path, rel: str) -> None:
    npz_shapes(folder, rel)
    with reading(folder, rel) as path, zipfile.ZipFile(path) as archive:
        bad = archive.testzip()
    require(bad is None, rel, f"its member {bad} fails the CRC check")


#: DGL's graph reader, run in a child process: it crashes (a segmentation fault) on some
#: damaged graph files, which must not end the process that checks them.
_READ_GRAPHS = "import sys; from dgl_maxk._dgl import dgl; dgl.load_graphs(sys.argv[1])"


def read_graphs_apart(folder: Path, rel: str) -> None:
    """Damaged unless DGL reads the graph file (``dgl.save_graphs``'s) in a child process."""
    with reading(folder, rel) as path:
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
        done = subprocess.run([sys.executable, "-c", _READ_GRAPHS, str(path)], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode < 0:
        raise Damaged(rel, "DGL's graph reader crashed on it: "
                           f"{signal.Signals(-done.returncode).name}")
    lines = done.stderr.strip().splitlines()
    require(done.returncode == 0, rel, "DGL's graph reader failed on it: "
            + (lines[-1][:200] if lines else f"exit status {done.returncode}"))


def _check_for(rel: str):
    """The reader that checks a dataset file by its format (from its path relative to the
    dataset's folder), or None for a file whose contents nobody reads (RELEASE_v1.txt)."""
    name = Path(rel).name
    if name.endswith(".bin") or name == "dgl_data_processed":
        return read_graphs_apart
    if name.endswith(".index"):
        return read_integers
    if name.startswith("ind.") or name.endswith(".pkl"):
        return read_pickle
    if name.endswith(".gz"):
        return lambda folder, rel: table_stats(folder, rel, np.float64)
    return {".npz": _check_npz, ".npy": npy_shape,
            ".json": read_json}.get(Path(name).suffix)


def check_file(folder: Path, rel: str) -> None:
    """Damaged unless ``folder / rel`` can be read as its format (by its name) says."""
    check = _check_for(rel)
    if check is not None:
        check(folder, rel)


def find_damaged(folder: Path, files) -> Damaged | None:
    """Why the first of ``files`` (relative to ``folder``) that is present cannot be read as
    its format says; None when all of them can."""
    for rel in files:
        if (folder / rel).is_file():
            try:
                check_file(folder, rel)
            except Damaged as damaged:
                return damaged
    return None
