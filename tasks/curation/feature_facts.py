"""Each image's stored facts (``ImageFeatures``), held as columns and built one image at a time on demand.

A curation reads the facts of every image of the raw version (a million on a batch of a million-image
table). As a dict of named tuples of Python floats and strings they held about 0.5 GB at a million
images, and their conversion from Arrow (a Python object per cell) as much again. ``FactColumns`` holds
them in numpy columns instead: the sha256 and the pixel digest as fixed-width bytes, the statistics as
float64 with a null mask, the error and family as object arrays that share their few distinct strings
(about 0.2 GB at a million). Looking an image up is a binary search of the sorted sha256 column.

It is a read-only ``Mapping`` of sha256 to ``ImageFeatures``, iterated in sha256 order, so the rules
read it as they read a dict; a value is the same named tuple, with the same Python types and ``None``s,
as the row read into a dict would give.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class ImageFeatures(NamedTuple):
    """One image's stored features (the embedding lives in ``Features.matrix``)."""

    pixel_digest: str | None
    blur: float | None
    mean: float | None
    min: float | None
    max: float | None
    error: str | None
    contrast: float | None = None  # grey standard deviation
    family: str | None = None  # "grey" | "colour" (tasks.curation.image_stats)


FACT_COLUMNS = ImageFeatures._fields
_FLOATS = ("blur", "mean", "min", "max", "contrast")
_BYTES = ("sha256", "pixel_digest")  # fixed-width bytes with a null mask
_STRINGS = ("error", "family")  # object arrays of shared strings


class FactColumns(Mapping[str, ImageFeatures]):
    """The ``ImageFeatures`` of a set of images by sha256 (see the module): one row per sha256, sorted."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        """``columns``: as ``from_table`` makes them, one row per image in any order; a sha256 twice keeps its last
        row (as a dict built row by row would)."""
        shas = columns["sha256"]
        order = np.argsort(shas, kind="stable")
        last = np.ones(len(order), dtype=bool)
        last[:-1] = shas[order][1:] != shas[order][:-1]
        keep = order[last]
        self._columns = {name: values[keep] for name, values in columns.items()}
        self._shas = self._columns["sha256"]

    @classmethod
    def from_table(cls, table: pa.Table) -> FactColumns:
        """From ``sha256`` and the ``FACT_COLUMNS`` of ``table`` (a column the table lacks reads as null)."""
        n = table.num_rows
        columns = {"sha256": _fixed_bytes(_whole(table.column("sha256")))}
        for name in FACT_COLUMNS:
            column = _whole(table.column(name)) if name in table.column_names else pa.nulls(n, pa.string())
            nulls = column.is_null().to_numpy(zero_copy_only=False)
            if name in _FLOATS:
                columns[name] = column.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
            elif name in _BYTES:
                columns[name] = _fixed_bytes(column.cast(pa.string()).fill_null(""))
            else:
                columns[name] = _shared_strings(column.cast(pa.string()))
            columns[f"{name}?"] = nulls
        return cls(columns)

    @classmethod
    def empty(cls) -> FactColumns:
        return cls.from_table(pa.table({"sha256": pa.array([], pa.string())}))

    def merged(self, newer: FactColumns) -> FactColumns:
        """These facts and ``newer``'s, ``newer``'s row where a sha256 is in both."""
        return FactColumns({name: np.concatenate([values, newer._columns[name]])
                            for name, values in self._columns.items()})

    def _row(self, sha: str) -> int:
        key = sha.encode()
        i = int(np.searchsorted(self._shas, key))
        return i if i < len(self._shas) and self._shas[i] == key else -1

    def __getitem__(self, sha: str) -> ImageFeatures:
        i = self._row(sha) if isinstance(sha, str) else -1
        if i < 0:
            raise KeyError(sha)
        return ImageFeatures(*(self._value(name, i) for name in FACT_COLUMNS))

    def _value(self, name: str, i: int) -> str | float | None:
        if self._columns[f"{name}?"][i]:
            return None
        value = self._columns[name][i]
        if name in _FLOATS:
            return float(value)
        return value.decode() if name in _BYTES else value

    def __contains__(self, sha: object) -> bool:
        return isinstance(sha, str) and self._row(sha) >= 0

    def __iter__(self) -> Iterator[str]:
        return (sha.decode() for sha in self._shas)

    def __len__(self) -> int:
        return len(self._shas)


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
