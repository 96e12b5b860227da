"""A stored list of sha256s (beside the vector files and the neighbour index) held as one byte array.

Row ``r`` of a view's vector file and id ``r`` of its faiss index are the image on line ``r`` of a ``.shas``
file (one sha256 a line). Read as Python strings, a list of a million is about 116 MB (a 113-byte ``str`` an
image and the list), and the dict or set that looks them up about as much again, for each of the two views' files
and indexes: about 0.8 GB of a 1% batch at a million images, where every string is read from the file. Here the
list is one fixed-width ``S`` array (64 bytes a sha256: 64 MB at a million) and a lookup is a binary search of
each listed image among the eligible ones (``Keys``: sorted, or with the order that sorts them, found once a
curation), so no string, dict or set is made an image; the file's bytes are the same.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import numpy as np
import pyarrow as pa

from tasks.curation.positions import position_code, position_dtype

WRITE_ROWS = 65_536  # lines joined at a time when a list is written
_LINE = 65  # a sha256's 64 hex digits and a newline: the fast read
PREFIX_ROWS = 1 << 16  # keys made contiguous at a time for their prefixes, and located at a time


def keys(shas: Sequence[str] | np.ndarray) -> np.ndarray:
    """``shas`` as a fixed-width byte array (ASCII: a sha256 is hex)."""
    if isinstance(shas, np.ndarray) and shas.dtype.kind == "S":
        return shas
    shas = shas if isinstance(shas, list) else list(shas)
    if not shas:
        return np.zeros(0, dtype="S64")
    if all(len(s) == 64 for s in shas):  # sha256s: one joined buffer (a list made into ``S`` dtype: 14x slower)
        return np.frombuffer("".join(shas).encode("ascii"), dtype="S64")
    return np.array(shas, dtype="S")


def column_keys(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow string column (no nulls) as ``keys`` would make it, without a Python string a value: a column of
    sha256s (every value 64 characters) is its data buffer seen as ``S64``, the rest goes through ``keys``."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [_chunk_keys(chunk) for chunk in chunks if len(chunk)]
    if not parts:
        return np.zeros(0, dtype="S64")
    if len(parts) == 1:
        return parts[0]
    width = max(p.dtype.itemsize for p in parts)
    return np.concatenate([p.astype(f"S{width}", copy=False) for p in parts])


def _chunk_keys(chunk: pa.Array) -> np.ndarray:
    if chunk.null_count:
        raise ValueError("column_keys: a key column holds nulls")
    if pa.types.is_string(chunk.type):  # int32 offsets: a run of 64-character values is one buffer, as is
        _, offsets, data = chunk.buffers()
        ends = np.frombuffer(offsets, dtype=np.int32, count=len(chunk) + 1, offset=4 * chunk.offset)
        if bool((np.diff(ends) == 64).all()):
            return np.frombuffer(data, dtype="S64", count=len(chunk), offset=int(ends[0]))
    return keys(chunk.to_pylist())


_HEX = np.full(256, 255, dtype=np.uint8)  # a lowercase hex digit's value; 255: not one
_HEX[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


def prefixes(array: np.ndarray) -> np.ndarray | None:
    """The first 16 hex digits of each key as one unsigned 64-bit number, in the keys' own order (a sha256's
    first 8 bytes); None when a key is shorter or not lowercase hex. Binary search on these is about three times
    as fast as on the 64-byte keys."""
    if not len(array) or array.dtype.itemsize < 16:
        return None
    out = np.empty(len(array), dtype=np.uint64)
    for start in range(0, len(array), PREFIX_ROWS):  # a block's copy at a time: a mapped list is not read whole
        block = np.ascontiguousarray(array[start:start + PREFIX_ROWS])
        digits = _HEX[block.view(np.uint8).reshape(len(block), -1)[:, :16]]
        if bool((digits == 255).any()):
            return None
        pairs = (digits[:, 0::2] << 4) | digits[:, 1::2]
        out[start:start + len(block)] = np.ascontiguousarray(pairs).view(">u8").ravel()
    return out


@dataclass(frozen=True)
class Keys:
    """sha256s looked up among (a curation's eligible images): their byte array and the order that sorts it
    (``None``: sorted already, as the eligible images are), checked once where they are built, not a lookup.

    ``prefix``: each key's ``prefixes`` number in sorted order when those tell every key apart (found once, 8 bytes
    a key), else None (every lookup compares whole keys). ``subset``: the keys are only these rows of ``array``
    (ascending; a position is counted among them), the rest of it another set's (the eligible images among the raw
    rows: no second copy of their bytes).
    """

    array: np.ndarray
    order: np.ndarray | None
    prefix: np.ndarray | None = field(default=None, compare=False, repr=False)
    subset: np.ndarray | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, shas: Sequence[str] | np.ndarray) -> Keys:
        if isinstance(shas, (SortedShas, SortedSubset)):
            return shas.keys  # the same bytes: no second copy
        array = keys(shas)
        order = None if bool((array[1:] >= array[:-1]).all()) else np.argsort(array, kind="stable")
        prefix = prefixes(array)
        if prefix is not None:
            prefix = prefix if order is None else prefix[order]
            prefix = prefix if bool((prefix[1:] > prefix[:-1]).all()) else None  # two keys share one: whole keys
        return cls(array, order, prefix)

    def __len__(self) -> int:
        return len(self.array) if self.subset is None else len(self.subset)

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The keys (bytes) at these positions."""
        return self.array[positions if self.subset is None else self.subset[positions]]

    def within(self, rows: np.ndarray) -> np.ndarray:
        """Rows of ``array`` (-1: none) as positions among these keys (-1: not one of them)."""
        if self.subset is None:
            return rows
        if not len(self.subset):
            return np.full(len(rows), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.subset, rows), len(self.subset) - 1)
        return np.where((rows >= 0) & (self.subset[at] == rows), at, -1)

    def positions(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each value's position among these keys, or -1 (int64): a binary search a value, no hash of the keys
        (an Arrow ``index_in`` against a million sha256s held about 190 MB while it ran, bench/README.md)."""
        return ShaList(column_keys(column)).located(self)


def _well_formed(lines: np.ndarray) -> bool:
    """Every line of 64 characters above a space, then a newline (checked a block of lines at a time)."""
    for start in range(0, len(lines), WRITE_ROWS):
        block = lines[start:start + WRITE_ROWS]
        if not bool((block[:, -1] == ord("\n")).all()) or bool((block[:, :-1] <= ord(" ")).any()):
            return False
    return True


def _located(block: np.ndarray, wanted: np.ndarray, among: Keys) -> np.ndarray:
    """Each key of ``block`` among ``among`` (``wanted``: its array, of the block's width), or -1."""
    order = among.order
    mine = prefixes(block) if among.prefix is not None else None
    if mine is not None:  # the one key with this prefix, if any (``Keys.prefix`` tells every key apart)
        at = np.minimum(np.searchsorted(among.prefix, mine), len(wanted) - 1)
    else:
        at = np.minimum(np.searchsorted(wanted, block, sorter=order), len(wanted) - 1)
    at = at if order is None else order[at]
    return np.where(wanted[at] == block, at, -1)


def _common(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    width = f"S{max(a.dtype.itemsize, b.dtype.itemsize)}"
    return a.astype(width, copy=False), b.astype(width, copy=False)


class ShaList:
    """sha256s in a stored order (row ``r`` is ``self[r]``), as one byte array."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @classmethod
    def of(cls, shas: Sequence[str] | np.ndarray) -> ShaList:
        return cls(keys(shas))

    @classmethod
    def read(cls, path: Path) -> ShaList:
        """The list in ``path`` (one sha256 a line). Lines of 64 characters are the file itself, memory-mapped
        read-only: the keys are the file's pages (the kernel's to drop, shared by concurrent curations), seen as 64
        bytes every 65, not a copy in the process (64 MB a list at a million images, two or three lists a batch).
        The file is never written in place (a new list is renamed over it): the mapping stays valid."""
        size = path.stat().st_size
        if size and size % _LINE == 0:
            lines = np.memmap(path, dtype=np.uint8, mode="r").reshape(-1, _LINE)
            if _well_formed(lines):
                return cls(np.ndarray((len(lines),), dtype="S64", buffer=lines, strides=(_LINE,)))
        return cls(keys([s.decode("ascii") for s in path.read_bytes().split()]))

    def write(self, path: Path, more: Sequence[str] = ()) -> None:
        """One sha256 a line (these, then ``more``), written a block of lines at a time."""
        with open(path, "wb") as out:
            for array in (self.array, keys(more)) if len(more) else (self.array,):
                for start in range(0, len(array), WRITE_ROWS):
                    out.write(b"".join(k + b"\n" for k in array[start:start + WRITE_ROWS].tolist()))

    def __len__(self) -> int:
        return len(self.array)

    def extended(self, shas: Sequence[str]) -> ShaList:
        """This list with ``shas`` after it."""
        if not len(shas):
            return self
        old, new = _common(self.array, keys(shas))
        return ShaList(np.concatenate([old, new]))

    def located(self, among: Keys, dtype: type = np.int64) -> np.ndarray:
        """Each row's position in ``among`` (one binary search a row), or -1: the positions of this list's images
        among them (``dtype``: int32 where the caller keeps them, half of int64's bytes a row)."""
        out = np.full(len(self.array), -1, dtype=dtype)
        for start, at in self._located_blocks(among):
            out[start:start + len(at)] = at
        return out

    def rows_of(self, among: Keys, dtype: type = np.int64) -> np.ndarray:
        """The row of each of ``among`` in this list (the first, if listed twice), or -1 (``dtype``: int32 where the
        caller keeps them and the list's rows fit). Found a block of the list at a time: no position a row of the
        list is held (a million's vector list, 8 MB; with the rows found, 16 MB more, for a batch's lookup)."""
        rows = np.full(len(among), -1, dtype=dtype)
        for start, at in self._located_blocks(among):
            listed = np.flatnonzero(at >= 0)[::-1]  # within a block the last assignment stands: the first row
            targets = at[listed]
            first = rows[targets] < 0  # none found in an earlier block
            rows[targets[first]] = listed[first] + start
        return rows

    def _located_blocks(self, among: Keys) -> Iterator[tuple[int, np.ndarray]]:
        """(each block's first row, its rows' positions in ``among`` or -1), ``PREFIX_ROWS`` rows at a time (whole, a
        million's list gathered 64 MB of keys to compare)."""
        array, wanted = _common(self.array, among.array)
        if not len(array) or not len(among):
            return
        for start in range(0, len(array), PREFIX_ROWS):
            yield start, among.within(_located(array[start:start + PREFIX_ROWS], wanted, among))


class _HeldStrings(Sequence[str]):
    """Strings held as one byte array: each made a ``str`` when it is read (``bytes_at``: the keys at an index)."""

    @abstractmethod
    def bytes_at(self, i: int | slice) -> np.ndarray: ...

    @abstractmethod
    def index_of(self, sha: str) -> int | None: ...

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [k.decode("ascii") for k in self.bytes_at(i).tolist()]
        return self.bytes_at(i).decode("ascii")

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), WRITE_ROWS):  # a block's strings at a time
            yield from (k.decode("ascii") for k in self.bytes_at(slice(start, start + WRITE_ROWS)).tolist())

    def __contains__(self, sha: object) -> bool:
        return isinstance(sha, str) and self.index_of(sha) is not None


class SortedShas(_HeldStrings):
    """Distinct sha256s in ascending order, held as one byte array (64 bytes an image; their prefixes, 8 more,
    where those tell them apart), each made a ``str`` when it is read: the raw rows' and the eligible images' identity
    (a list of Python strings was 121 bytes an image, and the eligible images' ``Keys`` a second copy of their bytes).

    ``index_of`` finds one by bisection of the prefixes (a ``memoryview`` of them: no Python int held an image),
    ``keys`` is the same bytes as ``Keys`` (for a column's lookups), ``take`` a subset (ascending positions).
    """

    def __init__(self, array: np.ndarray, prefix: np.ndarray | None = None) -> None:
        """``prefix``: the keys' ``prefixes``, stored beside them (strictly ascending: the keys are then ascending and
        distinct, and no pass over the keys checks it or finds them)."""
        self.array = array
        if prefix is not None:
            if len(prefix) != len(array) or (len(prefix) > 1 and not bool((prefix[1:] > prefix[:-1]).all())):
                raise ValueError("SortedShas: the stored prefixes must be one a key, strictly ascending")
            self.keys = Keys(array, None, prefix)
        else:
            self.keys = Keys.of(array)
            if self.keys.order is not None or (len(array) > 1 and bool((array[1:] == array[:-1]).any())):
                raise ValueError("SortedShas: the keys must be ascending and distinct")
        prefix = self.keys.prefix
        self._prefix = None if prefix is None else memoryview(np.ascontiguousarray(prefix)).cast("B").cast("Q")

    @classmethod
    def of(cls, shas: Iterable[str]) -> SortedShas:
        """From strings in ascending order, distinct (``ValueError`` otherwise)."""
        return cls(keys(list(shas)))

    def __len__(self) -> int:
        return len(self.array)

    def bytes_at(self, i: int | slice) -> np.ndarray:
        return self.array[i]

    def index_of(self, sha: str) -> int | None:
        """``sha``'s position, or None: a bisection of the prefixes (about 2 us at a million, a list's bisection
        0.9), then the one key there compared."""
        try:
            key = sha.encode("ascii")
            i = bisect_left(self._prefix, int(sha[:16], 16)) if self._prefix is not None else \
                int(np.searchsorted(self.array, key))
        except (UnicodeEncodeError, ValueError):  # not a key of ours (a non-hex prefix, or not ASCII)
            return None
        return i if i < len(self.array) and self.array[i] == key else None

    def take(self, positions: np.ndarray) -> SortedSubset:
        """The keys at ``positions`` (ascending, distinct): a subset held as those positions (4 bytes a key when
        there are fewer than 2**31), its bytes these."""
        return SortedSubset(self, positions)


class SortedSubset(_HeldStrings):
    """Some of a ``SortedShas`` (``base``), held as their ascending positions in it: read as a sequence of strings,
    looked up as ``Keys`` (``keys``: the base's bytes, counted among the subset)."""

    def __init__(self, base: SortedShas, positions: np.ndarray) -> None:
        positions = np.asarray(positions)  # as given where of the type (a mapped array stays mapped), else a copy
        self.base, self.positions = base, positions.astype(position_dtype(len(base)), copy=False)
        if len(positions) > 1 and not bool((positions[1:] > positions[:-1]).all()):
            raise ValueError("SortedSubset: the positions must be ascending and distinct")
        self.keys = Keys(base.array, None, base.keys.prefix, subset=self.positions)
        self._bisect = memoryview(np.ascontiguousarray(self.positions)).cast("B").cast(position_code(len(base)))

    def __len__(self) -> int:
        return len(self.positions)

    def bytes_at(self, i: int | slice) -> np.ndarray:
        return self.base.array[self.positions[i]]

    def index_of(self, sha: str) -> int | None:
        """``sha``'s position in the subset, or None."""
        j = self.base.index_of(sha)
        if j is None:
            return None
        i = bisect_left(self._bisect, j)
        return i if i < len(self.positions) and self._bisect[i] == j else None

    def union(self, more: Iterable[str]) -> SortedSubset:
        """These and ``more`` (each one of the base's: ``KeyError`` otherwise), ascending and distinct."""
        extra = [self.base.index_of(s) for s in more]
        if any(j is None for j in extra):
            raise KeyError("SortedSubset.union: a key that is not one of the base's")
        return SortedSubset(self.base, np.union1d(self.positions, np.array(extra, dtype=np.int64)))
