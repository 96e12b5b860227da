"""Each image's stored facts (``ImageFeatures``), held as columns and built one image at a time on demand.

A curation reads the facts of every image of the raw version (a million on a batch of a million-image
table). As a dict of named tuples of Python floats and strings they held about 0.5 GB at a million
images, and their conversion from Arrow (a Python object per cell) as much again. ``FactColumns`` holds
them in numpy columns instead: the sha256 and the pixel digest as fixed-width bytes, the statistics as
float64 with a null mask, the error and family as object arrays that share their few distinct strings
(about 0.2 GB at a million). Looking an image up is a binary search of the sorted sha256 column.

It is a read-only ``Mapping`` of sha256 to ``ImageFeatures`` (``tasks.curation.sha_columns``), iterated
in sha256 order, so the rules read it as they read a dict; a value is the same named tuple, with the same
Python types and ``None``s, as the row read into a dict would give.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from tasks.curation.sha_columns import ShaColumns, columns_of


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


class FactColumns(ShaColumns[ImageFeatures]):
    """The ``ImageFeatures`` of a set of images by sha256 (see the module): one row per sha256, sorted."""

    @classmethod
    def from_table(cls, table: pa.Table) -> FactColumns:
        """From ``sha256`` and the ``FACT_COLUMNS`` of ``table`` (a column the table lacks reads as null)."""
        return cls(columns_of(table, floats=_FLOATS, fixed=("pixel_digest",), strings=("error", "family"),
                              names=FACT_COLUMNS))

    @classmethod
    def empty(cls) -> FactColumns:
        return cls.from_table(pa.table({"sha256": pa.array([], pa.string())}))

    def _build(self, i: int) -> ImageFeatures:
        return ImageFeatures(*(self.value(name, i) for name in FACT_COLUMNS))
