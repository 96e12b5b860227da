"""The curation's Delta tables (names and schemas), its error, and the one shape of a drop row."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from tasks.curation.by_position import ByPosition, SortedRank
from tasks.curation.name_codes import encode
from tasks.curation.sha_list import ShaList, SortedShas, SortedSubset, column_keys
from tasks.data import lake
from tasks.errors import DataError

SPLITS: tuple[str, ...] = ("train", "val", "test")
EMBEDDINGS_TABLE = "curation_embeddings"
COMPONENTS_TABLE = "curation_components"
REPORT_TABLE = "curation_report"

# The curated snapshot holds only what never changes once an image is kept, so a batch appends to it. An image's
# component (whose key a later merge renames) is in the assignment record, at the version the snapshot's commit
# names (``components_version``): joined on sha256 (each image's newest row, ``assignments.read_record``) it gives each
# kept row's component.
CURATED_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("image", pa.binary(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
    ]
)

COMPONENTS_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("component", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("first_raw_version", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),  # the curation that first assigned it
        # The table version the row was written at: an image's newest row is its row (a batch appends the rows it adds
        # or renames; ``assignments.read_record``). A table written before this column holds each image's one row.
        pa.field("written", pa.int64(), nullable=False),
    ]
)

REPORT_SCHEMA = pa.schema(
    [
        pa.field("raw_version", pa.int64(), nullable=False),
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=True),
        pa.field("component", pa.string(), nullable=False),
        pa.field("kept_sha256", pa.string(), nullable=True),
        pa.field("label", pa.string(), nullable=False),
        pa.field("curated_version", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("logical_date", pa.string(), nullable=False),
    ]
)


class CurationError(DataError, RuntimeError):
    """Curation cannot produce a snapshot; the message says which input and why."""


class RawFacts(NamedTuple):
    """One image of the raw version, without its bytes: what the rules read of it (``read_raw``'s columns).

    Built on a lookup in ``RawRows`` (a drop row, a test); the raw version's facts are held as columns.
    """

    sha256: str
    label: str
    width: int
    height: int


class RawRows(ByPosition[RawFacts]):
    """The raw version's facts (``read_raw``'s rows), one image each, in sha256 order, as columns by position.

    Every curation holds them for every image of its raw version from the features to the snapshot's facts. Here each
    image is a position: its label a code into the class names, its width and height int32, and one map from sha256
    to position, which the features' facts, the pixel keys, the record and the nearest summary share (a map and a
    named tuple an image each before: 272 -> 241 bytes an image for the raw facts alone, the sha256 strings
    included; bench/README.md, run 23); the map is a bisection of the sorted sha256s since run 29 (``SortedRank``:
    241 -> about 174 bytes), and the sha256s one byte array since run 30 (``sha_list.SortedShas``: a string is
    made when one is read; 121 -> 72 bytes an image). Still a read-only mapping sha256 -> ``RawFacts``: a lookup
    builds that image's tuple; ``label`` and the columns serve the loops over every image.
    """

    def __init__(self, shas: SortedShas | list[str], codes: np.ndarray, names: list[str], width: np.ndarray,
                 height: np.ndarray) -> None:
        self.shas = shas if isinstance(shas, SortedShas) else SortedShas.of(shas)  # sorted, distinct
        self.at = SortedRank(self.shas)  # by bisection of their prefixes: a dict was 67 bytes an image
        self.codes = np.ascontiguousarray(codes, dtype=np.int32)  # each position's class is names[codes[i]]
        self.label_codes = memoryview(self.codes)  # the same codes, a lookup a Python int (not a copy: 4 bytes an image)
        self.names = names
        self.width, self.height = width, height

    @classmethod
    def of(cls, rows: Iterable[RawFacts]) -> RawRows:
        """From tuples (tests, small sets): one row an image (the greatest tuple of a sha256 given twice)."""
        last = {r.sha256: r for r in sorted(rows)}
        values = list(last.values())
        names = sorted({r.label for r in values})  # every name there already: the codes follow their order
        return cls(list(last), encode([r.label for r in values], names), names,
                   np.array([r.width for r in values], dtype=np.int32), np.array([r.height for r in values], dtype=np.int32))

    def label(self, sha: str) -> str:
        return self.names[self.label_codes[self.at[sha]]]

    def located(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each value's position among these rows, or -1 (int64): one binary search a value, no string made."""
        return self.shas.keys.positions(column)

    def positions_of(self, shas: SortedShas | SortedSubset) -> np.ndarray:
        """Each of ``shas``' position among these rows, or -1: a subset of them is its own positions (a read-only
        view, int32 below 2**31 rows: an int64 copy was 8 bytes an eligible image held to the plan's end), other keys
        a binary search of their bytes (int64; no lookup of a string an image)."""
        if isinstance(shas, SortedSubset) and shas.base is self.shas:
            view = shas.positions.view()
            view.flags.writeable = False
            return view
        return ShaList(shas.bytes_at(slice(None))).located(self.shas.keys)  # a SortedShas' own array: no copy

    def labels_at(self, positions: np.ndarray) -> list[str]:
        """The labels of these positions, in their order (one shared string a class)."""
        return [self.names[c] for c in self.codes[positions].tolist()]

    def sizes(self) -> dict[str, int]:
        """label -> images of the class in the raw version."""
        counts = np.bincount(self.codes, minlength=len(self.names))
        return {name: int(n) for name, n in zip(self.names, counts.tolist()) if n}

    def __getitem__(self, sha: str) -> RawFacts:
        i = self.at[sha]
        return RawFacts(self.shas[i], self.names[self.label_codes[i]], int(self.width[i]), int(self.height[i]))


def raw_facts(raw: pa.Table) -> RawRows:
    """``read_raw``'s rows (a table of them) by sha256, in sha256 order (a sha256 given twice: the greatest row, as
    sorting the tuples would). The sha256s are the sorted column's own bytes (``SortedShas``): no Python string an
    image."""
    return rows_of_blocks([raw])


RAW_COLUMNS = ["sha256", "width", "height", "label"]


def rows_of_blocks(blocks: Iterable[pa.Table]) -> RawRows:
    """The rows of ``blocks`` (``RAW_COLUMNS``) as ``raw_facts`` makes them, a block's keys and codes at a time.

    The keys are sorted alone and gathered once in order (a sort of the whole table by every column, the sorted
    table, its combined column and the distinct rows taken from it were four copies: 393 MB above the read at a
    million images); only a sha256 given twice compares its rows' other columns. A label is a code from the start,
    numbered at the end as the sorted rows first show it (as an encoding of the sorted column would)."""
    keys, label, width, height, names = _raw_columns(blocks)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    del keys
    starts = np.flatnonzero(np.append(True, ordered[1:] != ordered[:-1])) if len(ordered) else order
    chosen = order[starts]
    if len(starts) < len(order):
        _greatest_rows(order, starts, chosen, lambda r: (names[label[r]], int(width[r]), int(height[r])))
        ordered = ordered[starts]
    label = label[chosen]
    first = np.unique(label, return_index=True)[1]
    seen = np.unique(label)[np.argsort(first, kind="stable")]  # the codes in the order the sorted rows show them
    renumber = np.zeros(len(names), dtype=np.int32)
    renumber[seen] = np.arange(len(seen), dtype=np.int32)
    return RawRows(SortedShas(ordered), renumber[label], lake.interned(pa.array([names[c] for c in seen.tolist()],
                                                                                pa.string())),
                   width[chosen], height[chosen])


def _raw_columns(blocks: Iterable[pa.Table]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(keys, label codes into the names, width, height, the names) of every row of ``blocks``, in their order."""
    parts: list[np.ndarray] = []
    codes: list[np.ndarray] = [np.zeros(0, dtype=np.int32)]
    sizes: list[np.ndarray] = [np.zeros((2, 0), dtype=np.int32)]
    names: list[str] = []
    for block in blocks:
        parts.append(column_keys(block.column("sha256")).copy())  # a copy: the block's buffers go with it
        codes.append(encode(block.column("label"), names))
        sizes.append(np.stack([block.column(c).to_numpy().astype(np.int32) for c in ("width", "height")]))
    keys = np.concatenate(parts) if parts else np.zeros(0, dtype="S64")
    del parts
    width, height = np.concatenate(sizes, axis=1)
    return keys, np.concatenate(codes), width, height, names


def _greatest_rows(order: np.ndarray, starts: np.ndarray, chosen: np.ndarray, facts: Any) -> None:
    """For each sha256 given twice (a run of ``order``, the rows sorted by key, from its ``starts``), its greatest
    row by ``facts`` (row -> (label, width, height)) in ``chosen`` (in place)."""
    ends = np.append(starts[1:], len(order))
    for run in np.flatnonzero(ends - starts > 1).tolist():
        rows = order[starts[run]:ends[run]].tolist()
        chosen[run] = max(rows, key=facts)


def drop_row(row: RawFacts, reason: str, component: str, kept: str | None, detail: str | None) -> dict[str, Any]:
    return {"sha256": row.sha256, "reason": reason, "component": component, "kept_sha256": kept,
            "label": row.label, "detail": detail}


def read_raw(uri: str, raw_version: int) -> RawRows:
    """The raw version's facts (sha256, size, label; ``raw_facts``), read ``lake.SEARCH_BLOCK_ROWS`` rows at a time:
    the image bytes stay in the table (``tasks.curation.raw_images`` reads those a step needs), and no table of every
    row's facts is held beside the arrays made of it (at a million images the table read whole was about 150 MB)."""
    rows = rows_of_blocks(lake.scan_blocks(uri, raw_version, RAW_COLUMNS, lake.SEARCH_BLOCK_ROWS))
    if len(rows) == 0:
        raise CurationError(f"{uri} version {raw_version} has no rows: nothing to curate")
    return rows
