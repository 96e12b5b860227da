"""Per-image rows held as numpy columns keyed by sha256: a read-only mapping that builds a row on demand.

A curation reads facts of every image of the raw version (a million on a batch of a million-image
table): as dicts or named tuples of Python objects they cost hundreds of bytes an image, and their
conversion from Arrow a Python object per cell. ``ShaColumns`` holds them as columns instead: the sha256
and digests as fixed-width bytes, numbers as numpy numbers with a null mask, strings with few distinct
values as object arrays that share them. Rows are sorted by sha256; a lookup is a binary search.
A subclass says how a row is built (``_build``): the same value, with the same Python types and
``None``s, as a dict of the table's rows would hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

V = TypeVar("V")


class ShaColumns(Mapping[str, V]):
    """Rows by sha256, one per sha256, iterated in sha256 order; a subclass builds a row (``_build``)."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        """``columns`` (``columns_of``), one row per image in any order; a sha256 twice keeps its last row (as a dict
        built row by row would)."""
        shas = columns["sha256"]
        order = np.argsort(shas, kind="stable")
        last = np.ones(len(order), dtype=bool)
        last[:-1] = shas[order][1:] != shas[order][:-1]
        keep = order[last]
        self._columns = {name: values[keep] for name, values in columns.items()}
        self._shas = self._columns["sha256"]

    def merged(self, newer: ShaColumns[V]) -> ShaColumns[V]:
        """These rows and ``newer``'s, ``newer``'s row where a sha256 is in both."""
        return type(self)({name: np.concatenate([values, newer._columns[name]])
                           for name, values in self._columns.items()})

    def value(self, name: str, i: int) -> object:
        """Column ``name`` of row ``i`` as a Python value (None where null)."""
        if self._columns[f"{name}?"][i]:
            return None
        value = self._columns[name][i]
        if isinstance(value, np.bytes_):
            return value.decode()
        return value.item() if isinstance(value, np.generic) else value

    def _build(self, i: int) -> V:
        raise NotImplementedError

    def _row(self, sha: str) -> int:
        key = sha.encode()
        i = int(np.searchsorted(self._shas, key))
        return i if i < len(self._shas) and self._shas[i] == key else -1

    def __getitem__(self, sha: str) -> V:
        i = self._row(sha) if isinstance(sha, str) else -1
        if i < 0:
            raise KeyError(sha)
        return self._build(i)

    def __contains__(self, sha: object) -> bool:
        return isinstance(sha, str) and self._row(sha) >= 0

    def __iter__(self) -> Iterator[str]:
        return (sha.decode() for sha in self._shas)

    def __len__(self) -> int:
        return len(self._shas)


def columns_of(table: pa.Table, *, names: Iterable[str], floats: Iterable[str] = (), ints: Iterable[str] = (),
               fixed: Iterable[str] = (), strings: Iterable[str] = ()) -> dict[str, np.ndarray]:
    """``sha256`` (no nulls) and ``names`` of ``table`` as numpy columns, each with its null mask (``name?``).

    ``floats``: float64 (NaN where null); ``ints``: int64 (0 where null); ``fixed``: fixed-width bytes (digests);
    ``strings``: object arrays sharing their distinct values. A name the table lacks reads as null.
    """
    n = table.num_rows
    columns = {"sha256": _fixed_bytes(_whole(table.column("sha256"))), "sha256?": np.zeros(n, dtype=bool)}
    floats, ints, fixed = set(floats), set(ints), set(fixed)
    for name in names:
        column = _whole(table.column(name)) if name in table.column_names else pa.nulls(n, pa.string())
        columns[f"{name}?"] = column.is_null().to_numpy(zero_copy_only=False)
        if name in floats:
            columns[name] = column.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        elif name in ints:
            columns[name] = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        elif name in fixed:
            columns[name] = _fixed_bytes(column.cast(pa.string()).fill_null(""))
        else:
            columns[name] = _shared_strings(column.cast(pa.string()))
    return columns


def _whole(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _fixed_bytes(column: pa.Array) -> np.ndarray:
    """A string column (no nulls) as numpy fixed-width bytes (UTF-8): no Python object per row once built."""
    values = column.cast(pa.binary()).to_numpy(zero_copy_only=False)
    return values.astype(bytes) if len(values) else np.zeros(0, dtype="S1")


def _shared_strings(column: pa.Array) -> np.ndarray:
    """A string column as an object array whose equal strings are one object (a few distinct values a column)."""
    encoded = pc.dictionary_encode(column)
    distinct = np.array([*encoded.dictionary.to_pylist(), None], dtype=object)
    indices = encoded.indices.fill_null(len(distinct) - 1).to_numpy(zero_copy_only=False)
    return distinct[indices]
