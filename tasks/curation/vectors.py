"""The embedding's unit vectors on disk, memory-mapped: one float32 ``.npy`` file per embedding version and view.

The neighbour search (``tasks.curation.neighbours``) reads an eligible image's vector by position;
holding every vector of the table in memory grows with the table (and the blurred view's float64
intermediate with it). So each view's unit rows live in ``<name>.vectors.npy`` next to the faiss
index (``curation_index/``), opened with ``np.load(mmap_mode="r")``: the search touches the pages of
the rows it reads (the queries and their neighbours), not the table. Row ``r`` is the image on line
``r`` of ``<name>.vectors.shas`` (held as one byte array: ``tasks.curation.sha_list``).

* Extended with each batch's new images, in sha256 order, as the index is: the new rows (the batch's
  fresh features, already in memory) are written in place after the stored ones, then the header's row
  count, then the sha list (a new list renamed over the old one). A batch writes and touches its own
  rows only: the old rows were copied into a new file, every batch (at a million images, 256 MB a view
  read through the mapping, which counted in the batch's resident high, and written again). The sha
  list is the commit point: the file's first ``len(list)`` rows are the listed images'; rows after them
  are an append that did not commit (cut by the next append). A file with fewer rows than its list is
  rebuilt. A file is copied whole only when its header cannot hold the new row count (not a file
  numpy's ``write_array_header_1_0`` wrote: its header has room for 21 digits).
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
import io
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tasks.curation.mapped_arrays import mapped_copy
from tasks.curation.positions import position_dtype
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
            try:
                array = np.load(path, mmap_mode="r")
            except (ValueError, EOFError, OSError):  # not an array (a torn write): no row of it is read, rebuilt
                array = None
            shas = ShaList.read(shas_path)
            if array is not None and array.dtype == np.float32 and array.ndim == 2 and array.shape[0] >= len(shas):
                # Rows past the list: an append that wrote its rows and the header, not its list (not committed).
                return cls(path, shas, array if array.shape[0] == len(shas) else array[:len(shas)])
            log.warning("curate: vector file %s does not match its sha list: rebuilt", path.name)
        return cls(path, ShaList.of([]), None)

    def rows(self, shas: Keys) -> np.ndarray:
        """The row of each of ``shas``, -1 where it has none."""
        return self.shas.rows_of(shas, position_dtype(len(self.shas)))

    def append(self, shas: Sequence[str], blocks: Iterable[np.ndarray]) -> None:
        """Add the rows of ``blocks`` (in order, one per sha of ``shas``, none already in the file) after the stored
        ones, then commit them with the list. Each block is written as it comes: memory holds one block, never the
        new rows twice; the stored rows are neither read nor written (``_append_in_place``) unless the header
        cannot hold the new count. A failed append leaves the file's bytes as they were."""
        if not len(shas):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blocks = iter(blocks)
        if self.array is None or not self._append_in_place(len(shas), blocks):
            self._append_by_copy(len(shas), blocks)
        shas_tmp = self.path.with_name(f"{self.path.with_suffix('.shas').name}.{os.getpid()}.tmp")
        self.shas.write(shas_tmp, more=shas)  # the stored list and the new lines: no joined copy of the list
        os.replace(shas_tmp, self.path.with_suffix(".shas"))  # the commit point
        self.shas = ShaList.read(self.path.with_suffix(".shas"))  # mapped again
        self.array = np.load(self.path, mmap_mode="r")
        if self.array.shape[0] != len(self.shas):
            raise ValueError(f"{self.path.name}: {self.array.shape[0]} rows for {len(self.shas)} listed images")

    def _append_in_place(self, new: int, blocks: Iterator[np.ndarray]) -> bool:
        """The new rows written after the committed ones in the file itself (rows an earlier append left uncommitted
        are cut first), then the header's row count rewritten over it (the same length): a batch touches its own rows
        only. False, with nothing written, when the header cannot hold the new count (then ``_append_by_copy``)."""
        width = self.array.shape[1]
        header = _header(len(self.shas) + new, width)
        with open(self.path, "r+b") as out:
            if np.lib.format.read_magic(out) != (1, 0):
                return False
            np.lib.format.read_array_header_1_0(out)
            if out.tell() != len(header):
                return False
            end = len(header) + len(self.shas) * width * 4  # the committed rows' end
            out.truncate(end)
            out.seek(end)
            try:
                _write_rows(out, self.path.name, width, new, blocks)
                out.flush()  # the rows written before the header counts them (no fsync: as every write here, a
            except BaseException:  # crashed process's writes stand in the page cache; a lost machine rebuilds)
                out.truncate(end)
                raise
            out.seek(0)
            out.write(header)
        return True

    def _append_by_copy(self, new: int, blocks: Iterator[np.ndarray]) -> None:
        """A new file (the header, the stored rows a block at a time, then the new rows) renamed over the old one."""
        if self.array is None:  # a first or rebuilt file: no list may name its rows before it lists them itself
            self.path.with_suffix(".shas").unlink(missing_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as out:
                head = next(blocks, None)
                if head is None:
                    raise ValueError(f"{self.path.name}: 0 rows for {new} images")
                head = _rows(head)
                width = head.shape[1] if self.array is None else self.array.shape[1]
                out.write(_header(len(self.shas) + new, width))
                for start in range(0, len(self.shas), COPY_ROWS):
                    out.write(memoryview(np.ascontiguousarray(self.array[start:start + COPY_ROWS])))
                _write_rows(out, self.path.name, width, new, itertools.chain([head], blocks))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.path)  # rows first, then the list: the old list names the new file's first rows


def _header(rows: int, width: int) -> bytes:
    """The ``.npy`` header of ``rows`` float32 rows of ``width`` (numpy pads it with room for the row count to grow)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": (rows, width)})
    return buffer.getvalue()


def _write_rows(out: BinaryIO, name: str, width: int, new: int, blocks: Iterable[np.ndarray]) -> None:
    """The ``new`` rows of ``blocks`` as they come, each checked against the file's width, then their count."""
    written = 0
    for block in map(_rows, blocks):
        if block.shape[1] != width:
            raise ValueError(f"{name}: rows of {block.shape[1]} floats, the file has {width}")
        out.write(memoryview(block))
        written += len(block)
    if written != new:
        raise ValueError(f"{name}: {written} rows for {new} images")


def _rows(block: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(block, dtype=np.float32).reshape(len(block), -1)


def _consecutive(rows: np.ndarray) -> bool:
    """``rows`` are the file's rows ``rows[0], rows[0] + 1, ...`` (more than one)."""
    return (isinstance(rows, np.ndarray) and rows.ndim == 1 and len(rows) > 1
            and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool((np.diff(rows) == 1).all()))


class RowView:
    """The rows of ``eligible`` (by position) in a memory-mapped file: gathers only the rows asked for."""

    def __init__(self, array: np.ndarray, rows: np.ndarray, scratch: Path | None = None) -> None:
        # int32 where the file's rows allow: 4 bytes an eligible image a view, held through the grouping (with a
        # ``scratch`` folder, a mapping of a file there: ``mapped_arrays``)
        self._array = array
        self._rows = mapped_copy(rows.astype(position_dtype(len(array)), copy=False), scratch)
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
                 derived: Sequence[Callable[[np.ndarray], np.ndarray]] = (), asked: Keys | None = None,
                 scratch: Path | None = None) -> list[RowView]:
    """Each view of the eligible images, positions as in ``eligible``: view 0 the unit embedding, then ``derived``.

    The files are extended first with the images they lack (``vectors_of(shas)``: their unit rows,
    in that order; a derived view is computed from those rows only, a block of rows at a time: the
    blurred view's float64 scratch is a block's, not the batch's, and a row's value does not depend on it).
    ``asked``: the eligible images' ``Keys``, when the caller has them (a curation builds them once); ``scratch``: a
    folder the views' row maps are mapped from (``RowView``).
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
        views.append(RowView(store.array if store.array is not None else np.zeros((0, 1), np.float32), rows, scratch))
        del rows
    return views
