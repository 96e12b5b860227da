"""The raw version's facts kept between curations as files, memory-mapped: a batch reads only the rows added since.

Every curation reads every image's facts (sha256, label, size: ``tables.RawRows``). Read from the table each time, a
batch at a million images read and sorted a million rows (+171 MB above what it was given) and held 84 bytes an
image to its end. Here a raw version's rows are stored once, sorted, beside the index (``raw_rows/<table>/v<version>``:
the sha256s as one ``S64`` array, the labels as codes, the widths and heights as int32, each a ``.npy`` file, and the
names), and a later version that only appended files is the stored one with its added rows merged in, a block at a
time. The rows a curation holds are then the files' pages (read-only: the kernel's to drop, as the vector files'),
not the process's memory. Any other change (a rewrite, a compaction, a table made again under the same name) is read
whole again (``tables.read_raw``) and stored.

The stored rows are those ``tables.read_raw`` gives (the same order, codes, names and sizes): a test builds them both
ways. A version is written to a temporary folder and renamed into place whole, so a reader sees all of it or none; two
curations that build one version at once keep the first rename.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tasks.curation.name_codes import encode
from tasks.curation.sha_list import SortedShas, prefixes
from tasks.curation.stored_folder import complete, prune_stale, publish, work_folder
from tasks.curation.tables import RAW_COLUMNS, RawRows, read_raw, rows_of_blocks
from tasks.data import lake

STORE_FOLDER = "raw_rows"
KEEP_VERSIONS = 2  # the newest stored versions kept (the one a batch builds on, and its own)
MERGE_ROWS = 1 << 16  # stored rows copied at a time while a version is merged
_COLUMNS = ("keys", "codes", "width", "height")


class StoredRows(NamedTuple):
    rows: RawRows
    folder: Path  # the version's folder: what is kept beside its rows (the features' facts) goes there


def stored_raw(uri: str, raw_version: int, root: Path) -> StoredRows:
    """The raw version's rows (the raw table ``uri``) as ``tables.read_raw`` reads them, from the files under ``root``
    (built there first: from the newest stored version below, with the rows added since, else from the whole
    table)."""
    own = root / STORE_FOLDER / _table_key(lake.open_table(uri, raw_version).metadata().id) / f"v{raw_version}"
    if not complete(own):
        work = work_folder(own.parent)
        try:
            _build(uri, raw_version, own.parent, work)
            publish(work, own)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _prune(own.parent, own)
    return StoredRows(_mapped(own), own)


def _build(uri: str, version: int, folder: Path, out: Path) -> None:
    """Version ``version``'s files in ``out``: merged from a stored version below it when the table only appended
    files since, else from the whole table."""
    base = _base(folder, version)
    if base is not None:
        blocks = lake.added_blocks(uri, base, version, RAW_COLUMNS, lake.SEARCH_BLOCK_ROWS)
        if blocks is not None:
            _merge(_mapped(folder / f"v{base}"), rows_of_blocks(blocks), out)
            return
    _write_whole(read_raw(uri, version), out)


def other_versions(own: Path) -> list[Path]:
    """The other stored versions of ``own``'s table, newest first."""
    stored = [(int(p.name[1:]), p) for p in own.parent.glob("v*") if p.name[1:].isdigit() and p != own and complete(p)]
    return [p for _, p in sorted(stored, reverse=True)]


def mapped_keys(folder: Path) -> np.ndarray:
    """A stored version's sha256s (``S64``, ascending), its file's read-only mapping."""
    return np.load(folder / "keys.npy", mmap_mode="r")


def _table_key(table_id: str) -> str:
    """A folder name for a Delta table's id (its own text never becomes a path)."""
    return hashlib.sha256(table_id.encode("utf-8")).hexdigest()[:16]


def _base(folder: Path, version: int) -> int | None:
    """The newest complete stored version below ``version``."""
    stored = [int(p.name[1:]) for p in folder.glob("v*") if p.name[1:].isdigit() and complete(p)]
    below = [v for v in stored if v < version]
    return max(below) if below else None


def _mapped(folder: Path) -> RawRows:
    """A stored version's rows, each column its file's read-only mapping (the keys' prefixes too, where they tell
    every key apart)."""
    columns = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _COLUMNS}
    names = json.loads((folder / "names.json").read_text(encoding="utf-8"))
    prefix = np.load(folder / "prefix.npy", mmap_mode="r") if (folder / "prefix.npy").is_file() else None
    return RawRows(SortedShas(columns["keys"], prefix), columns["codes"], names, columns["width"], columns["height"])


def _write_prefix(out: Path, keys: np.ndarray) -> None:
    """The keys' ``sha_list.prefixes``, a block at a time, where they tell every key apart (else no file)."""
    prefix = np.lib.format.open_memmap(out / "prefix.npy.tmp", mode="w+", dtype=np.uint64, shape=(len(keys),))
    distinct, last = True, None
    for start in range(0, len(keys), MERGE_ROWS):
        block = prefixes(np.asarray(keys[start:start + MERGE_ROWS]))
        if block is None or (last is not None and block[0] <= last) or \
                (len(block) > 1 and not bool((block[1:] > block[:-1]).all())):
            distinct = False
            break
        prefix[start:start + len(block)], last = block, block[-1]
    prefix.flush()
    del prefix
    if distinct:
        (out / "prefix.npy.tmp").rename(out / "prefix.npy")
    else:
        (out / "prefix.npy.tmp").unlink()


def _prune(folder: Path, own: Path) -> None:
    """All but ``own`` and the ``KEEP_VERSIONS`` newest stored versions go, and crashed builds' folders (a curation
    that still maps an older one keeps its pages: an open mapping outlives the file's name)."""
    stored = sorted((int(p.name[1:]), p) for p in folder.glob("v*") if p.name[1:].isdigit())
    for _, path in stored[:-KEEP_VERSIONS]:
        if path != own:
            shutil.rmtree(path, ignore_errors=True)
    prune_stale(folder)


def _write_whole(rows: RawRows, out: Path) -> None:
    """``rows`` (read whole) as a stored version's files."""
    arrays = {"keys": rows.shas.array, "codes": rows.codes, "width": rows.width, "height": rows.height}
    for name, values in arrays.items():
        np.save(out / f"{name}.npy", np.ascontiguousarray(values))
    _write_prefix(out, rows.shas.array)
    _write_names(out, rows.names)


def _write_names(out: Path, names: list[str]) -> None:
    (out / "names.json").write_text(json.dumps(list(names)), encoding="utf-8")


def _merge(old: RawRows, fresh: RawRows, out: Path) -> None:
    """``old`` (a stored version) with ``fresh`` (the rows added since, as ``rows_of_blocks`` reads them) merged in, in
    sha256 order, a block of ``old`` at a time: a sha256 in both keeps the greater row (as a whole read would), the
    labels are numbered again as the merged rows first show them.

    Phases: where each fresh row goes, the old rows copied around the new ones, the new rows and the replaced ones
    written, then the codes numbered again."""
    keys = old.shas.array
    place = np.searchsorted(keys, fresh.shas.array)  # a binary search a fresh row in the mapped keys
    at = np.minimum(place, max(len(old) - 1, 0))
    present = (keys[at] == fresh.shas.array) if len(old) else np.zeros(len(fresh), dtype=bool)
    inserted = np.flatnonzero(~present)
    before = place[inserted]  # each new row goes before this old row (ascending)
    names = list(old.names)
    codes = _codes_into(fresh, names)
    columns = _open_columns(out, len(old) + len(inserted))
    for start in range(0, len(old), MERGE_ROWS):
        rows = np.arange(start, min(start + MERGE_ROWS, len(old)))
        dest = rows + np.searchsorted(before, rows, side="right")
        for name, values in (("keys", keys), ("codes", old.codes), ("width", old.width), ("height", old.height)):
            columns[name][dest] = values[rows]
    new_rows = (inserted, before + np.arange(len(inserted)))
    replaced = _greater(old, fresh, names, codes, np.flatnonzero(present), at)
    for source, dest in (new_rows, (replaced, at[replaced] + np.searchsorted(before, at[replaced], side="right"))):
        columns["keys"][dest] = fresh.shas.array[source]
        columns["codes"][dest] = codes[source]
        columns["width"][dest] = fresh.width[source]
        columns["height"][dest] = fresh.height[source]
    names = _renumbered(columns["codes"], names)
    for values in columns.values():
        values.flush()
    _write_prefix(out, columns["keys"])
    _write_names(out, names)


def _codes_into(fresh: RawRows, names: list[str]) -> np.ndarray:
    """The fresh rows' label codes into ``names`` (a name not there yet appended)."""
    remap = encode(fresh.names, names)
    return remap[fresh.codes] if len(fresh) else np.zeros(0, dtype=np.int32)


def _greater(old: RawRows, fresh: RawRows, names: list[str], codes: np.ndarray, both: np.ndarray, at: np.ndarray
             ) -> np.ndarray:
    """The fresh rows (of ``both``: a sha256 stored already, at ``at``) whose row is greater than the stored one's
    (label, width, height: the row a whole read keeps)."""
    def row(label: str, width: int, height: int) -> tuple[str, int, int]:
        return label, int(width), int(height)

    return np.array([i for i in both.tolist()
                     if row(names[codes[i]], fresh.width[i], fresh.height[i])
                     > row(old.names[old.codes[at[i]]], old.width[at[i]], old.height[at[i]])], dtype=np.int64)


def _open_columns(out: Path, rows: int) -> dict[str, np.memmap]:
    kinds = {"keys": np.dtype("S64"), "codes": np.dtype(np.int32), "width": np.dtype(np.int32),
             "height": np.dtype(np.int32)}
    return {name: np.lib.format.open_memmap(out / f"{name}.npy", mode="w+", dtype=kind, shape=(rows,))
            for name, kind in kinds.items()}


def _renumbered(codes: np.memmap, names: list[str]) -> list[str]:
    """The codes numbered as the rows first show their labels (in place, a block at a time); the names in that order
    (a name no row holds any more is gone)."""
    first = np.full(len(names), len(codes), dtype=np.int64)
    for start in range(0, len(codes), MERGE_ROWS):
        seen, where = np.unique(codes[start:start + MERGE_ROWS], return_index=True)
        first[seen] = np.minimum(first[seen], start + where)
    order = [c for c in np.argsort(first, kind="stable").tolist() if first[c] < len(codes)]
    renumber = np.zeros(len(names), dtype=np.int32)
    renumber[order] = np.arange(len(order), dtype=np.int32)
    for start in range(0, len(codes), MERGE_ROWS):
        codes[start:start + MERGE_ROWS] = renumber[codes[start:start + MERGE_ROWS]]
    return [names[c] for c in order]
