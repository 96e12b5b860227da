"""The stored nearest-score summary: each eligible image's nearest copy score, updated by a batch.

The class separation test (``tasks.curation.separation``) needs, for every eligible image, its
highest copy score to another eligible image of its label with other pixels (its "nearest"). Found
by scanning every image's scored partners, that is a cost per table on every batch. So the
``curation_nearest`` table keeps, as its newest row, one row per eligible image of the last curation (sha256,
label, pixel key, nearest score, the partner that gave it), and a curation only applies what can change it:

* images that became eligible get their nearest from their own scored partners (stored or new);
* their pairs, and every pair scored now, raise the nearest of the other image when higher;
* an image whose nearest partner is no longer eligible is recomputed from its own partners.

The maximum over a grown set of pairs is the old maximum or one of the new pairs, so this gives the
same map as the full scan (``full_nearest``), and the same decisions. The summary is used only when
it was written against the current version of ``curation_pairs`` under the same score config (both
in its commit's metadata); otherwise (first run, a crash between the two writes, another writer,
a known image whose label or pixels changed) the map is computed in full and the table rewritten.
A batch appends only the rows that changed, and a row marking each image that left (``eligible`` false), in one
commit: every row carries the table version it was written at (``written``), and the newest row of an image is its
row (``StoredRows``). A MERGE rewrote every file holding a changed row, which a batch's rows, spread over the sha256
order, reach in all (at a million images about 0.2 GB rewritten and 0.55 GB resident in delta-rs, every batch).
The table is written whole after a full scan, when its rows would exceed ``COMPACT_FACTOR`` times the images
eligible now, or when it was written before these two columns. A retry finds the summary already at the pairs'
version with nothing to add, and writes nothing.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.curation.copy_pairs import CopyScores, score_config
from tasks.curation.mapped_arrays import by_position
from tasks.curation.pixel_keys import Digests, PixelKeys, token
from tasks.curation.positions import position_code, position_dtype
from tasks.curation.runs import newest_rows
from tasks.curation.tables import RawRows
from tasks.data import lake

NEAREST_TABLE = "curation_nearest"
WRITE_ROWS = 65_536  # rows built and written at a time when the summary is rewritten
SLICE_ROWS = 16_384  # stored rows read, located and made Python values at a time (a read of WRITE_ROWS rows held
# about 10 MB of their strings, the nearest map's high at 100,000 images: bench/README.md, run 39)
COMPACT_FACTOR = 2  # the table is written whole once its rows (an image's older rows included) pass this x eligible

NEAREST_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("pixel_key", pa.string(), nullable=False),
        pa.field("nearest", pa.float64(), nullable=True),  # None: no scored partner of its label
        pa.field("partner", pa.string(), nullable=True),
        pa.field("written", pa.int64(), nullable=False),  # the table version it was written at: an image's newest wins
        pa.field("eligible", pa.bool_(), nullable=False),  # false: the image left (a marker, no score)
    ]
)
NONE = -1  # no partner
LEGACY = {"written": 0, "eligible": True}  # a table written before these columns: each image's one row


@dataclass
class NearestMap:
    """Every eligible image's nearest score and partner by its position among the raw rows (``tables.RawRows``), and
    what a store must write: the ``changed`` rows, or every row (``full``).

    Arrays, not a map of tuples: reading the summary added 137 bytes a table image to a batch (328 once the pixel keys
    no longer shared their strings with it), then 20 (bench/README.md, run 23), mapped from files in ``scratch`` since
    run 41 (``mapped_arrays``: not the process's own memory). The label and the pixel key of a row are the raw rows'
    and the pixel keys' (``pixel_keys``).
    """

    rows: RawRows
    pixels: PixelKeys
    eligible: bytearray | memoryview  # by position: 1 where the image is eligible now
    score: array | memoryview  # float64 by position: NaN where there is no scored partner of its label
    partner: array | memoryview  # int32 by position (int64 past 2**31 rows): the partner's position, NONE
    changed: set[int]  # positions to write (a batch's); every eligible row when ``full``
    full: bool
    pairs_version: int | None  # the curation_pairs version the stored summary was checked against
    # Updated from the stored summary: the images eligible now and not then, then and not now, and the
    # run that wrote it ({"run_id", "raw_version"}). None after a full scan: the earlier state is unknown.
    added: set[str] | None = None
    gone: set[str] | None = None
    written_by: dict[str, str | None] | None = None
    left: list[tuple[str, str, str]] = field(default_factory=list)  # (sha256, label, pixel key) of each image gone
    stored_rows: int | None = None  # rows in the stored table (older rows of an image included); None: unknown
    scratch: Path | None = None  # where the arrays by position are mapped from (``mapped_arrays``); None: in memory

    @classmethod
    def over(cls, rows: RawRows, pixels: PixelKeys, at: np.ndarray, pairs_version: int | None,
             scratch: Path | None = None) -> NearestMap:
        """No nearest score yet for the eligible images of ``rows`` (``at``: their raw positions); the arrays by
        position mapped from files in ``scratch`` when given."""
        n = len(rows)
        mask = by_position(n, "B", 0, scratch)
        np.frombuffer(mask, dtype=np.uint8)[at] = 1
        return cls(rows, pixels, mask, by_position(n, "d", math.nan, scratch),
                   by_position(n, position_code(n), NONE, scratch), set(), True, pairs_version, scratch=scratch)

    def positions(self) -> np.ndarray:
        """The eligible images' positions, ascending (the rows a full rewrite writes)."""
        return np.flatnonzero(np.frombuffer(self.eligible, dtype=np.uint8))

    def count(self) -> int:
        """How many images are eligible (no array of their positions)."""
        return int(np.count_nonzero(np.frombuffer(self.eligible, dtype=np.uint8)))

    def by_label(self) -> dict[str, np.ndarray]:
        """label -> the nearest scores of its images that have one, in position order (what ``separation`` tests;
        arrays: a list of Python floats was 32 bytes an image of the table). Counted, then filled, ``WRITE_ROWS``
        positions at a time: the scores' own 8 bytes an image, no array of every eligible position, their gathered
        scores and codes (about 33 bytes an image at once, bench/README.md, run 41)."""
        counts = np.zeros(len(self.rows.names), dtype=np.int64)
        for codes, _ in self._scored_blocks():
            counts += np.bincount(codes, minlength=len(counts))
        out = {c: np.empty(int(n), dtype=np.float64) for c, n in enumerate(counts.tolist()) if n}
        filled = dict.fromkeys(out, 0)
        for codes, scores in self._scored_blocks():
            for c in np.unique(codes).tolist():
                part = scores[codes == c]
                out[c][filled[c]:filled[c] + len(part)] = part
                filled[c] += len(part)
        return {self.rows.names[c]: values for c, values in out.items()}

    def _scored_blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(label codes, nearest scores) of the eligible images with a score, ``WRITE_ROWS`` positions at a time."""
        eligible, score = np.frombuffer(self.eligible, dtype=bool), np.frombuffer(self.score, dtype=np.float64)
        for start in range(0, len(eligible), WRITE_ROWS):
            block = score[start:start + WRITE_ROWS]
            keep = eligible[start:start + WRITE_ROWS] & ~np.isnan(block)
            yield self.rows.codes[start:start + WRITE_ROWS][keep], block[keep]

    def row(self, i: int) -> tuple[str, str, float | None, str | None]:
        """(label, pixel key, nearest score, partner) of position ``i``, as the table stores it."""
        sha, score, partner = self.rows.shas[i], self.score[i], self.partner[i]
        return (self.rows.names[self.rows.label_codes[i]], self.pixels[sha], None if math.isnan(score) else score,
                None if partner == NONE else self.rows.shas[partner])


class _Best:
    """Each image's nearest among its scored partners: eligible, of its label, with other pixels."""

    def __init__(self, m: NearestMap, scores: CopyScores) -> None:
        self.m, self.scores = m, scores
        self.at, self.codes, self.eligible = m.rows.at, m.rows.label_codes, m.eligible
        self.before: dict[int, tuple[float, int]] = {}  # each position set, as it was first

    def _counts(self, i: int, pixels: bytes | str, other: str) -> int | None:
        """``other``'s position when the pair (image i, whose pixel token is ``pixels``; other) counts for image i's
        nearest, else None."""
        j = self.at.get(other)
        if j is None or not self.eligible[j] or self.codes[j] != self.codes[i]:
            return None
        return None if self.m.pixels.token(other) == pixels else j

    def _set(self, i: int, score: float, partner: int) -> None:
        self.before.setdefault(i, (self.m.score[i], self.m.partner[i]))
        self.m.score[i], self.m.partner[i] = score, partner

    def find(self, i: int) -> None:
        """Image i's nearest from all its scored partners (the full scan, for one image)."""
        best: tuple[float, str, int] | None = None
        sha = self.m.rows.shas[i]
        pixels = self.m.pixels.token(sha)  # once an image, not once a partner
        for other, v in self.scores.partners(sha).items():
            j = self._counts(i, pixels, other)
            if j is not None and (best is None or v > best[0] or (v == best[0] and other < best[1])):
                best = (v, other, j)
        self._set(i, math.nan, NONE) if best is None else self._set(i, best[0], best[2])

    def raise_to(self, i: int, other: str, v: float) -> None:
        """Image i's nearest raised to the pair (i, other) when the pair counts and is higher."""
        current = self.m.score[i]
        if (math.isnan(current) or v > current) and \
                self._counts(i, self.m.pixels.token(self.m.rows.shas[i]), other) is not None:
            self._set(i, v, self.at[other])

    def changed(self) -> set[int]:
        m = self.m
        return {i for i, (score, partner) in self.before.items()
                if partner != m.partner[i] or not (score == m.score[i] or (math.isnan(score) and math.isnan(m.score[i])))}


def full_nearest(m: NearestMap, scores: CopyScores) -> NearestMap:
    """Every eligible image's nearest from all its scored partners."""
    best = _Best(m, scores)
    scores.want_all()
    for i in m.positions().tolist():
        best.find(i)
    m.changed, m.full = set(), True
    return m


def update_nearest(m: NearestMap, stored: pa.Table | StoredRows, scores: CopyScores) -> tuple[set[str], set[str]] | None:
    """Fill ``m`` from the stored rows, the newly eligible images and the pairs scored now; (added, gone).

    None when a known image's label or pixels changed: the caller computes in full (``m`` is filled only after that
    check). Phases: each image's newest stored row found (and the check), those rows placed, the orphans (nearest
    partner gone) and the added images found from their own partners, then raised by the added images' pairs and the
    pairs scored now.
    """
    newest = _newest(m, stored)
    if newest is None:
        return None
    gone = newest.gone(m)
    m.left = newest.left(m)
    known, orphans = _place(m, stored, newest, gone)
    # Eligible and no stored row placed: a byte an image compared, not a Python int each (40 bytes an image).
    added = np.flatnonzero(np.frombuffer(m.eligible, dtype=bool) & ~np.frombuffer(known, dtype=bool)).tolist()
    best, names = _Best(m, scores), m.rows.shas
    scores.want([*(names[i] for i in orphans), *(names[i] for i in added)])  # their stored partners, in one scan
    for i in orphans + added:  # nearest partners that left, and the new images: from their own partners
        best.find(i)
        scores.forget_partners()  # an image's gathered partners go with it (a batch's were 50-80 MB at a million)
    for i in added:
        for other, v in scores.partners(names[i]).items():
            j = m.rows.at.get(other)
            if j is not None and m.eligible[j]:
                best.raise_to(j, names[i], v)
        scores.forget_partners()
    for a, b, v in scores.fresh.items():
        i, j = m.rows.at.get(a), m.rows.at.get(b)
        if i is not None and j is not None and m.eligible[i] and m.eligible[j]:
            best.raise_to(i, b, v)
            best.raise_to(j, a, v)
    m.changed = best.changed() | set(added)  # an added image's row is new, whatever it holds
    return {names[i] for i in added}, gone


@dataclass(frozen=True)
class StoredRows:
    """The stored summary at one version, read a block at a time for the columns a pass needs (read whole, its
    columns were held through the update: about 0.2 GB of Arrow at a million images); ``rows``: how many rows the
    table holds (older rows of an image included), from its commit, None when its writer did not say."""

    uri: str
    version: int
    rows: int | None = None

    def blocks(self, columns: list[str]) -> Iterator[pa.Table]:
        return lake.scan_blocks_with_defaults(self.uri, self.version, columns, SLICE_ROWS, NEAREST_SCHEMA, LEGACY)


def _with_legacy(part: pa.Table, columns: list[str]) -> pa.Table:
    """``part``'s ``columns``; those a table written before them lacks hold their one value (``LEGACY``)."""
    return lake.with_defaults(part, columns, NEAREST_SCHEMA, LEGACY)


def _pieces(stored: pa.Table | StoredRows, columns: list[str], rows: RawRows, located: tuple[str, ...] = ("sha256",)
            ) -> Iterator[tuple[Any, pa.Table]]:
    """The stored rows' ``columns`` (and the ``located`` ones) ``SLICE_ROWS`` rows at a time, with the raw positions
    of the ``located`` columns' values (-1: a null, or not a raw row; one array, or a tuple of them for several): a
    binary search of the slice's bytes among the raw rows' (a lookup of each string was about 2 us, up to three a
    row; a Python value a row was about 430 bytes a row with the sha256, label and pixel key)."""
    read = columns + [c for c in located if c not in columns]
    parts = stored.blocks(read) if isinstance(stored, StoredRows) else \
        (_with_legacy(stored.slice(start, WRITE_ROWS), read) for start in range(0, stored.num_rows, WRITE_ROWS))
    for part in parts:
        for start in range(0, part.num_rows, SLICE_ROWS):
            piece = part.slice(start, SLICE_ROWS)
            at = tuple(_located(rows, piece.column(c)) for c in located)
            yield (at[0] if len(at) == 1 else at), piece


def _located(rows: RawRows, column: pa.ChunkedArray) -> np.ndarray:
    """Each value's raw position, -1 for a null or a value that is not a raw row."""
    if not column.null_count:
        return rows.located(column)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    out = np.full(len(column), -1, dtype=np.int64)
    out[valid] = rows.located(column.filter(pa.array(valid)))
    return out


@dataclass
class _Newest:
    """Each image's newest stored row (the one that counts), found in one pass over the stored rows."""

    written: array | memoryview  # int32 by position: the version the newest row was written at, -1: no row
    live: bytearray | memoryview  # by position: 1 where the newest row is eligible
    outside: dict[str, tuple[int, bool, str, str]]  # images not in the raw version: (written, eligible, label, key)
    kept_out: dict[int, tuple[str, str]]  # (label, key) of newest eligible rows of images not eligible now

    def gone(self, m: NearestMap) -> set[str]:
        """The images eligible at the last write (their newest row eligible) and not now."""
        return {m.rows.shas[i] for i in self.kept_out} | {s for s, (_, live, _, _) in self.outside.items() if live}

    def left(self, m: NearestMap) -> list[tuple[str, str, str]]:
        """(sha256, label, pixel key) of each image gone: the row that marks it so."""
        return sorted([(m.rows.shas[i], *facts) for i, facts in self.kept_out.items()] +
                      [(s, label, key) for s, (_, live, label, key) in self.outside.items() if live])


def _newest(m: NearestMap, stored: pa.Table | StoredRows) -> _Newest | None:
    """Each image's newest stored row (of two written at once the first); None when the newest row of an image
    eligible now has another label or pixel key than the image has now. A slice of rows at a time as arrays: a
    string is made only for a row of an image that is not a raw row, or eligible then and not now."""
    n = len(m.rows)
    newest = _Newest(by_position(n, "i", -1, m.scratch), by_position(n, "B", 0, m.scratch), {}, {})  # a version: int32
    written, live = np.frombuffer(newest.written, dtype=np.int32), np.frombuffer(newest.live, dtype=np.uint8)
    eligible = np.frombuffer(m.eligible, dtype=bool)  # 0 or 1 a byte: read as bools, no copy
    differs = np.frombuffer(by_position(n, "B", 0, m.scratch), dtype=bool)  # the newest row so far: live, not as now
    for at, piece in _pieces(stored, ["sha256", "label", "pixel_key", "written", "eligible"], m.rows):
        w = piece.column("written").to_numpy().astype(np.int64)
        on = piece.column("eligible").to_numpy(zero_copy_only=False).astype(bool)
        for r in np.flatnonzero(at < 0).tolist():  # images that are not raw rows: their strings
            sha = piece.column("sha256")[r].as_py()
            if w[r] > newest.outside.get(sha, (-1,))[0]:
                newest.outside[sha] = (int(w[r]), bool(on[r]), piece.column("label")[r].as_py(),
                                       piece.column("pixel_key")[r].as_py())
        rows = np.flatnonzero(at >= 0)
        first = rows[newest_rows(at[rows], w[rows], later_wins=False)]  # each image's newest; of a tie the first
        rows = first[w[first] > written[at[first]]]  # ... where it is newer than any row before it
        i = at[rows]
        written[i], live[i] = w[rows], on[rows]
        differs[i] = on[rows] & eligible[i] & _not_as_now(m, i, piece.take(pa.array(rows)))
        if newest.kept_out:  # a newer row of an image marked gone: what it says now counts
            held = np.fromiter(newest.kept_out, dtype=np.int64, count=len(newest.kept_out))
            for j in held[np.isin(held, i)].tolist():
                del newest.kept_out[j]
        out = np.flatnonzero(on[rows] & ~eligible[i])
        for r, j in zip(rows[out].tolist(), i[out].tolist()):  # eligible then, not now: what marks it gone
            newest.kept_out[j] = (piece.column("label")[r].as_py(), piece.column("pixel_key")[r].as_py())
    return None if bool(differs.any()) else newest


def _not_as_now(m: NearestMap, at: np.ndarray, rows: pa.Table) -> np.ndarray:
    """Whether each stored row (of the images at raw positions ``at``) names another label or pixel key than the
    image has now: labels by code, pixel keys by their 32 bytes (an odd key, on either side, as a string)."""
    code = pc.index_in(rows.column("label"), value_set=pa.array(m.rows.names, pa.string()))  # null: no class now
    relabelled = pc.fill_null(code, -1).to_numpy(zero_copy_only=False).astype(np.int64) != m.rows.codes[at]
    digests = Digests.of_column(rows.column("pixel_key"))
    moved = ~digests.present | (digests.packed != m.pixels.packed[at]).any(axis=1)
    odd = set(digests.odd)
    if m.pixels.odd:  # images whose key now is odd (tests' names)
        odd |= set(np.flatnonzero(np.isin(at, [m.rows.at[s] for s in m.pixels.odd])).tolist())
    for k in sorted(odd):
        i = int(at[k])  # an odd key on either side: its token, as a string
        moved[k] = not digests.present[k] or m.pixels.token_at(i, m.rows.shas[i]) != token(digests.value(k) or "")
    other = relabelled | moved
    return other


def _place(m: NearestMap, stored: pa.Table | StoredRows, newest: _Newest, gone: set[str]
           ) -> tuple[bytearray | memoryview, list[int]]:
    """(by position: 1 where a stored row was placed; the placed rows whose nearest partner is ``gone``): each image's
    newest row, where it is eligible then and now. A slice of rows at a time as arrays."""
    known = by_position(len(m.rows), "B", 0, m.scratch)
    placed = np.frombuffer(known, dtype=np.uint8)
    orphans: list[int] = []
    written, live = np.frombuffer(newest.written, dtype=np.int32), np.frombuffer(newest.live, dtype=np.uint8)
    eligible = np.frombuffer(m.eligible, dtype=bool)
    score, partner = np.frombuffer(m.score, dtype=np.float64), np.frombuffer(m.partner, dtype=position_dtype(len(m.rows)))
    gone_at = np.array(sorted(j for j in (m.rows.at.get(s) for s in gone) if j is not None), dtype=np.int64)
    for (at, partner_at), piece in _pieces(stored, ["nearest", "partner", "written"], m.rows, ("sha256", "partner")):
        w = piece.column("written").to_numpy().astype(np.int64)
        ok = at >= 0
        ok[ok] = eligible[at[ok]] & (w[ok] == written[at[ok]]) & (live[at[ok]] == 1)
        rows = np.flatnonzero(ok)
        i = at[rows]
        placed[i] = 1
        score[i] = piece.column("nearest").take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(np.float64)
        partner[i] = np.where(partner_at[rows] < 0, NONE, partner_at[rows])
        hit = np.isin(partner_at[rows], gone_at)
        outside = np.flatnonzero((partner_at[rows] < 0) & piece.column("partner").take(pa.array(rows)).is_valid()
                                 .to_numpy(zero_copy_only=False))
        for k in outside.tolist():  # a partner that is not a raw row: by its string
            hit[k] = piece.column("partner")[int(rows[k])].as_py() in gone
        orphans.extend(i[hit].tolist())
    return known, orphans


def nearest_map(uri: str, pairs_uri: str, rows: RawRows, pixels: PixelKeys, at: np.ndarray,
                scores: CopyScores, scratch: Path | None = None) -> NearestMap:
    """The nearest map of this curation (``at``: the eligible images' raw positions): the stored summary updated when
    it is current, else the full scan; its arrays by position mapped from files in ``scratch`` when given."""
    pairs_version = lake.current_version(pairs_uri)
    m = NearestMap.over(rows, pixels, at, pairs_version, scratch)
    stored = _stored(uri, pairs_version)
    updated = None if stored is None else update_nearest(m, stored[0], scores)
    if stored is None or updated is None:  # ``m`` is as made: a failed check fills nothing
        return full_nearest(m, scores)
    m.added, m.gone = updated
    m.full, m.written_by, m.stored_rows = False, stored[1], stored[0].rows
    return m


def _stored(uri: str, pairs_version: int | None) -> tuple[StoredRows, dict[str, str | None]] | None:
    """(the stored rows, the run that wrote them) when written against ``pairs_version`` under this score config."""
    version = lake.current_version(uri)
    if version is None or pairs_version is None:
        return None
    head = lake.commit_at(uri, version)
    if head is None or head.metadata.get("score_config") != score_config() \
            or head.metadata.get("pairs_version") != str(pairs_version):
        return None
    rows = head.metadata.get("rows_stored")
    return (StoredRows(uri, version, None if rows is None else int(rows)),
            {k: head.metadata.get(k) for k in ("run_id", "raw_version")})


def store_nearest(uri: str, nearest: NearestMap, pairs_version: int | None, metadata: dict) -> None:
    """Append the changed rows and a marker for each image gone (one commit), stamped with the pairs' version; the
    whole summary after a full scan, when the pairs moved on with nothing changed, or to compact (``_appends``)."""
    meta = {**metadata, "step": "curate_nearest", "score_config": score_config(), "pairs_version": str(pairs_version)}
    table = lake.open_table(uri) if lake.exists(uri) else None
    head = lake.commit_at(uri, table.version()) if table is not None else None
    if nearest.full or head is None:
        _overwrite(uri, nearest, meta)
        return
    if not nearest.changed and not nearest.left and head.metadata.get("pairs_version") == str(pairs_version):
        return  # a retry: already stored against these pairs
    if not _appends(nearest):  # nothing changed but the pairs moved on (stamp them), or too many older rows
        _overwrite(uri, nearest, meta)
        return
    written = table.version() + 1  # the version this commit makes: no other commit comes between (refused)
    rows = pa.concat_tables([_table(nearest, sorted(nearest.changed), written),  # positions ascend as the sha256 do
                             _left_table(nearest.left, written)])
    stored = nearest.stored_rows + rows.num_rows
    lake.append_stream(uri, rows.to_reader(WRITE_ROWS), {**meta, "rows_stored": str(stored)}, table)


def _appends(nearest: NearestMap) -> bool:
    """A batch's rows are appended when the stored table says how many rows it holds (written since it has the
    ``written`` and ``eligible`` columns) and they stay within ``COMPACT_FACTOR`` times the images eligible now."""
    added = len(nearest.changed) + len(nearest.left)
    return bool(added) and nearest.stored_rows is not None and \
        nearest.stored_rows + added <= COMPACT_FACTOR * max(nearest.count(), 1)


def _overwrite(uri: str, nearest: NearestMap, meta: dict) -> None:
    """Every eligible row, in sha256 order, written ``WRITE_ROWS`` at a time (at a million images, the table's
    strings built at once were about 0.3 GB beside the plan)."""
    at = nearest.positions().tolist()
    current = lake.current_version(uri)
    written = 0 if current is None else current + 1

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(at), WRITE_ROWS):
            yield from _table(nearest, at[start:start + WRITE_ROWS], written).to_batches()

    lake.overwrite_stream(uri, NEAREST_SCHEMA, batches, {**meta, "rows_stored": str(len(at))})


def _table(nearest: NearestMap, at: list[int], written: int) -> pa.Table:
    picked = [nearest.row(i) for i in at]
    return pa.table({"sha256": [nearest.rows.shas[i] for i in at], "label": [r[0] for r in picked],
                     "pixel_key": [r[1] for r in picked], "nearest": [r[2] for r in picked],
                     "partner": [r[3] for r in picked], "written": [written] * len(at),
                     "eligible": [True] * len(at)}, schema=NEAREST_SCHEMA)


def _left_table(left: list[tuple[str, str, str]], written: int) -> pa.Table:
    """The rows marking images gone: their label and pixel key as stored, no score."""
    return pa.table({"sha256": [s for s, _, _ in left], "label": [label for _, label, _ in left],
                     "pixel_key": [key for _, _, key in left], "nearest": pa.nulls(len(left), pa.float64()),
                     "partner": pa.nulls(len(left), pa.string()), "written": [written] * len(left),
                     "eligible": [False] * len(left)}, schema=NEAREST_SCHEMA)


def read_summary(uri: str, version: int | None = None) -> pa.Table:
    """The summary as a curation reads it: each image's newest row, where the image was eligible, in sha256 order
    (for tests and tools: read whole; a curation reads it a block at a time, ``StoredRows``)."""
    version = lake.current_version(uri) if version is None else version
    rows = _with_legacy(lake.read(uri, version), NEAREST_SCHEMA.names).to_pylist()
    newest = {r["sha256"]: r for r in sorted(rows, key=lambda r: r["written"])}
    schema = pa.schema([NEAREST_SCHEMA.field(name) for name in NEAREST_SCHEMA.names[:5]])
    return pa.Table.from_pylist([r for _, r in sorted(newest.items()) if r["eligible"]], schema=schema)
