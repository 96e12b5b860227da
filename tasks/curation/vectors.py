"""The embedding's unit vectors on disk, memory-mapped: one float32 ``.npy`` file per embedding version and view.

The neighbour search (``tasks.curation.neighbours``) reads an eligible image's vector by position;
holding every vector of the table in memory grows with the table (and the blurred view's float64
intermediate with it). So each view's unit rows live in ``<name>.vectors.npy`` next to the faiss
index (``curation_index/``), opened with ``np.load(mmap_mode="r")``: the search touches the pages of
the rows it reads (the queries and their neighbours), not the table. Row ``r`` is the image on line
``r`` of ``<name>.vectors.shas`` (held as one byte array: ``tasks.curation.sha_list``).

* Extended with each batch's new images, in sha256 order, as the index is: the new rows (the batch's
  fresh features, already in memory) are written after the old ones into a new file, copied in
  blocks (no whole-table buffer), and renamed over the old one; the sha list follows the same way.
  The sha list is the commit point: a file whose rows do not match its list is rebuilt.
* Rebuilt when missing or stale (rows, dimension or sha list disagree) from the ``curation_embeddings``
  Delta table, the source of truth: only the rows the curation needs, read by key.
* Idempotent: an image already in the file is never appended again, so a retried batch (after a
  crash anywhere) leaves the same file as a batch that ran once. Two curations at once extend a
  view's files one after the other (a ``flock`` on ``<name>.vectors.lock``), so rows and list agree.

The values are the ones ``tasks.curation.curation_features`` computes (row by row: a row's unit
vector and blurred view do not depend on the other rows), so the decisions do not depend on
whether a row came from memory, the file or a rebuild.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tasks.curation.sha_list import Keys, ShaList

log = logging.getLogger(__name__)

COPY_ROWS = 65_536  # rows per block when a file is extended: bounds the copy's memory


class VectorFile:
    """Unit rows of one embedding version and view, memory-mapped read-only, row ``r`` = ``shas[r]``."""

    def __init__(self, path: Path, shas: ShaList, array: np.ndarray | None) -> None:
        self.path, self.shas, self.array = path, shas, array

    @classmethod
    def open(cls, folder: Path, key: str) -> VectorFile:
        """The stored file of ``key`` (embedding version and view); empty when missing or stale (then rebuilt)."""
        path = folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.vectors.npy"
        shas_path = path.with_suffix(".shas")
        if path.exists() and shas_path.exists():
            array = np.load(path, mmap_mode="r")
            shas = ShaList.read(shas_path)
            if array.dtype == np.float32 and array.ndim == 2 and array.shape[0] == len(shas):
                return cls(path, shas, array)
            log.warning("curate: vector file %s does not match its sha list: rebuilt", path.name)
        return cls(path, ShaList.of([]), None)

    def rows(self, shas: Keys) -> np.ndarray:
        """The row of each of ``shas``, -1 where it has none."""
        return self.shas.rows_of(shas)

    def append(self, shas: Sequence[str], blocks: Iterable[np.ndarray]) -> None:
        """Add the rows of ``blocks`` (in order, one per sha of ``shas``, none already in the file) after the stored
        ones, atomically. Each block is written as it comes: memory holds one block, never the new rows twice."""
        if not len(shas):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as out:
                self._write(out, len(shas), iter(blocks))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.path)  # rows first, then the list: a crash between leaves a mismatch (rebuilt)
        shas_tmp = self.path.with_name(f"{self.path.with_suffix('.shas').name}.{os.getpid()}.tmp")
        listed = self.shas.extended(shas)
        listed.write(shas_tmp)
        os.replace(shas_tmp, self.path.with_suffix(".shas"))
        self.shas = listed
        self.array = np.load(self.path, mmap_mode="r")

    def _write(self, out: BinaryIO, new: int, blocks: Iterator[np.ndarray]) -> None:
        """The header, the stored rows a block at a time, then the ``new`` rows of ``blocks`` as they come."""
        head = next(blocks, None)
        if head is None:
            raise ValueError(f"{self.path.name}: 0 rows for {new} images")
        first = _rows(head)
        width = first.shape[1] if self.array is None else self.array.shape[1]
        np.lib.format.write_array_header_1_0(
            out, {"descr": "<f4", "fortran_order": False, "shape": (len(self.shas) + new, width)})
        for start in range(0, len(self.shas), COPY_ROWS):
            out.write(memoryview(np.ascontiguousarray(self.array[start:start + COPY_ROWS])))
        written = 0
        for block in itertools.chain([first], map(_rows, blocks)):
            if block.shape[1] != width:
                raise ValueError(f"{self.path.name}: rows of {block.shape[1]} floats, the file has {width}")
            out.write(memoryview(block))
            written += len(block)
        if written != new:
            raise ValueError(f"{self.path.name}: {written} rows for {new} images")


def _rows(block: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(block, dtype=np.float32).reshape(len(block), -1)


def _consecutive(rows: np.ndarray) -> bool:
    """``rows`` are the file's rows ``rows[0], rows[0] + 1, ...`` (more than one)."""
    return (isinstance(rows, np.ndarray) and rows.ndim == 1 and len(rows) > 1
            and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool((np.diff(rows) == 1).all()))


class RowView:
    """The rows of ``eligible`` (by position) in a memory-mapped file: gathers only the rows asked for."""

    def __init__(self, array: np.ndarray, rows: np.ndarray) -> None:
        self._array, self._rows = array, rows
        self.shape = (len(rows), array.shape[1])

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, positions) -> np.ndarray:
        """The rows at ``positions``; read-only. Consecutive rows of the file (a first curation's eligible images,
        in order: the whole index build at a million, 256 MB) are a view of the file, not a copy."""
        rows = self._rows[positions]
        if _consecutive(rows):
            out = np.asarray(self._array[int(rows[0]):int(rows[-1]) + 1]).view()
        else:
            out = np.asarray(self._array[rows])
        out.flags.writeable = False  # a view of a writable array, or a copy: a caller that writes fails on either
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # the exact search: every row, small by definition
        out = np.asarray(self._array[self._rows])
        return out if dtype is None else out.astype(dtype)


@contextmanager
def _extending(folder: Path, key: str) -> Iterator[None]:
    """An exclusive lock on ``key``'s files while they are read and extended (``flock``: freed if the process dies).

    The mapping a search holds stays valid after another process renames a newer file over it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.vectors.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stored_views(folder: Path, version: str, eligible: Sequence[str],
                 vectors_of: Callable[[list[str]], np.ndarray],
                 derived: Sequence[Callable[[np.ndarray], np.ndarray]] = (), asked: Keys | None = None
                 ) -> list[RowView]:
    """Each view of the eligible images, positions as in ``eligible``: view 0 the unit embedding, then ``derived``.

    The files are extended first with the images they lack (``vectors_of(shas)``: their unit rows,
    in that order; a derived view is computed from those rows only, a block of rows at a time: the
    blurred view's float64 scratch is a block's, not the batch's, and a row's value does not depend on it).
    ``asked``: the eligible images' ``Keys``, when the caller has them (a curation builds them once).
    """
    views: list[RowView] = []
    fetched: dict[tuple[str, ...], np.ndarray] = {}
    asked = Keys.of(eligible) if asked is None else asked
    for i, derive in enumerate([None, *derived]):
        with _extending(folder, f"{version};view={i}"):  # another curation's extension waits: rows and list agree
            store = VectorFile.open(folder, f"{version};view={i}")
            rows = store.rows(asked)
            missing = sorted(eligible[p] for p in np.flatnonzero(rows < 0).tolist())
            if missing:
                key = tuple(missing)
                if key not in fetched:
                    fetched[key] = np.asarray(vectors_of(missing), dtype=np.float32)
                base = fetched[key]
                store.append(missing, (base[start:start + COPY_ROWS] if derive is None  # a block at a time: bounded
                                       else derive(base[start:start + COPY_ROWS])
                                       for start in range(0, len(base), COPY_ROWS)))
                rows = store.rows(asked)
        if len(rows) and int(rows.min()) < 0:
            raise ValueError(f"{store.path.name}: {int((rows < 0).sum())} eligible images have no row")
        views.append(RowView(store.array if store.array is not None else np.zeros((0, 1), np.float32), rows))
    return views
