"""What a curation keeps: the curated snapshot's rows without their image bytes, by position, built a block at a time.

A curation keeps most of its raw version's images. As one Arrow table of every kept row (sha256, label, split, width,
height) the kept facts were about 86 bytes an image, built at the end of the plan and held through the writes (at a
million images the high of a 1% batch, bench/README.md run 28), and counting them by split and label made two Python
strings a row. Here a kept image is its position among the eligible images (whose sha256 byte array the plan holds,
``sha_list.Keys``) and among the raw rows (its label and size), and a split code: 9 bytes an image. Rows are made as
Arrow a block at a time: the snapshot's writer's, the rows a batch appends, the kept rows a batch compares with the
stored ones.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.curation.mapped_arrays import mapped_zeros
from tasks.curation.sha_list import Keys, SortedSubset
from tasks.curation.tables import CURATED_SCHEMA, SPLITS, RawFacts, RawRows

KEPT_FACTS_SCHEMA = CURATED_SCHEMA.remove(CURATED_SCHEMA.get_field_index("image"))


class KeptFacts:
    """The kept images (sha256 order), each its eligible position (``kept``, into ``keys``), raw position (``raw``,
    into ``rows``) and split (a code into ``SPLITS``)."""

    def __init__(self, keys: Keys, kept: np.ndarray, raw: np.ndarray, rows: RawRows, split: np.ndarray) -> None:
        if keys.order is not None:
            raise ValueError("KeptFacts: the eligible images' keys must be sorted")
        self.keys, self.kept, self.raw, self.rows, self.split = keys, kept, raw, rows, split

    @classmethod
    def of(cls, keys: Keys, raw: np.ndarray, dropped: Collection[str], rows: RawRows, split: np.ndarray,
           scratch: Path | None = None) -> KeptFacts:
        """Every eligible image (``keys``: their sorted byte array; ``raw``: each one's raw position, ``split``: its
        split's code into ``SPLITS``) that is not ``dropped``: arrays taken by position a block at a time, no string
        made an image; mapped from ``scratch`` where one is given (``mapped_arrays``: held through the writes)."""
        keep = mapped_zeros(len(keys), np.uint8, scratch).view(bool)
        keep[:] = True
        if dropped:
            at = keys.positions(pa.array(sorted(dropped), pa.string()))
            keep[at[at >= 0]] = False  # a dropped image that was not eligible (a bad image) is not among them
        count = int(np.count_nonzero(keep))  # int32 positions: a table of 2**31 images is not held here
        kept, kept_raw = mapped_zeros(count, np.int32, scratch), mapped_zeros(count, np.int32, scratch)
        kept_split = mapped_zeros(count, np.int8, scratch)
        done = 0
        for start in range(0, len(keys), BLOCK_ROWS):
            at = np.flatnonzero(keep[start:start + BLOCK_ROWS]) + start
            part = slice(done, done + len(at))
            kept[part], kept_raw[part], kept_split[part] = at, raw[at], split[at]
            if bool((kept_split[part] < 0).any()) or bool((kept_raw[part] < 0).any()):
                raise ValueError("KeptFacts: a kept image has no split or no raw row")
            done += len(at)
        return cls(keys, kept, kept_raw, rows, kept_split)

    @classmethod
    def of_table(cls, table: pa.Table) -> KeptFacts:
        """From rows of ``KEPT_FACTS_SCHEMA`` (tests, tools): every row kept."""
        shas = table.column("sha256").to_pylist()
        if any(a >= b for a, b in zip(shas, shas[1:])):
            raise ValueError("KeptFacts: the rows must be in sha256 order, each once")
        rows = RawRows.of(RawFacts(s, label, w, h) for s, label, w, h in zip(
            shas, *(table.column(c).to_pylist() for c in ("label", "width", "height"))))
        code = {name: k for k, name in enumerate(SPLITS)}
        split = np.array([code[s] for s in table.column("split").to_pylist()], dtype=np.int8)
        every = np.arange(len(shas), dtype=np.int32)
        return cls(Keys.of(shas), every, every, rows, split)

    @property
    def num_rows(self) -> int:
        return len(self.kept)

    def table(self, at: np.ndarray | slice | None = None) -> pa.Table:
        """The kept rows ``at`` (indices among the kept, or a slice; None: every one) as ``KEPT_FACTS_SCHEMA``."""
        kept, raw, split = (self.kept, self.raw, self.split) if at is None else \
            (self.kept[at], self.raw[at], self.split[at])
        labels = pa.array(self.rows.names, pa.string()).take(pa.array(self.rows.codes[raw]))
        columns = [_strings(self.keys.at(kept)), labels, pa.array(SPLITS, pa.string()).take(pa.array(split)),
                   pa.array(self.rows.width[raw], pa.int32()), pa.array(self.rows.height[raw], pa.int32())]
        return pa.Table.from_arrays(columns, schema=KEPT_FACTS_SCHEMA)

    def blocks(self, rows: int) -> Iterator[pa.Table]:
        for start in range(0, self.num_rows, rows):
            yield self.table(slice(start, start + rows))

    def shas(self) -> SortedSubset:
        """The kept images' sha256s, read as strings from the raw rows' bytes (no string held an image)."""
        return self.rows.shas.take(self.raw)

    def sha_column(self) -> pa.Array:
        return _strings(self.keys.at(self.kept)).combine_chunks()

    def find(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each sha256 of ``column``'s index among the kept images, -1 where it is not kept (int64)."""
        at = self.keys.positions(column).astype(self.kept.dtype)  # the needles in the kept's own dtype: no cast of it
        i = np.minimum(np.searchsorted(self.kept, at), max(len(self.kept) - 1, 0))
        found = (at >= 0) & (self.kept[i] == at) if len(self.kept) else np.zeros(len(at), dtype=bool)
        return np.where(found, i, -1).astype(np.int64)

    def subset(self, mask: np.ndarray) -> KeptFacts:
        """The kept images where ``mask`` is True."""
        return KeptFacts(self.keys, self.kept[mask], self.raw[mask], self.rows, self.split[mask])

    def counts(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """(kept images by split, by split and label): as ``report.count_by_split`` counts a table (a block of kept
        images at a time: no int64 code of every one)."""
        names = self.rows.names
        by = np.zeros(len(SPLITS) * len(names), dtype=np.int64)
        for start in range(0, self.num_rows, BLOCK_ROWS):
            split, raw = self.split[start:start + BLOCK_ROWS], self.raw[start:start + BLOCK_ROWS]
            by += np.bincount(split.astype(np.int64) * len(names) + self.rows.codes[raw], minlength=len(by))
        by = by.reshape(len(SPLITS), len(names))
        by_split = {s: int(by[k].sum()) for k, s in enumerate(SPLITS)}
        by_label = {s: dict(sorted((names[c], int(n)) for c, n in enumerate(by[k].tolist()) if n))
                    for k, s in enumerate(SPLITS)}
        return by_split, by_label


BLOCK_ROWS = 1 << 16  # kept images taken or counted at a time
STRING_ROWS = 1 << 24  # sha256s an Arrow chunk: its int32 offsets reach 64 x this


def _strings(keys: np.ndarray) -> pa.ChunkedArray:
    """A byte array of keys as an Arrow string column: sha256s (64 characters each) are seen as their own bytes, no
    Python string a value."""
    if keys.dtype.itemsize != 64 or not len(keys) or int(np.char.str_len(keys).min()) != 64:
        return pa.chunked_array([pa.array([k.decode("ascii") for k in keys.tolist()], pa.string())], pa.string())
    chunks = []
    for start in range(0, len(keys), STRING_ROWS):
        part = np.ascontiguousarray(keys[start:start + STRING_ROWS])
        offsets = np.arange(0, 64 * (len(part) + 1), 64, dtype=np.int32)
        chunks.append(pa.StringArray.from_buffers(len(part), pa.py_buffer(offsets), pa.py_buffer(part)))
    return pa.chunked_array(chunks, pa.string())
