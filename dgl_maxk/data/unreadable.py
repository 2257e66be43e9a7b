"""The :class:`DatasetError` for a damaged file of a real dataset, naming the dataset, the
file and the way on: for a file the checks found before DGL or OGB read it (:mod:`.checks`),
and for one that made their readers fail with the parser's own words ("This file contains
pickled (object) data", "Not a gzipped file"), found then by reading each file by its format.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from .dataset import DatasetError
from .formats import READ_ERRORS, Damaged, find_damaged, first_line


class Source(NamedTuple):
    """A real dataset as a loader reads it: ``name``, ``folder`` (under the data root),
    ``read_from`` (that folder, or dgl_maxk's writable copy of it), ``raw_files`` and
    ``cache_files`` (the processed cache DGL or OGB writes; both relative to it) and
    ``origin`` (where good raw files come from, in words)."""

    name: str
    folder: Path
    read_from: Path
    raw_files: tuple
    cache_files: tuple
    origin: str

    def caches(self) -> list:
        """The processed cache files there now."""
        return [f for f in self.cache_files if (self.read_from / f).is_file()]

    def copy_note(self) -> str:
        return "" if self.read_from == self.folder else (
            f" Then delete {self.read_from}/ (dgl_maxk's writable copy of the read-only "
            "folder; the next load copies it again).")


def damaged_error(source: Source, damaged: Damaged) -> DatasetError:
    """The error for a damaged raw or cache file of ``source``."""
    rel, why = damaged.rel, damaged.why
    if rel not in source.caches():
        return DatasetError(
            f"dataset '{source.name}': {source.folder / rel} is damaged ({why}). Replace it "
            f"with a good copy from {source.origin}.{source.copy_note()}")
    missing = [f for f in source.raw_files if not (source.read_from / f).is_file()]
    way = "Delete it: the next load rebuilds it from the raw files"
    if missing:
        way += (f", which must then be in {source.folder}/ (missing: {', '.join(missing)}; "
                f"get them from {source.origin})")
    return DatasetError(f"dataset '{source.name}': its processed cache "
                        f"{source.read_from / rel} is damaged ({why}). {way}.")


def unreadable_error(source: Source, err: BaseException) -> DatasetError:
    """The error for a dataset DGL or OGB failed to read with ``err``."""
    caches = source.caches()
    found = find_damaged(source.read_from, [*source.raw_files, *caches])
    if found is not None:
        return damaged_error(source, found)
    return DatasetError(
        f"dataset '{source.name}' cannot be read from {source.read_from}/ ({first_line(err)})."
        f" Replace its files with good copies from {source.origin}, and delete the processed "
        f"cache there (now: {', '.join(caches) or 'none'}).{source.copy_note()}")


@contextmanager
def reporting(source: Source):
    """A damaged file found in the block (Damaged), or a reader's failure, raised as the
    DatasetError that names the file and the way on."""
    try:
        yield
    except Damaged as damaged:
        raise damaged_error(source, damaged) from damaged
    except READ_ERRORS as err:
        raise unreadable_error(source, err) from err
