"""The assignment record (``curation_components``): stable component keys and splits (rules: ``tasks.curation.curate``).

An image keeps the component and split it got when curation first saw it; new components get
their key (smallest sha256) and ``split_for`` it; new images that would bridge recorded
components of different splits are quarantined.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from tasks.curation.by_position import SortedRank
from tasks.curation.copy_pairs import CopyScores
from tasks.curation.dedupe import RecordedMembers, recorded_original
from tasks.curation.groups import Groups, GroupsBuilder, grouped_by_code
from tasks.curation.mapped_arrays import compress_into, mapped_zeros, take_into
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.runs import newest_rows
from tasks.curation.sha_list import SortedShas, SortedSubset
from tasks.curation.tables import COMPONENTS_SCHEMA, COMPONENTS_TABLE, SPLITS, RawRows, drop_row
from tasks.data import lake
from tasks.settings import Settings

log = logging.getLogger("tasks.curation.curate")  # one logger for the whole curation, as before the split
WRITE_ROWS = 65_536  # rows built and written at a time
COMPACT_FACTOR = 2  # the record is written whole once its rows (an image's older rows included) pass this x its images
LEGACY = {"written": 0}  # a table written before the column: each image's one row
RECORD_COLUMNS = {"component": np.dtype(np.int32), "split": np.dtype(np.int8), "first": np.dtype(np.int64),
                  "run": np.dtype(np.int32), "written": np.dtype(np.int32)}  # ``Record``'s, by raw position

class Assignment(NamedTuple):
    """One row of the assignment record: where an image went when curation first saw it.

    A named tuple, not a frozen dataclass: a record of a million rows is built on every batch (half the seconds).
    """

    component: str
    split: str
    first_raw_version: int
    run_id: str


def split_for(component_key: str, salt: str, ratios: dict[str, float]) -> str:
    """train/val/test from the salted hash of the component key alone: stable across runs."""
    digest = hashlib.sha256(f"{salt}:{component_key}".encode()).hexdigest()
    u = int(digest, 16) / float(1 << 256)  # uniform in [0, 1)
    edge = 0.0
    for name in SPLITS:
        edge += ratios[name]
        if u < edge:
            return name
    return SPLITS[-1]  # float rounding when u is just below 1.0


class Record(Mapping[str, Assignment]):
    """The assignment record read (``curation_components``), held by the raw rows' positions.

    Every curation reads the whole record. As a map of named tuples it took about 118 bytes an image beside the
    sha256 (bench/README.md, run 22). Here an image of the raw version is its position in the raw rows
    (``tables.RawRows``, whose map from sha256 to position it shares): its component as a code (the raw position of
    the image it is named after, or ``-1 - k`` for the ``k``-th key that is not one of the raw rows), a split code, a
    run code, its first raw version and the version its row was written at, 21 bytes. A recorded image that is not
    in the raw version keeps a named tuple in a map of its own. A lookup builds the image's tuple (and its
    component's string).
    """

    def __init__(self, rows: RawRows, columns: Mapping[str, np.ndarray] | None = None) -> None:
        n = len(rows)
        self.rows = rows
        held = columns or {name: np.zeros(n, dtype=kind) for name, kind in RECORD_COLUMNS.items()}
        self.component = held["component"]  # a code (above): no string held an image
        self.outside: list[str] = []  # the component keys that are not raw rows, by their code ``-1 - k``
        self._outside: dict[str, int] = {}
        self.split = held["split"]  # 1 + a code into ``splits``; 0: not recorded
        self.first = held["first"]
        self.run = held["run"]  # a code into ``runs``
        self.splits: list[str] = []
        self.runs: list[str] = []
        self._codes: tuple[dict[str, int], dict[str, int]] = ({}, {})  # split, run id -> its code
        self.written = held["written"]  # the table version each row was written at (its newest counts)
        self.others: dict[str, Assignment] = {}  # recorded images not in the raw version
        self.others_written: dict[str, int] = {}
        self.known = 0  # raw rows recorded
        self.stored_rows: int | None = None  # rows of the table read (older rows included); None: write it whole

    def add(self, sha: str, a: Assignment, written: int = 0) -> None:
        """Record ``a`` for ``sha``, written at table version ``written`` (a sha256 given twice: the newer row, of
        two written at once the later)."""
        i = self.rows.at.get(sha)
        if i is None:
            if written >= self.others_written.get(sha, written):
                self.others[sha], self.others_written[sha] = a, written
            return
        j = self.rows.at.get(a.component)
        self.add_at(i, self.outside_code(a.component) if j is None else j, a.split, a.first_raw_version, a.run_id,
                    written)

    def add_at(self, i: int, component: int, split: str, first: int, run_id: str, written: int) -> None:
        """``add`` for raw position ``i``, its component given as a code."""
        if self.split[i] and written < self.written[i]:
            return
        self.known += not self.split[i]
        self.written[i] = written
        self.component[i], self.first[i] = component, first
        self.split[i] = 1 + _code(self.splits, self._codes[0], split)
        self.run[i] = _code(self.runs, self._codes[1], run_id)

    def add_many(self, at: np.ndarray, component: np.ndarray, split: list[str], first: np.ndarray, run: list[str],
                 written: np.ndarray) -> None:
        """``add_at`` for many rows at once, in their order (raw positions ``at``, component codes as ``add_at``
        takes them, ``split`` and ``run`` a name a row): of an image's rows the newest counts, of two written at once
        the later, as row by row."""
        if not len(at):
            return
        last = newest_rows(at, written, later_wins=True)
        i, w = at[last], written[last]
        take = (self.split[i] == 0) | (w >= self.written[i])
        rows, i = last[take], i[take]
        self.known += int((self.split[i] == 0).sum())
        self.written[i] = w[take]
        self.component[i] = component[rows]
        self.first[i] = first[rows]
        self.split[i] = np.array([1 + _code(self.splits, self._codes[0], split[r]) for r in rows.tolist()],
                                 dtype=np.int8)
        self.run[i] = np.array([_code(self.runs, self._codes[1], run[r]) for r in rows.tolist()], dtype=np.int32)

    def restore_names(self, splits: list[str], runs: list[str], outside: list[str]) -> None:
        """A stored record's split names, run ids and outside keys, with their codes (``tasks.curation.record_store``)."""
        self.splits[:], self.runs[:] = splits, runs
        self._codes = ({n: c for c, n in enumerate(splits)}, {n: c for c, n in enumerate(runs)})
        for key in outside:
            self.outside_code(key)

    def outside_code(self, key: str) -> int:
        """The code of a component key that is not one of the raw rows."""
        k = self._outside.get(key)
        if k is None:
            k = self._outside[key] = len(self.outside)
            self.outside.append(key)
        return -1 - k

    def component_codes(self, positions: np.ndarray, scratch: Path | None = None) -> np.ndarray:
        """Each raw position's recorded component as an integer, -1 where it is not recorded: the raw position of the
        image the component is named after, or past the raw rows for a key that is not one of them (int32 below 2**31
        codes: no int64 copy of every eligible image's). Made a block at a time into a mapping of ``scratch`` where
        one is given (``mapped_arrays``)."""
        n = len(self.split)
        codes = mapped_zeros(len(positions), np.int64 if n + len(self.outside) >= 2**31 else np.int32, scratch)
        for a in range(0, len(positions), WRITE_ROWS):
            at = positions[a:a + WRITE_ROWS]
            part = self.component[at].astype(codes.dtype)
            outside = part < 0
            part[outside] = n - 1 - part[outside]
            part[self.split[at] == 0] = -1
            codes[a:a + WRITE_ROWS] = part
        return codes

    def _name(self, code: int) -> str:
        return self.rows.shas[code] if code >= 0 else self.outside[-1 - code]

    def key_codes(self, keys: SortedShas) -> np.ndarray:
        """Each component key's code as ``component_codes`` gives it, -2 for a key no image is recorded in (found
        among the raw rows by their bytes)."""
        n = len(self.split)
        at = self.rows.positions_of(keys)
        for i in np.flatnonzero(at < 0).tolist():
            k = self._outside.get(keys[i])
            at[i] = -2 if k is None else n + k
        return at

    def name_of_code(self, code: int) -> str:
        """The component key a ``component_codes`` code names."""
        n = len(self.split)
        return self._name(code if code < n else n - 1 - code)

    def members_of(self, keys: Collection[str]) -> list[tuple[str, Assignment]]:
        """(sha256, assignment) of every recorded image whose component is one of ``keys`` (the raw rows found by
        their codes, not a lookup of every image)."""
        wanted = [self.rows.at.get(k) for k in keys]
        wanted = [c for c in wanted if c is not None] + [-1 - self._outside[k] for k in keys if k in self._outside]
        hit = np.flatnonzero(np.isin(self.component, wanted) & (self.split != 0))
        return [(self.rows.shas[i], self._at(i)) for i in hit.tolist()] + \
            [(s, a) for s, a in self.others.items() if a.component in keys]

    def _at(self, i: int) -> Assignment:
        return Assignment(self._name(int(self.component[i])), self.splits[int(self.split[i]) - 1],
                          int(self.first[i]), self.runs[int(self.run[i])])

    def __getitem__(self, sha: str) -> Assignment:
        i = self.rows.at.get(sha)
        if i is not None and self.split[i]:
            return self._at(i)
        return self.others[sha]

    def __contains__(self, sha: object) -> bool:
        i = self.rows.at.get(sha)  # type: ignore[call-overload]
        return bool(self.split[i]) if i is not None else sha in self.others

    def __iter__(self) -> Iterator[str]:
        shas = self.rows.shas
        yield from (shas[i] for i in np.flatnonzero(self.split).tolist())
        yield from self.others

    def __len__(self) -> int:
        return self.known + len(self.others)

    def items(self) -> Iterator[tuple[str, Assignment]]:  # type: ignore[override]
        shas = self.rows.shas
        yield from ((shas[i], self._at(i)) for i in np.flatnonzero(self.split).tolist())
        yield from self.others.items()


def _code(names: list[str], codes: dict[str, int], name: str) -> int:
    """``name``'s place in ``names`` (appended when new: a few splits and run ids)."""
    code = codes.get(name)
    if code is None:
        code = codes[name] = len(names)
        names.append(name)
    return code


class RecordSource(NamedTuple):
    """Where a curation reads its assignment record from: ``curation_components`` at its current ``version`` (None:
    no table yet), ``usable`` when written under this split salt (else a fresh record starts), ``legacy`` when written
    before the ``written`` column (read whole, then written whole once)."""

    uri: str
    version: int | None
    usable: bool
    legacy: bool


def record_source(settings: Settings) -> RecordSource:
    uri = settings.table_uri(COMPONENTS_TABLE)
    version = lake.current_version(uri)
    if version is None:
        return RecordSource(uri, None, False, False)
    head = lake.commit_at(uri, version)
    if head is None or head.metadata.get("split_salt") != settings.curation.split_salt:
        log.warning("curate: %s was written with another split_salt: starting a fresh assignment record", uri)
        return RecordSource(uri, version, False, False)
    return RecordSource(uri, version, True, "written" not in lake.column_names(uri, version))


def read_assignments(settings: Settings, rows: RawRows) -> tuple[Record, int | None]:
    """The newest assignment record for this salt (empty for another salt), and its version: read whole."""
    source = record_source(settings)
    return whole_record(source, rows, Record(rows)), source.version


def whole_record(source: RecordSource, rows: RawRows, record: Record) -> Record:
    """``record`` (empty) filled from every row of ``source`` (none where it is not usable)."""
    if source.usable and source.version is not None:
        stored = fill_record(record, rows, record_blocks(source.uri, source.version))
        record.stored_rows = None if source.legacy else stored  # a table without ``written`` is written whole once
    return record


def fill_record(record: Record, rows: RawRows, blocks: Iterable[pa.Table]) -> int:
    """Stored rows (``blocks``, in the table's order) into ``record``; how many. A slice at a time: read whole, the
    table and a Python list a column (every recorded image's) were held at once beside the record they fill (about
    0.3 GB at a million images)."""
    stored = 0
    for block in blocks:
        for start in range(0, block.num_rows, lake.INTERN_SLICE):  # a slice's Python strings at a time
            part = block.slice(start, lake.INTERN_SLICE)
            _add_slice(record, rows, part)
            stored += part.num_rows
    return stored


def _add_slice(record: Record, rows: RawRows, t: pa.Table) -> None:
    """A slice of stored rows into ``record``: the images and their components found among the raw rows by their
    bytes (no Python string of either), a string made only for an image or key that is not one of them."""
    at, component = rows.located(t.column("sha256")), rows.located(t.column("component"))
    split, run_id = lake.interned(t.column("split")), lake.interned(t.column("run_id"))  # one object a value
    firsts, written = t.column("first_raw_version").to_pylist(), t.column("written").to_pylist()
    outside = np.flatnonzero((at < 0) | (component < 0)).tolist()
    shas = dict(zip(outside, t.column("sha256").take(pa.array(outside, pa.int64())).to_pylist()))
    keys = dict(zip(outside, t.column("component").take(pa.array(outside, pa.int64())).to_pylist()))
    inside = np.flatnonzero(at >= 0)
    codes = component[inside]
    for k in np.flatnonzero(codes < 0).tolist():  # a key that is not one of the raw rows: its code
        codes[k] = record.outside_code(keys[int(inside[k])])
    record.add_many(at[inside], codes, [split[r] for r in inside.tolist()], np.asarray(firsts, dtype=np.int64)[inside],
                    [run_id[r] for r in inside.tolist()], np.asarray(written, dtype=np.int64)[inside])
    for r in np.flatnonzero(at < 0).tolist():  # recorded images that are not in the raw version
        record.add(shas[r], Assignment(keys[r], split[r], int(firsts[r]), run_id[r]), written[r])

def record_blocks(uri: str, version: int) -> Iterator[pa.Table]:
    """The stored rows a block at a time; a table written before the ``written`` column: each image's one row,
    written at 0 (``LEGACY``)."""
    return lake.scan_blocks_with_defaults(uri, version, COMPONENTS_SCHEMA.names, lake.SEARCH_BLOCK_ROWS,
                                          COMPONENTS_SCHEMA, LEGACY)


def read_record(uri: str, version: int) -> pa.Table:
    """The record as a curation reads it: each image's newest row, in sha256 order, without ``written`` (for tests and
    tools, read whole; a curation reads it a block at a time, ``read_assignments``)."""
    newest: dict[str, tuple[int, dict[str, Any]]] = {}
    for t in record_blocks(uri, version):
        for row in t.to_pylist():
            w = row.pop("written")
            if w >= newest.get(row["sha256"], (w,))[0]:
                newest[row["sha256"]] = (w, row)
    schema = pa.schema([f for f in COMPONENTS_SCHEMA if f.name != "written"])
    return pa.Table.from_pylist([newest[s][1] for s in sorted(newest)], schema=schema)


def record_table(assignments: Mapping[str, Assignment], written: int, shas: Sequence[str] | None = None) -> pa.Table:
    """The rows of ``shas`` (every image's when None, sorted), stamped as written at table version ``written``."""
    shas = sorted(assignments) if shas is None else shas
    rows = [assignments[s] for s in shas]
    return pa.table(
        {"sha256": shas, "component": [a.component for a in rows], "split": [a.split for a in rows],
         "first_raw_version": [a.first_raw_version for a in rows], "run_id": [a.run_id for a in rows],
         "written": [written] * len(shas)},
        schema=COMPONENTS_SCHEMA,
    )


def store_record(uri: str, after: RecordAfter, changes: set[str] | None, metadata: dict[str, Any]) -> int | None:
    """Append the rows this curation added or renamed (``changes``) in one commit, each stamped with the version it
    makes; write the record whole when it starts afresh (``changes`` None), when the table read predates the stamp, or
    when its rows would pass ``COMPACT_FACTOR`` times its images. Returns the version written, None for no rows.

    Appended, not MERGEd: a MERGE rewrote every file holding a changed row (a batch's new images, spread over the
    sha256 order, reach all of them: at a million images +312 MB resident and the whole table rewritten, every batch).
    """
    stored = after.record.stored_rows if isinstance(after.record, Record) else None
    if changes is None or stored is None or stored + len(changes) > COMPACT_FACTOR * max(len(after), 1):
        return _overwrite(uri, after, metadata)
    if not changes:
        return None
    shas = sorted(changes)

    def attempt(_: int) -> int | None:
        table = lake.open_table(uri)  # the version this commit makes: another commit first refuses it (re-planned)
        rows = record_table(after, table.version() + 1, shas)
        return lake.append_stream(uri, rows.to_reader(WRITE_ROWS), metadata, table)[0]

    return lake.retry_on_conflict(attempt, f"append to {uri}")


def _overwrite(uri: str, after: Mapping[str, Assignment], metadata: dict[str, Any]) -> int:
    """Every image's row in sha256 order, built ``WRITE_ROWS`` at a time (at a million images the table's columns
    built at once were about 0.2 GB)."""
    shas = sorted(after)
    current = lake.current_version(uri)
    written = 0 if current is None else current + 1

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(shas), WRITE_ROWS):
            yield from record_table(after, written, shas[start:start + WRITE_ROWS]).to_batches()

    return lake.overwrite_stream(uri, COMPONENTS_SCHEMA, batches, metadata)


@dataclass(frozen=True)
class Bridge:
    """A new image set aside because it would join recorded components of different splits."""

    sha: str
    component: str  # the first recorded component it would join
    detail: str  # which recorded components, in which splits
    copy_of: tuple[str, str, str] | None  # (reason, recorded image, how): a copy of one with its label


def bridge_rows(bridges: list[Bridge], by_sha: RawRows, record: dict[str, Assignment],
                abstain: Collection[str]) -> list[dict[str, Any]]:
    """Drop rows of the bridges, named once the classes' tests are known.

    A bridge is set aside whatever its name (no split can take it), so it is outside the class
    guard's budget. Its name says why, and claims a copy only where that claim holds: the same
    pixels in any class (``exact_duplicate``), a copy score at or above the threshold only in a
    class whose copies stand out from its bulk (``near_duplicate``; not in ``abstain``). Anything
    else is a ``split_bridge``, the possible copy named in its detail.
    """
    rows = []
    for b in bridges:
        row = by_sha[b.sha]
        if b.copy_of is None:
            rows.append(drop_row(row, "split_bridge", b.component, None, b.detail))
            continue
        reason, original, how = b.copy_of
        if reason == "near_duplicate" and row.label in abstain:
            rows.append(drop_row(row, "split_bridge", b.component, original,
                                 f"{b.detail}; possibly a copy of the recorded image ({how}), but copies of class "
                                 f"{row.label} do not stand out from its bulk"))
        else:  # a copy needs no split: named as such, never kept across splits
            rows.append(drop_row(row, reason, record[original].component, original,
                                 f"{how} to the recorded image (it also {b.detail})"))
    return rows


class RecordAfter(Mapping[str, Assignment]):
    """The record after a curation: the record read, with the rows this curation added or renamed (``changes``) laid
    over it. Not a copy of the record: that was a second map of every recorded image on every batch."""

    def __init__(self, record: Record | dict[str, Assignment], changes: dict[str, Assignment]) -> None:
        self.record, self.changes = record, changes

    def __getitem__(self, sha: str) -> Assignment:
        got = self.changes.get(sha)
        return self.record[sha] if got is None else got

    def __iter__(self) -> Iterator[str]:
        yield from self.record
        yield from (s for s in self.changes if s not in self.record)

    def __len__(self) -> int:
        return len(self.record) + sum(1 for s in self.changes if s not in self.record)

    def split_codes(self, shas: SortedShas | SortedSubset, at: np.ndarray, scratch: Path | None = None) -> np.ndarray:
        """Each of ``shas``' split as a code into ``SPLITS`` (-1: none; ``at``: their raw positions, -1 for none):
        the record's codes taken by position a block at a time (mapped from ``scratch`` where one is given), this
        curation's rows laid over them (a lookup an image was about 4 us at a million, its component's string made)."""
        out = mapped_zeros(len(at), np.int8, scratch)
        out[:] = -1
        code = {name: k for k, name in enumerate(SPLITS)}
        if isinstance(self.record, Record):
            table = np.array([-1] + [code[name] for name in self.record.splits], dtype=np.int8)
            for start in range(0, len(at), WRITE_ROWS):
                part = at[start:start + WRITE_ROWS]
                found = np.flatnonzero(part >= 0)
                out[start + found] = table[self.record.split[part[found]]]
        else:  # a record given as a map (tests): every image looked up
            for i, sha in enumerate(shas):
                if sha in self.record:
                    out[i] = code[self.record[sha].split]
        for sha, a in self.changes.items():
            if (i := shas.index_of(sha)) is not None:
                out[i] = code[a.split]
        return out

    def changed(self) -> set[str]:
        """The rows that differ from the record read (added, or renamed by a merge)."""
        return {s for s, a in self.changes.items() if self.record.get(s) != a}


def assign(
    roots: np.ndarray, eligible: Sequence[str], record: Record, raw_at: np.ndarray,
    pixels: PixelKeys, by_sha: RawRows, scores: CopyScores, cfg: Any, raw_version: int, run_id: str,
    scratch: Path | None = None,
) -> tuple[RecordAfter, Groups, dict[str, str], int, list[Bridge]]:
    """Keys and splits for this curation's components (the rules in the module doc); ``roots``: each eligible image's
    component, as the position of its first member (``raw_at``: their raw positions, where the record is read by
    code). A component that is one recorded component as it was keeps its key, all such at once (``as_recorded``);
    the others are assigned one at a time, a string made for a component's key and its new members only.

    Returns (the whole record after it, final component key -> eligible members, merged key -> key,
    images assigned now, new images that would bridge splits: named by ``bridge_rows``). ``scratch``: the folder the
    groups' arrays are mapped from (``GroupsBuilder``).
    """
    bridges: list[Bridge] = []
    changes: dict[str, Assignment] = {}  # rows added or renamed now, laid over the record (``RecordAfter``)
    renamed: dict[str, str] = {}
    groups = GroupsBuilder(eligible, scratch)  # final component key -> eligible members
    coded = record.component_codes(raw_at, scratch)  # each eligible image's component code, -1: none
    same = as_recorded(roots, coded, scratch)
    groups.add_many(*grouped_by_code(coded, same, scratch), record.name_of_code)  # mapped: the builder holds them
    split_at = take_into(record.split, raw_at, mapped_zeros(len(raw_at), record.split.dtype, scratch))  # 0: none
    new_images = 0
    context = _Context(SortedRank(eligible), raw_at, record, pixels, by_sha, scores, cfg.copy_similarity, bridges, groups,
                       scratch)
    for positions in components_of(roots, ~same, scratch):  # a component of most of the table is no Python list
        codes = _taken(coded, positions, scratch)
        split_of = _splits(record, codes, _taken(split_at, positions, scratch))
        recorded = sorted(split_of)
        if len(set(split_of.values())) > 1:
            _bridge(positions, codes, recorded, split_of, context)
            continue
        key = recorded[0] if recorded else eligible[int(positions[0])]  # ascending: the first is the smallest
        split = split_of[key] if recorded else split_for(key, cfg.split_salt, dict(cfg.split_ratios))
        for other in recorded[1:]:
            renamed[other] = key
        for p in positions[codes < 0].tolist():
            changes[eligible[p]] = Assignment(key, split, raw_version, run_id)
            new_images += 1
        groups.add(key, positions)
    if renamed:  # a merge relabels every recorded member, also those outside this raw version
        for s, a in [*record.members_of(renamed), *((s, a) for s, a in changes.items() if a.component in renamed)]:
            changes[s] = a._replace(component=renamed[a.component])
    return RecordAfter(record, changes), groups.build(), renamed, new_images, bridges


def as_recorded(roots: np.ndarray, codes: np.ndarray, scratch: Path | None = None) -> np.ndarray:
    """Which images lie in a component (``roots``: each one's) that is one recorded component as it was: every member
    recorded in the same component (``codes``: ``Record.component_codes``), none new. Such a component keeps its key
    and split and changes nothing: it needs no string and no loop. A root is an image's position, so each component's
    lowest and highest code are two arrays by position filled by ``minimum.at`` and ``maximum.at`` (no sort of every
    image: its int64 order and run bounds were about 40 bytes an image). Those two and the answer are mapped from
    ``scratch`` where one is given (``mapped_arrays``)."""
    if not len(roots):
        return np.zeros(0, dtype=bool)
    low = mapped_zeros(len(roots), codes.dtype, scratch)
    low[:] = np.iinfo(codes.dtype).max
    high = mapped_zeros(len(roots), codes.dtype, scratch)
    high[:] = -1
    for a in range(0, len(roots), WRITE_ROWS):  # ``at`` takes its indices as intp: a block's, not every image's
        np.minimum.at(low, roots[a:a + WRITE_ROWS], codes[a:a + WRITE_ROWS])
        np.maximum.at(high, roots[a:a + WRITE_ROWS], codes[a:a + WRITE_ROWS])
    one = mapped_zeros(len(roots), np.uint8, scratch).view(bool)  # each component: one recorded component as it was
    for a in range(0, len(roots), WRITE_ROWS):
        part = low[a:a + WRITE_ROWS]
        one[a:a + WRITE_ROWS] = (part == high[a:a + WRITE_ROWS]) & (part >= 0)
    del low, high
    return take_into(one, roots, mapped_zeros(len(roots), np.uint8, scratch).view(bool))


def _splits(record: Record, codes: np.ndarray, split_at: np.ndarray) -> dict[str, str]:
    """Each recorded component among a component's members (``codes``: theirs, -1 for a new image) -> its split
    (``split_at``: each member's split code; of a component's members, the last one's). Read a block of members at a
    time from the last (a component can be most of the table: a sort of every member's code was about 20 bytes a
    member)."""
    last: dict[int, int] = {}  # code -> the split code of its last member
    for end in range(len(codes), 0, -WRITE_ROWS):
        start = max(0, end - WRITE_ROWS)
        part, split = codes[start:end][::-1], split_at[start:end][::-1]
        recorded = part >= 0
        found, first = np.unique(part[recorded], return_index=True)  # in the block, reversed: its last member
        for code, k in zip(found.tolist(), split[recorded][first].tolist()):
            last.setdefault(code, k)
    return {record.name_of_code(c): record.splits[int(last[c]) - 1] for c in sorted(last)}


def components_of(roots: np.ndarray, among: np.ndarray, scratch: Path | None = None) -> Iterator[np.ndarray]:
    """The components of the images ``among`` (a bool an image), each one's members as ascending positions (an
    array), by their first member: grouped by their roots (``groups.grouped_by_code``, a counting sort a block at a
    time, its arrays mapped from ``scratch`` where one is given). A batch that touches a component of most of the
    table walks most of the table here: an int64 sort of their positions was about 28 bytes an image."""
    _, sizes, members = grouped_by_code(roots, among, scratch)
    done = 0
    for first in range(0, len(sizes), WRITE_ROWS):  # the sizes made Python ints a block at a time
        for size in sizes[first:first + WRITE_ROWS].tolist():
            yield members[done:done + size]
            done += size


def _bridge(positions: np.ndarray, codes: np.ndarray, recorded: list[str], split_of: dict[str, str], at: _Context
            ) -> None:
    """A component whose new images would join recorded components of different splits (``codes``: its members',
    -1 for a new one): each new image is a ``Bridge``, each recorded member stays in its own component (all at
    once, by code: no string a member)."""
    named = ", ".join(f"{k} ({split_of[k]})" for k in recorded[:4])
    more = f" and {len(recorded) - 4} more" if len(recorded) > 4 else ""
    detail = f"would join recorded components {named}{more} in different splits"
    is_known = codes >= 0
    known, newcomers = _compressed(positions, is_known, at.scratch), positions[~is_known]  # ascending, as ``positions``
    members = RecordedMembers(at.rank, known, at.raw_at, at.pixels, newcomers)
    eligible = at.rank.members
    at.bridges.extend(Bridge(s, recorded[0], detail, recorded_original(s, members, at.pixels, at.by_sha, at.scores,
                                                                         at.threshold))
                      for s in (eligible[p] for p in newcomers.tolist()))
    at.scores.forget_partners()  # the bridges' gathered partners (thousands of new images at a million) go now
    del members, known
    # Each recorded component's members together, a key each, by the counting sort (mapped): a sort of the members'
    # codes (an int64 order, a unique's copies) was about 25 MB at a million, where a bridge held 776,218 images.
    found, sizes, index = grouped_by_code(codes, is_known, _scratch_for(len(codes), at.scratch))
    at.groups.add_many(found, sizes, _taken(positions, index, at.scratch), at.record.name_of_code)


MAPPED_FROM = 1 << 16  # a component's arrays are mapped from this many members (fewer: a file each was more cost)


def _scratch_for(members: int, scratch: Path | None) -> Path | None:
    """Where an array of ``members`` entries is mapped: ``scratch`` from ``MAPPED_FROM`` members, else in memory."""
    return scratch if members >= MAPPED_FROM else None


def _taken(values: np.ndarray, at: np.ndarray, scratch: Path | None) -> np.ndarray:
    """``values[at]``, mapped from ``scratch`` for a component of ``MAPPED_FROM`` members or more."""
    return take_into(values, at, mapped_zeros(len(at), values.dtype, _scratch_for(len(at), scratch)))


def _compressed(values: np.ndarray, keep: np.ndarray, scratch: Path | None) -> np.ndarray:
    """``values[keep]`` (a bool each), mapped from ``scratch`` for ``MAPPED_FROM`` kept or more."""
    kept = int(np.count_nonzero(keep))
    return compress_into(keep, values, mapped_zeros(kept, values.dtype, _scratch_for(kept, scratch)))


class _Context(NamedTuple):
    """What a bridge's assignment reads and adds to (``_bridge``)."""

    rank: SortedRank  # the eligible images -> their positions
    raw_at: np.ndarray
    record: Record
    pixels: PixelKeys
    by_sha: RawRows
    scores: CopyScores
    threshold: float
    bridges: list[Bridge]
    groups: GroupsBuilder
    scratch: Path | None  # the folder a bridge's arrays are mapped from (``mapped_arrays``)
