"""The processed caches DGL and OGB write beside a dataset's raw files (a DGL graph file, an
info pickle), checked before either reads them: DGL's ``load_graphs`` can crash the process
(a segmentation fault) on a cut graph file, with nothing to catch.

After each load, the size, modification time and SHA-256 of every cache file are recorded in
:data:`RECORD` in the dataset's folder. A cache file that no longer matches its record (cut,
rewritten) is damaged: its :class:`DatasetError` says to delete it, and the next load
rebuilds it from the raw files. A cache file without a record (written by DGL or OGB alone,
or by a write cut short) is first read by its format, a graph file by DGL in a child
process, where a crash ends only the child; it is recorded after the load.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .formats import check_file, require

RECORD = "dgl_maxk_processed.json"


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _read_record(folder: Path) -> dict:
    """{cache file: {size, mtime_ns, sha256}}; empty when there is no readable record."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _matches(path: Path, entry: dict) -> bool:
    """Whether a file is as recorded: its size, and its contents when its time differs."""
    info = path.stat()
    if info.st_size != entry.get("size"):
        return False
    return info.st_mtime_ns == entry.get("mtime_ns") or _digest(path) == entry.get("sha256")


def check_processed(folder: Path, files) -> None:
    """Damaged names the first of the cache ``files`` (relative to ``folder``, all present)
    that differs from its record or, unrecorded, cannot be read by its format."""
    record = _read_record(folder)
    for rel in files:
        entry = record.get(rel)
        if entry is None:
            check_file(folder, rel)
            continue
        size = (folder / rel).stat().st_size
        require(size == entry.get("size"), rel,
                f"{size} bytes, not the {entry.get('size')} it had when it was written")
        require(_matches(folder / rel, entry), rel, "it changed since it was written")


def record_processed(folder: Path, files) -> None:
    """Record the cache ``files`` (relative to ``folder``) as they are now, after a load that
    read or wrote them; a folder that cannot be written keeps its record as it was."""
    old = _read_record(folder)
    new = {}
    for rel in files:
        path, entry = folder / rel, old.get(rel)
        if entry is not None and _matches(path, entry):
            new[rel] = dict(entry, mtime_ns=path.stat().st_mtime_ns)
        else:
            info = path.stat()
            new[rel] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns,
                        "sha256": _digest(path)}
    if new != old:
        _write_atomically(folder / RECORD, json.dumps(new, indent=1, sort_keys=True))


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all; not at all in a folder that cannot be
    written (a read-only dataset folder: its unrecorded cache is checked again next time)."""
    try:
        fd, partial = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(partial, path)
    except OSError:
        os.unlink(partial)
