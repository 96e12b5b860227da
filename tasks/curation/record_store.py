"""The assignment record of a raw version kept beside its stored rows (``tasks.curation.raw_store``), memory-mapped: a
batch carries a stored record over to its raw version and reads from ``curation_components`` only the rows appended
since.

Every curation reads the whole record (``assignments.Record``: each image's component, split, first raw version, run
and the table version its row was written at, 21 bytes an image by raw position). Read from the table each time, a
batch at a million images read every row of it and held the record as the process's own memory. Here the record as
read at a version of ``curation_components`` is a folder in the raw version's stored folder (``record-<salt and
table>-v<components version>``: each column a ``.npy`` file, the few names and the images recorded outside the raw
version in ``meta.json``), written through its mappings as it is gathered. A batch starts from a stored record when
the components table only appended files since it was read (``lake.appended_files``: the record only appends, and a
rewrite compacts it): the stored columns are carried to their images' places among this raw version's rows, then the
appended rows are added as a whole read adds them (of an image's rows the newest counts). Anything else reads every
row. A table written before the ``written`` column, or under another split salt, is read as before and not stored.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from tasks.curation.assignments import (
    RECORD_COLUMNS,
    Assignment,
    Record,
    RecordSource,
    fill_record,
    record_source,
    whole_record,
)
from tasks.curation.raw_store import mapped_keys, other_versions
from tasks.curation.sha_list import ShaList
from tasks.curation.stored_folder import complete, prune_stale, publish, work_folder
from tasks.curation.tables import COMPONENTS_SCHEMA, RawRows
from tasks.data import lake
from tasks.settings import Settings

RECORD_PREFIX = "record-"
CARRY_ROWS = 1 << 16  # a stored record's rows carried over this many at a time


def open_record(settings: Settings, rows: RawRows, folder: Path) -> tuple[Record, int | None]:
    """``assignments.read_assignments``' record of ``rows`` (a raw version stored in ``folder``) and the version of
    ``curation_components`` it was read at: as stored, else gathered (a stored record carried over with the rows
    appended since, or every row) into files kept once complete.

    Phases: the table's state, the stored record if complete, else gathered and kept, then mapped."""
    source = record_source(settings)
    if not source.usable or source.legacy or source.version is None:
        return whole_record(source, rows, Record(rows)), source.version
    name = _name(settings.curation.split_salt, lake.open_table(source.uri, source.version).metadata().id)
    own = folder / f"{name}-v{source.version}"
    if not complete(own):
        prune_stale(folder)
        work = work_folder(folder)
        try:
            record = _gathered(source, rows, folder, name, work)
            _write_meta(work, record, source.version)
            del record  # its mappings: the files are complete
            publish(work, own)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _prune(folder, own, name)
    return _mapped(own, rows), source.version


def _name(salt: str, table_id: str) -> str:
    """The record folders' name for a split salt and a components table (neither's text becomes a path)."""
    return RECORD_PREFIX + hashlib.sha256(f"{salt}\0{table_id}".encode()).hexdigest()[:16]


def _gathered(source: RecordSource, rows: RawRows, folder: Path, name: str, work: Path) -> Record:
    """The record at ``source.version`` in files in ``work``: a stored one carried over, then the rows the table
    appended since it; else every row."""
    assert source.version is not None
    for base, read_at in _bases(source.version, folder, name):
        blocks = lake.added_blocks(source.uri, read_at, source.version, COMPONENTS_SCHEMA.names,
                                   lake.SEARCH_BLOCK_ROWS)
        if blocks is None:
            continue
        record = _blank(work, rows)
        if _carried(base, rows, record):
            record.stored_rows = int(_meta(base)["stored_rows"]) + fill_record(record, rows, blocks)
            return record
        del record  # its files are made again
    return whole_record(source, rows, _blank(work, rows))


def _bases(version: int, folder: Path, name: str) -> list[tuple[Path, int]]:
    """The stored records of this salt and table read at a version up to ``version``, with that version: this raw
    version's first, then the other stored versions', newest first."""
    found = []
    for version_folder in (folder, *other_versions(folder)):
        stored = [(int(p.name.rsplit("-v", 1)[1]), p) for p in version_folder.glob(f"{name}-v*")
                  if p.name.rsplit("-v", 1)[1].isdigit() and complete(p)]
        found += [(p, v) for v, p in sorted(stored, reverse=True) if v <= version]
    return found


def _blank(work: Path, rows: RawRows) -> Record:
    """An empty record whose columns are files in ``work``, written through their mappings."""
    columns = {c: np.lib.format.open_memmap(work / f"{c}.npy", mode="w+", dtype=kind, shape=(len(rows),))
               for c, kind in RECORD_COLUMNS.items()}
    return Record(rows, columns)


def _carried(base: Path, rows: RawRows, record: Record) -> bool:
    """The stored record in ``base`` (another raw version's, or this one's read at an earlier version) carried into
    ``record`` by sha256, ``CARRY_ROWS`` at a time; False (``record`` is then discarded) where one of its raw rows is
    not one of ``rows`` (the raw table was rewritten: only a whole read tells where each image went).

    Phases: the names and outside keys, each block's places and columns, then the images recorded outside."""
    keys, meta = mapped_keys(base.parent), _meta(base)
    old = {c: np.load(base / f"{c}.npy", mmap_mode="r") for c in RECORD_COLUMNS}
    record.restore_names(meta["splits"], meta["runs"], [])
    outside = np.array([_code_of(record, key) for key in meta["outside"]] or [0], dtype=np.int64)
    for start in range(0, len(keys), CARRY_ROWS):
        dest = ShaList(np.asarray(keys[start:start + CARRY_ROWS])).located(rows.shas.keys)
        if not bool((dest >= 0).all()):
            return False
        part = {c: np.asarray(old[c][start:start + CARRY_ROWS]) for c in RECORD_COLUMNS}
        held = np.flatnonzero(part["split"] != 0)
        code = part["component"][held].astype(np.int64)
        inside = np.flatnonzero(code >= 0)
        code[inside] = ShaList(np.asarray(keys[code[inside]])).located(rows.shas.keys)  # a stored raw row: present
        code[code < 0] = outside[-1 - code[code < 0]]
        record.component[dest[held]] = code
        for c in ("split", "first", "run", "written"):
            getattr(record, c)[dest[held]] = part[c][held]
    record.known = int((record.split != 0).sum())
    for sha, (component, split, first, run_id, written) in meta["others"].items():
        record.add(sha, Assignment(component, split, first, run_id), written)  # a raw row now: into the columns
    return True


def _code_of(record: Record, key: str) -> int:
    """A component key's code in ``record``: its raw position, else its outside code."""
    at = record.rows.shas.index_of(key)
    return record.outside_code(key) if at is None else at


def _write_meta(work: Path, record: Record, version: int) -> None:
    for c in RECORD_COLUMNS:
        getattr(record, c).flush()
    meta = {"outside": record.outside, "splits": record.splits, "runs": record.runs, "known": record.known,
            "stored_rows": record.stored_rows, "version": version,
            "others": {s: [a.component, a.split, a.first_raw_version, a.run_id, record.others_written[s]]
                       for s, a in record.others.items()}}
    (work / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


def _meta(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text(encoding="utf-8"))


def _mapped(folder: Path, rows: RawRows) -> Record:
    """A stored record, each column its file's read-only mapping."""
    meta = _meta(folder)
    record = Record(rows, {c: np.load(folder / f"{c}.npy", mmap_mode="r") for c in RECORD_COLUMNS})
    record.restore_names(meta["splits"], meta["runs"], meta["outside"])
    for sha, (component, split, first, run_id, written) in meta["others"].items():
        record.others[sha] = Assignment(component, split, first, run_id)
        record.others_written[sha] = written
    record.known, record.stored_rows = meta["known"], meta["stored_rows"]
    return record


def _prune(folder: Path, own: Path, name: str) -> None:
    """This raw version's other records of this salt and table go (read at earlier versions: a retry's)."""
    for path in folder.glob(f"{name}-v*"):
        if path != own:
            shutil.rmtree(path, ignore_errors=True)
