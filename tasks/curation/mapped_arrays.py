"""Working arrays by table position kept in files mapped into memory, not in the process's own memory.

A batch's curation fills a few arrays with a value for every image of the table (the nearest summary's score, partner
and eligibility, each image's newest stored row): about 20 bytes an image, 20 MB at a million, that grew its anonymous
memory with the table (bench/README.md, runs 39 and 41). Here such an array is a shared mapping of a file made in a
folder of the curation's and unlinked at once: the kernel writes its pages back and may drop them (they are not the
process's anonymous memory), and the file goes with the last reference to the mapping. Without a folder (tests, small
tables) it is an ordinary ``array``.

The array is a ``memoryview`` of the mapping cast to the item type: it indexes to Python ints and floats as ``array``
does and is a buffer for ``np.frombuffer``, so code written for either works with both.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from array import array
from pathlib import Path

import numpy as np

PREFIX = ".by-position-"


def by_position(n: int, typecode: str, fill: float, folder: Path | None) -> array | memoryview:
    """``n`` items of ``typecode`` (``array``'s codes: "B", "i", "q", "d"), each ``fill``: mapped from an unlinked file in
    ``folder`` (made if missing), or an ``array`` without one."""
    if folder is None:
        return array(typecode, [int(fill) if typecode != "d" else fill]) * n
    itemsize = array(typecode).itemsize
    folder.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=PREFIX, dir=folder)
    try:
        os.unlink(path)  # the mapping keeps the file's pages; nothing is left behind by a crash
        size = max(n, 1) * itemsize
        os.ftruncate(fd, size)  # a sparse file: zeros until written
        mapping = mmap.mmap(fd, size)  # shared: written pages go back to the file, not to anonymous memory
    finally:
        os.close(fd)
    view = memoryview(mapping).cast(typecode)[:n]
    if fill != 0:
        np.frombuffer(view, dtype=np.dtype(typecode))[:] = fill
    return view


def mapped_zeros(n: int, dtype: type | np.dtype, folder: Path | None) -> np.ndarray:
    """``n`` zeros of ``dtype`` as a writable numpy array: a mapping of an unlinked file in ``folder`` (``by_position``),
    or an ordinary array without a folder."""
    if folder is None:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(by_position(n, np.dtype(dtype).char, 0, folder), dtype=dtype)


def mapped_copy(values: np.ndarray, folder: Path | None) -> np.ndarray:
    """``values`` (one dimension) copied into a mapping of ``folder`` (``mapped_zeros``), or ``values`` themselves
    without a folder."""
    if folder is None:
        return values
    out = mapped_zeros(len(values), values.dtype, folder)
    out[:] = values
    return out


TAKE_BLOCK = 1 << 16  # indices read at a time by ``take_into`` and ``compress_into``


def take_into(values: np.ndarray, at: np.ndarray, out: np.ndarray, block: int = TAKE_BLOCK) -> np.ndarray:
    """``np.take(values, at, out=out)``, a block of ``at`` at a time (an index out of range raises as it does).

    numpy's ``take`` casts every index to intp and, given ``out``, fills a buffer of the whole result first: a
    million int32 indices into a mapped ``out`` held 12 MB of the heap for a 4 MB result."""
    for a in range(0, len(at), block):
        out[a:a + block] = values[at[a:a + block]]
    return out


def compress_into(keep: np.ndarray, values: np.ndarray, out: np.ndarray, block: int = TAKE_BLOCK) -> np.ndarray:
    """``np.compress(keep, values, out=out)`` (``keep`` a bool a value, ``out`` as long as the kept), a block at a
    time: numpy's ``compress`` is a ``take`` of every kept index (``take_into``)."""
    done = 0
    for a in range(0, len(keep), block):
        part = values[a:a + block][keep[a:a + block]]
        out[done:done + len(part)] = part
        done += len(part)
    return out
