"""Delta Lake access through delta-rs (the embedded engine).

Every commit the pipeline makes carries custom metadata (``cd4ml.*`` keys: run id, logical
date, input versions, config hash). That metadata is how a later step finds "the version a
given logical date produced" without ever reading "latest", and how a re-run recognises work
it already committed.

Dataset versions: every commit is a Delta version. A version can also carry a name
(``2026-11-21``, ``release-3``), kept in the ``dataset_tags`` Delta table that sits beside the
tables it names (``<lake>/dataset_tags``: table, name, version, tagged_at, run_id, note).
A name is immutable: tagging it again to the same version is a no-op, to another version a
``TagConflictError``; concurrent taggers are serialised by Delta's commit protocol (MERGE,
retried on conflict), so two of them can never both win. ``resolve_version(uri, ref)`` turns
what a person types into a version number, in this order:

1. an ``int`` or a string of digits: that version number (it must exist);
2. a tag name on that table (so a tag called ``2026-11-21`` wins over the date);
3. a timestamp with a time part (``2026-11-21T18:00:00Z``, a ``datetime``; naive = UTC): the
   version that was current then (delta-rs ``load_as_version``); before the first commit is an
   error. A bare date that is not a tag is an error rather than a guess at midnight.

Writes that must stay flat in memory and atomic go through ``append_stream``: pyarrow writes
the Parquet files as the stream arrives, then one transaction commits them against the
snapshot the caller planned with (refused, and cleaned up, if anyone committed since; the
caller re-plans via ``retry_on_conflict``). ``upsert_batches`` does the same for bookkeeping
tables, MERGEing only rows whose key already exists.

``resolve_dataset_version`` is the training-side entry: the same refs on the curated table,
plus a raw-table tag name, which maps to the newest curated version built from that raw
version (its commit metadata names ``raw_version``).
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from tasks.errors import DataError

log = logging.getLogger(__name__)

META_PREFIX = "cd4ml."
TAGS_TABLE = "dataset_tags"
# Rows a set lookup checks at once (``scan_blocks``' callers): each call hashes its whole value set again, 0.43 s
# against a million strings; 262,144 rows of keys are about 40-60 MB.
LOOKUP_BLOCK_ROWS = 1 << 18
# Rows read at a time where each row is found by a binary search (``sha_list.Keys``), not a set lookup: no fixed cost
# a block, so a small block costs no more, and a block of the record's or the features' rows at LOOKUP_BLOCK_ROWS
# held 50-70 MB while it was read.
SEARCH_BLOCK_ROWS = 1 << 16
_T = TypeVar("_T")


class VersionNotFoundError(DataError, LookupError):
    """No table version satisfies the request; the message says what was asked."""


class TagConflictError(DataError, ValueError):
    """A version name is already taken by another version of the same table (names are immutable)."""


class ConcurrentCreateError(RuntimeError):
    """Another writer created the table while this one was creating it: re-plan and merge instead."""


@dataclass(frozen=True)
class Commit:
    version: int
    operation: str
    timestamp_ms: int
    metadata: dict[str, str]


def exists(uri: str) -> bool:
    try:
        DeltaTable(uri, without_files=True)
        return True
    except TableNotFoundError:
        return False


def current_version(uri: str) -> int | None:
    """The table's newest version, or None when there is no table (for status and lookups)."""
    try:
        return DeltaTable(uri, without_files=True).version()
    except TableNotFoundError:
        return None


def open_table(uri: str, version: int | None = None) -> DeltaTable:
    try:
        return DeltaTable(uri, version=version)
    except TableNotFoundError as exc:
        raise VersionNotFoundError(f"no Delta table at {uri}") from exc
    except Exception as exc:  # delta-rs raises a generic error for a missing version
        if version is not None and "version" in str(exc).lower():
            raise VersionNotFoundError(f"{uri} has no version {version}: {exc}") from exc
        raise


def scan(table: DeltaTable, columns: Iterable[str] | None = None, filters: Any = None) -> pa.Table:
    """``table.to_pyarrow_table`` through pyarrow's own filesystem where the table is local.

    delta-rs hands pyarrow a filesystem implemented in Python by default; a process that scanned
    through it and then exits dies in arrow's thread-pool teardown about half the time ("terminate
    called without an active exception", SIGABRT, measured with deltalake 1.6.6 and pyarrow 25), so
    a CLI command printed its answer and still failed. pyarrow's native local filesystem avoids it.
    """
    cols = list(columns) if columns is not None else None
    return table.to_pyarrow_table(columns=cols, filters=filters, filesystem=_native_filesystem(table))


def _is_local(table: DeltaTable) -> bool:
    """Whether the table is on local disk (a path or a ``file:`` URI), not on an object store."""
    from urllib.parse import urlparse

    return urlparse(table.table_uri).scheme in ("", "file")


def _native_filesystem(table: DeltaTable) -> Any:
    """pyarrow's own local filesystem rooted at a local table (None elsewhere): see ``scan``."""
    from urllib.parse import unquote, urlparse

    from pyarrow import fs as pafs

    if not _is_local(table):
        return None
    return pafs.SubTreeFileSystem(unquote(urlparse(table.table_uri).path).rstrip("/") or "/", pafs.LocalFileSystem())


def _plain_local_files(table: DeltaTable) -> list[str] | None:
    """The version's data files as local paths when plain Parquet reads give its rows (``_plain_files``) and they are
    on local disk, else None."""
    return _plain_files(table) if _is_local(table) else None


def _plain_files(table: DeltaTable) -> list[str] | None:
    """The version's data files (local paths, or an object store's URIs) when plain Parquet reads give its rows, else
    None. Plain means: not partitioned (partition values live in the log), no deletion vectors and no column mapping
    (both change what a file's rows and names mean)."""
    from urllib.parse import unquote, urlparse

    protocol, meta = table.protocol(), table.metadata()
    features = set(protocol.reader_features or [])
    if meta.partition_columns or features & {"deletionVectors", "columnMapping"}:
        return None
    if meta.configuration.get("delta.columnMapping.mode", "none") != "none":
        return None
    return [unquote(urlparse(u).path) if u.startswith("file:") else u for u in table.file_uris()]


def _file_opener(table: DeltaTable) -> Callable[[str], Any]:
    """How a data file of ``table`` (as ``_plain_files`` names it) is opened as a ``ParquetFile``: a local path
    directly (``_parquet_file``), an object store's URI through the table's own filesystem (its credentials: the
    deployment's environment, as every read of the lake)."""
    if _is_local(table):
        return _parquet_file
    import pyarrow.parquet as pq

    filesystem, root = table.to_pyarrow_dataset().filesystem, table.table_uri.rstrip("/") + "/"

    def remote(uri: str) -> Any:
        path = uri[len(root):] if uri.startswith(root) else uri
        return pq.ParquetFile(filesystem.open_input_file(path), buffer_size=PAGE_BUFFER, pre_buffer=False)

    return remote


def scan_batches(
    uri: str, version: int, columns: Iterable[str], where: dict[str, list[Any]] | None = None, batch_rows: int = 256
) -> Iterator[pa.RecordBatch]:
    """Stream one explicit version's rows in record batches: memory bounded by a row group, not the table.

    ``where`` keeps rows whose column holds one of the values (``{"split": ["train", "val"]}``). Plain local
    tables are read file by file with Parquet's own batch reader (delta-rs's pyarrow dataset
    measured 490 MB resident after 15,000 of 100,000 images, growing with the table; file by file
    it stays at a row group); anything else goes through the dataset.
    """
    try:
        yield from _scanned(uri, version, list(columns), dict(where or {}), batch_rows)
    finally:
        # An allocator keeps what a scan freed for reuse (mimalloc, Arrow's own default: 212 MB resident with nothing
        # allocated after reading 100,000 features). Given back when the scan ends or is abandoned: the system pool
        # (``tasks/__init__.py``) trims the C heap here, mimalloc collects what it can.
        pa.default_memory_pool().release_unused()


PAGE_BUFFER = 1 << 20  # bytes a column's pages are read through (``_parquet_file``)


def _parquet_file(path: str) -> Any:
    """A local Parquet file read a column's pages at a time through a ``PAGE_BUFFER`` (a row group's column chunks are
    not loaded whole first, nor pre-buffered: a feature table's row group is a quarter of a million rows, its sha256
    and pixel digest chunks 16 MB each, held beside the batches decoded from them)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, buffer_size=PAGE_BUFFER, pre_buffer=False)


def _scanned(uri: str, version: int, cols: list[str], where: dict[str, list[Any]], batch_rows: int
             ) -> Iterator[pa.RecordBatch]:

    expression = None
    for name, values in where.items():
        term = pc.field(name).isin(list(values))
        expression = term if expression is None else expression & term
    table = open_table(uri, version)
    files = _plain_local_files(table)
    if files is None:
        dataset = table.to_pyarrow_dataset(filesystem=_native_filesystem(table))
        yield from dataset.to_batches(columns=cols, filter=expression, batch_size=batch_rows,
                                      batch_readahead=2, fragment_readahead=1)
        return
    schema = pa.schema(table.schema().to_arrow())  # arro3 -> pyarrow through the C data interface
    needed = cols + [c for c in where if c not in cols]
    for path in files:
        for batch in _file_batches(_parquet_file(path), needed, schema, batch_rows):
            if expression is not None:
                batch = batch.filter(expression)
            if batch.num_rows:
                yield batch.select(cols)


def _file_batches(parquet: Any, columns: list[str], schema: pa.Schema, batch_rows: int,
                  row_groups: list[int] | None = None, threads: bool = True) -> Iterator[pa.RecordBatch]:
    """An opened data file's ``columns`` (of ``row_groups``, default all), ``batch_rows`` at a time (``threads``:
    decoded on Arrow's threads); a column added after the file was written reads as null (``_with_nulls``)."""
    present = [c for c in columns if c in parquet.schema_arrow.names]
    for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=row_groups, columns=present,
                                      use_threads=threads):
        yield _with_nulls(batch, columns, schema)


def _with_nulls(batch: pa.RecordBatch, names: list[str], schema: pa.Schema) -> pa.RecordBatch:
    """``batch``'s columns ``names``: a column added after its file was written reads as null."""
    present = batch.schema.names
    return pa.RecordBatch.from_arrays(
        [batch.column(c) if c in present else pa.nulls(batch.num_rows, schema.field(c).type) for c in names],
        names=names)


def scan_blocks(uri: str, version: int, columns: Iterable[str], block_rows: int, block_bytes: int | None = None
                ) -> Iterator[pa.Table]:
    """``scan_batches`` regrouped into tables of at least ``block_rows`` rows (the last may hold fewer), or, with
    ``block_bytes``, of about that many bytes once they reach it first (read ``READ_ROWS`` at a time).

    For per-block work whose fixed cost is high: an Arrow set lookup hashes its whole value set on every
    call (measured: 0.43 s per call against a million strings, whatever the block's length), while a
    table's files and row groups yield batches of a few thousand rows. Memory is one block: bounded by
    ``block_bytes`` where a row's size is not (encoded images: 1 KB a 32x32 PNG, 100 KB a photo).
    """
    read_rows = min(block_rows, 1 << 16) if block_bytes is None else min(block_rows, READ_ROWS)
    batches = (_plain_strings(b) for b in scan_batches(uri, version, columns, batch_rows=read_rows))
    yield from _regrouped(batches, block_rows, sys.maxsize if block_bytes is None else block_bytes)


def appended_files(uri: str, since: int, version: int) -> list[str] | None:
    """The files ``version`` added to ``since`` (local paths or an object store's URIs, in the table's order) when
    ``version`` is ``since`` with files appended: the same table (its id), plain files (``_plain_files``) and every
    file of ``since`` still there. None otherwise (a rewrite, a compaction, a deletion or another table under the same
    name: only a whole read tells what the version holds)."""
    if since > version:
        return None
    old, new = open_table(uri, since), open_table(uri, version)
    if old.metadata().id != new.metadata().id:
        return None
    before, after = _plain_files(old), _plain_files(new)
    if before is None or after is None or not set(before) <= set(after):
        return None
    kept = set(before)
    return [path for path in after if path not in kept]


def added_blocks(uri: str, since: int, version: int, columns: list[str], block_rows: int
                 ) -> Iterator[pa.Table] | None:
    """The rows ``version`` added to ``since`` (``columns``, ``block_rows`` at a time, in the table's order), or None
    where it did more than append files (``appended_files``)."""
    added = appended_files(uri, since, version)
    if added is None:
        return None
    table = open_table(uri, version)
    schema, opened = pa.schema(table.schema().to_arrow()), _file_opener(table)

    def batches() -> Iterator[pa.RecordBatch]:
        for path in added:
            for batch in _file_batches(opened(path), columns, schema, min(block_rows, 1 << 16)):
                yield _plain_strings(batch)

    return _regrouped(batches(), block_rows, sys.maxsize)


def column_names(uri: str, version: int) -> list[str]:
    """The columns of the table at ``version`` (a version written before a column was added lacks it)."""
    return pa.schema(open_table(uri, version).schema().to_arrow()).names


def with_defaults(part: pa.Table, columns: list[str], schema: pa.Schema, defaults: dict[str, Any]) -> pa.Table:
    """``part``'s ``columns``; each it lacks (its table was written before the column) holds its one value from
    ``defaults``, typed as in ``schema``."""
    for name in (c for c in columns if c not in part.column_names):
        part = part.append_column(name, pa.array([defaults[name]] * part.num_rows, schema.field(name).type))
    return part.select(columns)


def scan_blocks_with_defaults(uri: str, version: int, columns: list[str], block_rows: int, schema: pa.Schema,
                              defaults: dict[str, Any]) -> Iterator[pa.Table]:
    """``scan_blocks`` of ``columns``; those the table at ``version`` lacks hold their ``defaults`` (``with_defaults``)."""
    present = set(column_names(uri, version))
    for block in scan_blocks(uri, version, [c for c in columns if c in present], block_rows):
        yield with_defaults(block, columns, schema, defaults)


def scan_keyed(uri: str, version: int, key: str, values: pa.Array, columns: list[str], block_rows: int,
               block_bytes: int, position: str | None = None) -> Iterator[pa.Table]:
    """The rows of one version whose ``key`` is one of ``values``, in the table's order, in tables of at most
    about ``block_rows`` rows or ``block_bytes`` bytes, whichever comes first (``READ_ROWS`` are read at a time);
    with ``position``, a column of that name gives each row's key's index in ``values`` (int32).

    Two passes. The key column alone, a block at a time (``_marks``), finds the wanted rows; then only those rows are
    kept from the other columns, and on a plain local table only the row groups holding one are read. Why: filtered
    block by block, a scan held a block of every column for each lookup, a quarter of a million images (0.25 GB of
    32x32 PNGs, tens of GB of photos) to keep a few hundred, and read every row group for a batch's own images.
    """
    marks = _marks(uri, version, key, values) if len(values) else None
    if marks is None or not len(marks.rows):
        return
    table = open_table(uri, version)
    files = _plain_local_files(table)
    read_rows = min(block_rows, READ_ROWS)
    rows = _marked_row_groups(files, columns, pa.schema(table.schema().to_arrow()), marks, read_rows, position) \
        if files is not None else _marked_batches(scan_batches(uri, version, columns, batch_rows=read_rows), marks,
                                                  position)
    try:
        yield from _regrouped(_coalesced(rows, KEPT_BATCHES, KEPT_BYTES), block_rows, block_bytes)
    finally:
        pa.default_memory_pool().release_unused()  # as ``scan_batches``: what the reads freed is handed back


def _coalesced(batches: Iterable[pa.RecordBatch], count: int, size: int) -> Iterator[pa.RecordBatch]:
    """``batches`` joined into one batch (its columns contiguous) each ``count`` of them or ``size`` bytes, whichever
    comes first (a binary column's offsets stay far from 2 GB whatever an image weighs), the last fewer.

    Why: a keyed scan keeps a few rows of each batch it reads. Kept as they came, each was small buffers and objects
    of its own among the reads' freed ones: at a million images a batch's 11,774 images (11 MB) came in 7,813 pieces,
    about 20 MB more in use and 80 MB the heap kept free beneath them; joined 256 at a time, 31 pieces and 11 MB."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += batch.nbytes
        if len(pending) >= count or held >= size:
            yield from _joined(pending)
            pending, held = [], 0
    if pending:
        yield from _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``batches`` (at least one, one schema) as one batch, or themselves when there is one."""
    return batches if len(batches) == 1 else [pa.concat_batches(batches)]


KEPT_BATCHES, KEPT_BYTES = 256, 16 << 20  # a keyed scan's kept rows joined into one batch at most (``_coalesced``)
READ_ROWS = 128  # rows read at a time where rows may be images: 15 MB of 120 KB photos
KEYED_ROWS, KEYED_BYTES = 1 << 16, 64 << 20  # ``rows_for_keys``' blocks: a batch's rows, whatever their size


def rows_for_keys(uri: str, version: int, key: str, wanted: pa.Array | pa.ChunkedArray, columns: list[str]
                  ) -> pa.Table:
    """``columns`` of the row holding each of ``wanted`` in ``wanted``'s order (a null, or a key the table lacks: a
    row of nulls; of two rows with one key, the first in the table's order), read by key (``scan_keyed``): the key
    column a block at a time and only the rows asked for, never the whole table (a batch's few thousand keys against
    a table of millions)."""
    wanted = wanted.combine_chunks() if isinstance(wanted, pa.ChunkedArray) else wanted
    wanted = pc.cast(wanted, pa.string())
    values = pc.unique(wanted.drop_null())
    found = list(scan_keyed(uri, version, key, values, columns, KEYED_ROWS, KEYED_BYTES, position="_wanted"))
    if not found:
        schema = pa.schema(open_table(uri, version).schema().to_arrow())
        return pa.table({c: pa.nulls(len(wanted), _plain_type(schema.field(c).type)) for c in columns})
    rows = pa.concat_tables(found)
    codes, first = np.unique(rows.column("_wanted").to_numpy(), return_index=True)
    slot = np.full(len(values), -1, dtype=np.int64)
    slot[codes] = first
    at = pc.index_in(wanted, value_set=values).fill_null(-1).to_numpy(zero_copy_only=False)
    row = np.where(at >= 0, slot[np.maximum(at, 0)], -1)
    return rows.select(columns).take(pa.array(row, mask=row < 0))


def _plain_type(kind: pa.DataType) -> pa.DataType:
    return pa.string() if pa.types.is_string_view(kind) else kind


@dataclass(frozen=True)
class _Marks:
    """The wanted rows of a scan: ``rows`` (ascending, int64) among ``total`` rows, and each one's key's index in the
    values asked for (``codes``, int32). Only the rows found are held: an int32 for every row of the table was 4
    bytes an image of the table in a batch that wants a few thousand (bench/README.md, run 42)."""

    rows: np.ndarray
    codes: np.ndarray
    total: int

    def within(self, start: int, stop: int) -> _Marks:
        """The marks of rows ``start`` to ``stop`` (excluded), counted from ``start``."""
        lo, hi = np.searchsorted(self.rows, [start, stop]).tolist()
        return _Marks(self.rows[lo:hi] - start, self.codes[lo:hi], stop - start)


def _marks(uri: str, version: int, key: str, values: pa.Array) -> _Marks:
    """The rows (in scan order) whose ``key`` is one of ``values``, and its index there.

    The key column is read a block at a time: ``LOOKUP_BLOCK_ROWS`` rows for a large value set (an Arrow set lookup
    hashes its whole value set on every call), ``SEARCH_BLOCK_ROWS`` for one no larger than that block, whose
    hashing costs little beside the block's: a batch's lookup then holds a block of 4 MB of keys, not 17."""
    block_rows = SEARCH_BLOCK_ROWS if len(values) <= SEARCH_BLOCK_ROWS else LOOKUP_BLOCK_ROWS
    rows, codes, total = [], [], 0
    for block in scan_blocks(uri, version, [key], block_rows):
        at = pc.index_in(block.column(key), value_set=values).fill_null(-1).to_numpy()
        found = np.flatnonzero(at >= 0)
        rows.append(found + total)
        codes.append(at[found].astype(np.int32))
        total += block.num_rows
    if not rows:
        return _Marks(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), 0)
    return _Marks(np.concatenate(rows).astype(np.int64), np.concatenate(codes), total)


def _marked_row_groups(files: list[str], columns: list[str], schema: pa.Schema, marks: _Marks, read_rows: int,
                       position: str | None) -> Iterator[pa.RecordBatch]:
    """The marked rows of plain local files (in ``_scanned``'s order), reading only the row groups holding one."""
    offset = 0
    for path in files:
        parquet = _parquet_file(path)
        for group in range(parquet.num_row_groups):
            size = parquet.metadata.row_group(group).num_rows
            part, offset = marks.within(offset, offset + size), offset + size
            if len(part.rows):  # a row group or less at a time: decoded here (on Arrow's threads, 2x the seconds)
                yield from _marked_batches(_file_batches(parquet, columns, schema, read_rows, [group], threads=False),
                                           part, position)
    if offset != marks.total:
        raise DataError(f"a keyed scan read {offset} rows where its keys had {marks.total}")


def _marked_batches(batches: Iterable[pa.RecordBatch], marks: _Marks, position: str | None
                    ) -> Iterator[pa.RecordBatch]:
    """The marked rows of ``batches`` (their rows in the order of ``marks``), with ``position``."""
    start = 0
    for batch in batches:
        part, start = marks.within(start, start + batch.num_rows), start + batch.num_rows
        if len(part.rows):
            kept = _plain_strings(batch.take(pa.array(part.rows)))  # a MERGE's files hold string_view
            yield kept if position is None else kept.append_column(position, pa.array(part.codes))
    if start != marks.total:
        raise DataError(f"a keyed scan read {start} rows where its keys had {marks.total}")


def _regrouped(batches: Iterable[pa.RecordBatch], block_rows: int, block_bytes: int) -> Iterator[pa.Table]:
    """``batches`` as tables, each ended once it holds ``block_rows`` rows or ``block_bytes`` bytes (so past either
    by less than one batch); the last may hold fewer."""
    held: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        held.append(batch)
        rows, size = rows + batch.num_rows, size + batch.nbytes
        if rows >= block_rows or size >= block_bytes:
            yield pa.Table.from_batches(held)
            held, rows, size = [], 0, 0
            # What the block's reads and the caller's work on it freed, handed back before the next block's reads
            # (on the system pool, a trim of the C heap): a scan of the pairs' key columns otherwise grew the process
            # by 30-60 MB a block of 262,144 rows, given back only at the scan's end.
            pa.default_memory_pool().release_unused()
    if held:
        yield pa.Table.from_batches(held)


def _plain_strings(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its string_view columns cast to string (Arrow's kernels and concatenation lack it)."""
    if not any(pa.types.is_string_view(f.type) for f in batch.schema):
        return batch
    return pa.RecordBatch.from_arrays(
        [pc.cast(c, pa.string()) if pa.types.is_string_view(c.type) else c for c in batch.columns],
        names=batch.schema.names)


INTERN_SLICE = 65_536  # values made Python strings at a time by ``interned``


def interned(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A string column as Python strings, each distinct value one object (``sys.intern``) whichever table it came from.

    Curation holds the same strings in several per-image maps: an image's sha256 is a key of the raw rows, of its
    features and of the assignment record, and its component, split, run id and label repeat across rows. Read
    with ``to_pylist`` each copy is its own object (a sha256 string is 113 bytes: about 108 MiB a copy at a
    million images); interned, one. A dictionary lookup by an interned key is also a pointer comparison.
    The cost: Python's table of interned strings, one entry a distinct value (about 40 bytes), whose slots
    are kept by the process once grown (a task runs in its own process).
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    values: list[Any] = []
    for chunk in chunks:  # a slice at a time: the un-interned copies are only ever a slice's
        for start in range(0, len(chunk), INTERN_SLICE):
            values.extend(None if s is None else sys.intern(s) for s in chunk.slice(start, INTERN_SLICE).to_pylist())
    return values


def ledger_rows(uri: str) -> tuple[list[dict[str, Any]], DeltaTable | None]:
    """An append-only ledger's rows in ``seq`` order and the snapshot they came from (None: no table yet).

    The snapshot is what a compare-and-append commits against (the alert ledger, the release audit).
    """
    if not exists(uri):
        return [], None
    table = open_table(uri)
    return sorted(scan(table).to_pylist(), key=lambda r: r["seq"]), table


def read(uri: str, version: int, columns: Iterable[str] | None = None, filter: Any = None) -> pa.Table:
    """Read one explicit version (time travel); never implicitly the newest."""
    return scan(open_table(uri, version), columns, filter)


def history(uri: str) -> list[Commit]:
    """Commits newest first, with the pipeline's own metadata split out.

    delta-rs writes ``cd4ml.*`` keys at the top of commitInfo; delta-spark can only write
    ``userMetadata`` (a string), so the Spark ingest puts the same keys there as JSON.
    """
    return _commits(open_table(uri).history())


def _commits(entries: Iterable[dict[str, Any]]) -> list[Commit]:
    """delta-rs history entries as commits, newest first."""
    commits = []
    for h in entries:
        meta = {k[len(META_PREFIX):]: str(v) for k, v in h.items() if k.startswith(META_PREFIX)}
        meta.update(_user_metadata(h.get("userMetadata")))
        commits.append(Commit(int(h["version"]), str(h.get("operation", "")), int(h.get("timestamp", 0)), meta))
    return sorted(commits, key=lambda c: c.version, reverse=True)


def _user_metadata(value: Any) -> dict[str, str]:
    if not isinstance(value, str) or not value.startswith("{"):
        return {}
    try:
        data = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k[len(META_PREFIX):]: str(v) for k, v in data.items() if isinstance(k, str) and k.startswith(META_PREFIX)}


def commit_at(uri: str, version: int) -> Commit | None:
    """The commit that made ``version`` of ``uri``; None when the table or the version's log is gone."""
    if not exists(uri):
        return None
    table = DeltaTable(uri, without_files=True)
    newer = table.version() - int(version)  # the commits from ``version`` on: not the whole log, every batch
    if newer < 0:
        return None
    return next((c for c in _commits(table.history(newer + 1)) if c.version == int(version)), None)


def find_commit(uri: str, **match: str) -> Commit | None:
    """Newest commit whose metadata has all of ``match`` (used to make steps idempotent)."""
    if not exists(uri):
        return None
    for commit in history(uri):
        if all(commit.metadata.get(k) == str(v) for k, v in match.items()):
            return commit
    return None


def version_as_of(uri: str, logical_date: str | datetime) -> int:
    """The newest version committed for a logical date at or before ``logical_date``.

    Compares the ISO dates the pipeline writes in its commit metadata, so the answer for a
    given logical date does not change when the wall clock moves on.
    """
    if not exists(uri):
        raise VersionNotFoundError(f"no Delta table at {uri}: run the producing DAG first")
    wanted = normalise_logical_date(logical_date)
    for commit in history(uri):
        stamped = commit.metadata.get("logical_date")
        if stamped is not None and stamped <= wanted:
            return commit.version
    raise VersionNotFoundError(f"{uri} has no version for a logical date at or before {logical_date}")


def normalise_logical_date(value: str | datetime) -> str:
    """ISO-8601 in UTC, second precision: the one format commit metadata is compared in."""
    dt = datetime.fromisoformat(value) if isinstance(value, str) else value
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).replace(microsecond=0).isoformat()


def _with_retry(op: Callable[[], _T], what: str, attempts: int = 8) -> _T:
    """Retry a commit that lost an optimistic-concurrency race; ``op`` re-plans from the new state."""
    return retry_on_conflict(lambda _attempt: op(), what, attempts)


def _props(metadata: dict[str, Any]) -> CommitProperties:
    return CommitProperties(custom_metadata={META_PREFIX + k: str(v) for k, v in metadata.items()})


def append_new_rows(
    uri: str,
    rows: pa.Table,
    key: str | list[str],
    metadata: dict[str, Any],
    configuration: dict[str, str] | None = None,
    merge_schema: bool = False,
) -> tuple[int | None, int]:
    """Append the rows whose key is not in the table yet: ``merge_new_rows`` without a MERGE's memory.

    delta-rs' MERGE holds the target's files in memory (measured: +64 MB to add 200 rows to a
    20,000-row curation feature table, growing with the table). Here only the key columns are read,
    in record batches, the rows already there are left out and the rest appended (``append_stream``)
    against the version whose keys were read: a concurrent commit refuses it and the keys are read
    again. A re-run adds nothing and commits nothing. A table that does not exist yet, or whose
    columns differ from ``rows`` (a schema that grew), goes through ``merge_new_rows``.
    """
    keys = [key] if isinstance(key, str) else list(key)
    if rows.num_rows == 0:
        return None, 0
    if not exists(uri) or pa.schema(open_table(uri).schema().to_arrow()).names != rows.schema.names:
        return merge_new_rows(uri, rows, keys, metadata, configuration, merge_schema)

    def attempt() -> tuple[int | None, int]:
        table = open_table(uri)
        new = rows.filter(pc.invert(pc.is_in(_joined_key(rows, keys), value_set=_present_keys(uri, table, rows, keys))))
        if new.num_rows == 0:
            return None, 0
        return append_stream(uri, pa.RecordBatchReader.from_batches(new.schema, new.to_batches()), metadata, table,
                             configuration)

    return _with_retry(attempt, f"append to {uri}")


def _joined_key(table: pa.Table | pa.RecordBatch, keys: list[str]) -> pa.Array:
    """One string per row from its key columns (string_view cast to string: Arrow's kernels lack it)."""
    cols = [pc.cast(table.column(k), pa.string()) for k in keys]
    joined = cols[0] if len(cols) == 1 else pc.binary_join_element_wise(*cols, "\x1f")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _present_keys(uri: str, table: DeltaTable, rows: pa.Table, keys: list[str]) -> pa.Array:
    """The keys of ``rows`` that ``table`` holds, reading its key columns a block of rows at a time (one set
    lookup a block: each hashes every key of ``rows`` again). A few rows (a batch's) are looked for in blocks of
    ``SEARCH_BLOCK_ROWS``: hashing them again a block costs nothing, and a block of ``LOOKUP_BLOCK_ROWS`` rows of
    the features' keys, joined, was the high of a batch at a million images (+166 MB against +26 at 100,000)."""
    wanted = _joined_key(rows, keys)
    block = SEARCH_BLOCK_ROWS if len(wanted) <= SEARCH_BLOCK_ROWS else LOOKUP_BLOCK_ROWS
    found = [stored.filter(pc.is_in(stored, value_set=wanted))
             for stored in (_joined_key(b, keys) for b in scan_blocks(uri, table.version(), keys, block))]
    pa.default_memory_pool().release_unused()  # the blocks' reads are handed back, not kept by the pool
    return pa.concat_arrays(found) if found else pa.array([], pa.string())


def merge_new_rows(
    uri: str,
    rows: pa.Table,
    key: str | list[str],
    metadata: dict[str, Any],
    configuration: dict[str, str] | None = None,
    merge_schema: bool = False,
) -> tuple[int | None, int]:
    """Insert the rows whose key is not in the table yet (MERGE ... WHEN NOT MATCHED INSERT).

    Returns (version, inserted). A batch with nothing new commits nothing and returns
    (None, 0), so re-runs leave the table's version history untouched. ``merge_schema``: columns
    the table lacks are added (nullable), for a schema that grew a column.
    """
    keys = [key] if isinstance(key, str) else list(key)
    if rows.num_rows == 0:
        return None, 0
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)

    def attempt() -> tuple[int | None, int]:
        if not exists(uri):
            try:
                write_deltalake(uri, rows, mode="error", configuration=configuration, commit_properties=_props(metadata))
                return DeltaTable(uri, without_files=True).version(), rows.num_rows
            except Exception:
                if not exists(uri):
                    raise
                # Another writer created the table between our check and our write: merge instead.
        result = (
            DeltaTable(uri)
            .merge(rows, predicate=predicate, source_alias="s", target_alias="t", commit_properties=_props(metadata),
                   merge_schema=merge_schema)
            .when_not_matched_insert_all()
            .execute()
        )
        inserted = int(result.get("num_target_rows_inserted", 0))
        if inserted == 0:
            return None, 0
        return DeltaTable(uri, without_files=True).version(), inserted

    return _with_retry(attempt, f"merge into {uri}")


def overwrite(uri: str, rows: pa.Table, metadata: dict[str, Any], configuration: dict[str, str] | None = None) -> int:
    """Replace the table's contents in one commit (a full snapshot version)."""

    def attempt() -> int:
        write_deltalake(
            uri,
            rows,
            mode="overwrite",
            schema_mode="overwrite",
            configuration=configuration,
            commit_properties=_props(metadata),
        )
        return DeltaTable(uri, without_files=True).version()

    return _with_retry(attempt, f"overwrite {uri}")


def overwrite_stream(uri: str, schema: pa.Schema, batches: Callable[[], Iterable[pa.RecordBatch]],
                     metadata: dict[str, Any], configuration: dict[str, str] | None = None) -> int:
    """``overwrite`` written as ``append_stream`` writes: a row group at a time, then one overwrite commit.

    ``batches`` makes the rows afresh on each call (a lost race calls it again), so they need never
    be in memory together: a curated snapshot's image bytes are gathered a block at a time while
    they are written. ``write_deltalake`` buffers what it writes (measured: +60 MB to rewrite a
    20,000-image curated snapshot whose rows were already in memory); here the writer holds one
    row group. A table that does not exist yet is created by the same commit; an empty stream
    commits an empty version. A lost race re-reads the table and commits again.
    """

    def attempt() -> int:
        table = open_table(uri) if exists(uri) else None
        version, _ = append_stream(uri, pa.RecordBatchReader.from_batches(schema, batches()), metadata, table,
                                   configuration, mode="overwrite")
        return version if version is not None else overwrite(uri, schema.empty_table(), metadata, configuration)

    return _with_retry(attempt, f"overwrite {uri}")


def stats_columns_config(schema: pa.Schema) -> dict[str, str]:
    """Keep binary columns out of Delta column statistics (min/max of image bytes is waste)."""
    cols = [f.name for f in schema if not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))]
    return {"delta.dataSkippingStatsColumns": ",".join(cols)}


# --------------------------------------------------------------------------- streamed writes


def retry_on_conflict(op: Callable[[int], _T], what: str, attempts: int = 8) -> _T:
    """Run ``op(attempt)`` until it commits; after a lost race it is called again to re-plan.

    The operation gets the attempt number, so a caller whose input was a one-shot stream can
    rebuild it (and re-read the table it planned against) before retrying.
    """
    for attempt in range(1, attempts + 1):
        try:
            return op(attempt)
        except (CommitFailedError, ConcurrentCreateError) as exc:
            if attempt == attempts:
                raise
            delay = min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())
            log.warning("%s: commit conflict (%s), re-plan %d/%d in %.2fs", what, exc, attempt, attempts, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def append_stream(
    uri: str,
    reader: pa.RecordBatchReader,
    metadata: dict[str, Any],
    table: DeltaTable | None,
    configuration: dict[str, str] | None = None,
    target_file_size: int = 16 << 20,
    row_group_rows: int = 2048,
    mode: str = "append",
) -> tuple[int | None, int]:
    """Write a stream as Parquet with bounded memory, then commit it as ONE version, or refuse.

    ``mode="overwrite"`` commits the files as the table's whole contents (``overwrite_stream``).

    Why not ``write_deltalake``: fed a fast stream it reads ahead without bound (measured: peak
    memory grows with the stream). Here pyarrow writes row groups of ``row_group_rows`` into
    files of about ``target_file_size`` as batches arrive (fewer rows a group where rows are big:
    ``ROW_GROUP_BYTES``), so memory is one row group, whatever
    the stream's length; the files are then committed in one transaction.

    ``table`` is the snapshot the caller planned against (None: it planned against no table,
    which is then created). The commit is made against that snapshot with no automatic
    rebase (``max_commit_retries=0``): if anyone committed since, Delta refuses it
    (``CommitFailedError`` / ``ConcurrentCreateError``), this call deletes the files it wrote,
    and the caller re-plans. Returns (version, rows) or (None, 0) for an empty stream. Stats per
    file: numRecords, nullCount, and min/max of integer, string and timestamp columns (binary
    columns never). The min/max matter beyond skipping: delta-rs prunes a file whose stats lack
    a column's min/max from any filter on that column (measured: a string filter then returns
    no rows), so every column a reader may filter on gets them.
    """
    import os

    from pyarrow import fs as pafs

    filesystem, base = pafs.FileSystem.from_uri(uri if "://" in uri else os.path.abspath(uri))
    filesystem.create_dir(base, recursive=True)
    parts = _Parts(filesystem, base, reader.schema, target_file_size, row_group_rows)
    try:
        for batch in reader:
            if batch.num_rows:
                parts.write(batch)
        parts.close()
        if parts.rows == 0:
            return None, 0
        _commit_parts(uri, parts, metadata, table, configuration, mode)
        parts.paths.clear()  # committed: the files belong to the table now
        return DeltaTable(uri, without_files=True).version(), parts.rows
    finally:
        parts.discard()


ROW_GROUP_BYTES = 16 << 20  # a row group's bytes at most (about): a reader holds a few times a column chunk


def _group_rows(batch: pa.RecordBatch, rows: int) -> int:
    """Rows a row group of ``batch``: ``rows``, fewer where its rows are big (2,048 photos of 120 KB: 240 MB a
    group, and a reader held 3.6 times a column chunk: measured on 512-row groups of 256 px PNGs)."""
    return max(1, min(rows, ROW_GROUP_BYTES * batch.num_rows // max(batch.nbytes, 1)))


class _Parts:
    """Parquet files of about a target size written from a stream, each with its Delta stats (``append_stream``).

    Memory is one row group: batches go to the open file as they come, and a new file starts
    once the open one has reached the target size.
    """

    def __init__(self, filesystem: Any, base: str, schema: pa.Schema, target_file_size: int,
                 row_group_rows: int) -> None:
        self.filesystem, self.base, self.schema = filesystem, base, schema
        self.target_file_size, self.row_group_rows = target_file_size, row_group_rows
        self.ranged = [f.name for f in schema if _has_range(f.type)]
        self.counted = [f.name for f in schema if not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))]
        self.added: list[Any] = []  # AddAction per closed file
        self.paths: list[str] = []  # every file written and not committed
        self.rows = 0
        self._writer: Any = None
        self._file: dict[str, Any] = {}  # the open file: name, path, rows, nulls, min, max

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None or self.filesystem.get_file_info(self._file["path"]).size >= self.target_file_size:
            self.close()
            self._open()
        self._writer.write_batch(batch, row_group_size=_group_rows(batch, self.row_group_rows))
        f = self._file
        f["rows"] += batch.num_rows
        self.rows += batch.num_rows
        for col in self.counted:
            f["nulls"][col] += batch.column(col).null_count
        for col in self.ranged:
            lo, hi = pc.min_max(batch.column(col)).values()
            if lo.is_valid:
                f["min"][col] = min(lo.as_py(), f["min"].get(col, lo.as_py()))
                f["max"][col] = max(hi.as_py(), f["max"].get(col, hi.as_py()))

    def _open(self) -> None:
        import uuid

        import pyarrow.parquet as pq

        name = f"part-{uuid.uuid4()}-c000.snappy.parquet"
        self._file = {"name": name, "path": f"{self.base}/{name}", "rows": 0,
                      "nulls": dict.fromkeys(self.counted, 0), "min": {}, "max": {}}
        self.paths.append(self._file["path"])
        self._writer = pq.ParquetWriter(self._file["path"], self.schema, filesystem=self.filesystem,
                                        compression="snappy")

    def close(self) -> None:
        """Close the open file (if any) and record its add action with its stats."""
        from deltalake.transaction import AddAction

        if self._writer is None:
            return
        writer, self._writer, f = self._writer, None, self._file
        writer.close()
        info = self.filesystem.get_file_info(f["path"])
        stats = {"numRecords": f["rows"], "nullCount": f["nulls"],
                 "minValues": {k: _stat_value(v, ceil=False) for k, v in f["min"].items()},
                 "maxValues": {k: _stat_value(v, ceil=True) for k, v in f["max"].items()}}
        self.added.append(AddAction(f["name"], int(info.size), {}, int(time.time() * 1000), True, json.dumps(stats)))

    def discard(self) -> None:
        """Remove what was written and not committed (a kill -9 leaves it to VACUUM)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for path in self.paths:
            try:
                self.filesystem.delete_file(path)
            except OSError:
                pass


def _commit_parts(uri: str, parts: _Parts, metadata: dict[str, Any], table: DeltaTable | None,
                  configuration: dict[str, str] | None, mode: str = "append") -> None:
    """The files as ONE commit against ``table`` (None: create the table), with no automatic rebase."""
    from deltalake import Schema
    from deltalake.transaction import create_table_with_add_actions

    props = CommitProperties(custom_metadata={META_PREFIX + k: str(v) for k, v in metadata.items()},
                             max_commit_retries=0)
    if table is None:
        try:
            create_table_with_add_actions(uri, Schema.from_arrow(parts.schema), parts.added, mode="error",
                                          configuration=configuration, commit_properties=props)
        except Exception as exc:
            if exists(uri):
                raise ConcurrentCreateError(f"{uri} was created concurrently: {exc}") from exc
            raise
    else:
        table.create_write_transaction(parts.added, mode=mode, schema=Schema.from_arrow(parts.schema),
                                       commit_properties=props)


def _has_range(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_timestamp(kind)


def _stat_value(value: Any, ceil: bool) -> Any:
    """A min/max as the Delta log writes it: timestamps in UTC at millisecond precision (bounds kept)."""
    if not isinstance(value, datetime):
        return value
    value = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    floor = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if ceil and floor != value:
        floor += timedelta(milliseconds=1)
    return floor.strftime("%Y-%m-%dT%H:%M:%S.") + f"{floor.microsecond // 1000:03d}Z"


def upsert_batches(
    uri: str,
    make_batches: Callable[[], Iterable[pa.RecordBatch]],
    schema: pa.Schema,
    key: str,
    metadata: dict[str, Any],
    chunk_rows: int = 20_000,
) -> list[int]:
    """Insert new keys and replace the rows of existing ones, with memory that stays flat.

    For bookkeeping tables (the ingest manifest). Rows with new keys are streamed in with
    ``append_stream`` against the snapshot whose keys were checked (the stream's keys looked up in the table's key
    column a block at a time, never the whole column held; one commit; a concurrent commit refuses it and the whole
    upsert is re-planned, ``make_batches`` being called again);
    rows whose key exists are MERGEd ``chunk_rows`` at a time (a MERGE holds its source in
    memory). Keys must be unique within the stream. Returns the versions committed.
    """

    def attempt(_: int) -> list[int]:
        table = DeltaTable(uri) if exists(uri) else None
        known = None
        if table is not None:  # the stream's keys the table holds, its key column read a block at a time
            stream = [b.select([key]) for b in make_batches()]
            known = _present_keys(uri, table, pa.Table.from_batches(stream, pa.schema([schema.field(key)])), [key])
        changed: list[pa.RecordBatch] = []

        def new_rows():
            for batch in make_batches():
                if known is None:
                    yield batch
                    continue
                present = pc.is_in(batch.column(key), value_set=known)
                changed.append(batch.filter(present))
                yield batch.filter(pc.invert(present))

        versions: list[int] = []
        version, _ = append_stream(uri, pa.RecordBatchReader.from_batches(schema, new_rows()), metadata, table)
        if version is not None:
            versions.append(version)
        for start in range(0, sum(b.num_rows for b in changed), chunk_rows):
            rows = pa.Table.from_batches(changed, schema=schema).slice(start, chunk_rows)
            version = _with_retry(lambda rows=rows: _merge_upsert(uri, rows, key, metadata), f"upsert into {uri}")
            if version is not None:
                versions.append(version)
        return versions

    return retry_on_conflict(attempt, f"upsert into {uri}")


def upsert_rows(uri: str, rows: pa.Table, key: str, metadata: dict[str, Any]) -> int | None:
    """Insert new keys and replace existing ones in ONE commit (a MERGE; the rows are held in memory).

    For a few rows against a table that exists: a reader never sees half of them. Returns the
    version, or None when nothing changed.
    """
    if rows.num_rows == 0:
        return None
    return _with_retry(lambda: _merge_upsert(uri, rows, key, metadata), f"upsert into {uri}")


def _merge_upsert(uri: str, rows: pa.Table, key: str, metadata: dict[str, Any]) -> int | None:
    result = (
        DeltaTable(uri)
        .merge(rows, predicate=f"t.`{key}` = s.`{key}`", source_alias="s", target_alias="t",
               merge_schema=True, commit_properties=_props(metadata))
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    if int(result.get("num_target_rows_inserted", 0)) + int(result.get("num_target_rows_updated", 0)) == 0:
        return None
    return DeltaTable(uri, without_files=True).version()


# --------------------------------------------------------------------------- names and refs


@dataclass(frozen=True)
class Tag:
    table: str
    name: str
    version: int
    tagged_at: datetime
    run_id: str
    note: str


TAG_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("tagged_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("note", pa.string(), nullable=False),
    ]
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def tags_uri(uri: str) -> str:
    """The ``dataset_tags`` table beside ``uri`` (same lake, same environment)."""
    return f"{uri.rstrip('/').rsplit('/', 1)[0]}/{TAGS_TABLE}"


def table_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def check_tag_name(name: str) -> str:
    """A usable version name: letters, digits, ``.``, ``_``, ``-``; never all digits (a version)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"version name {name!r} must be 1-128 characters of letters, digits, '.', '_' or '-', starting with "
            "a letter or digit"
        )
    if name.isdigit():
        raise ValueError(f"version name {name!r} is all digits: it would read as a version number")
    return name


def tags(uri: str) -> list[Tag]:
    """The names given to versions of ``uri``, oldest first."""
    tags_table = tags_uri(uri)
    if not exists(tags_table):
        return []
    rows = scan(DeltaTable(tags_table), filters=[("table", "=", table_name(uri))]).to_pylist()
    found = [Tag(r["table"], r["name"], int(r["version"]), r["tagged_at"], r["run_id"], r["note"]) for r in rows]
    return sorted(found, key=lambda t: (t.tagged_at, t.name))


def tag_version(uri: str, version: int, name: str, run_id: str = "", note: str = "") -> Tag:
    """Give ``version`` of ``uri`` the immutable name ``name`` (idempotent for the same version)."""
    check_tag_name(name)
    open_table(uri, int(version))  # the version must exist: a name never points at nothing
    table = table_name(uri)
    row = pa.Table.from_pylist(
        [{"table": table, "name": name, "version": int(version), "tagged_at": datetime.now(UTC),
          "run_id": run_id, "note": note}],
        schema=TAG_SCHEMA,
    )
    tags_table = tags_uri(uri)

    def attempt() -> None:
        if not exists(tags_table):
            try:
                write_deltalake(tags_table, row, mode="error", commit_properties=_props({"step": "tag", "name": name}))
                return
            except Exception:
                if not exists(tags_table):
                    raise
        (
            DeltaTable(tags_table)
            .merge(row, predicate="t.`table` = s.`table` AND t.name = s.name", source_alias="s", target_alias="t",
                   commit_properties=_props({"step": "tag", "name": name}))
            .when_not_matched_insert_all()
            .execute()
        )

    _with_retry(attempt, f"tag {table}@{version} as {name}")
    stored = next(t for t in tags(uri) if t.name == name)
    if stored.version != int(version):
        raise TagConflictError(
            f"version name {name!r} already names {table} version {stored.version} (tagged {stored.tagged_at:%Y-%m-%d %H:%M} "
            f"by run {stored.run_id or '?'}); names are immutable: choose another name for version {version}"
        )
    return stored


def _parse_timestamp(ref: str) -> datetime | None:
    text = ref.strip()
    if not re.match(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", text):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def version_at(uri: str, when: datetime) -> int:
    """The version that was current at ``when`` (naive = UTC); an error before the first commit."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    commits = history(uri)
    first_ms = min(c.timestamp_ms for c in commits)
    if when.timestamp() * 1000 < first_ms:
        first = datetime.fromtimestamp(first_ms / 1000, tz=UTC)
        raise VersionNotFoundError(f"{uri} did not exist at {when.isoformat()}: its first commit is {first.isoformat()}")
    table = open_table(uri)
    table.load_as_version(when)
    return table.version()


def resolve_version(uri: str, ref: int | str | datetime) -> int:
    """A version number from a number, a tag name or a timestamp (order in the module doc)."""
    if isinstance(ref, bool):
        raise TypeError(f"version reference must be an int, str or datetime, got {ref!r}")
    if isinstance(ref, datetime):
        return version_at(uri, ref)
    if isinstance(ref, int) or (isinstance(ref, str) and ref.strip().isdigit()):
        version = int(ref)
        open_table(uri, version)  # raises VersionNotFoundError naming the table and the version
        return version
    if not isinstance(ref, str) or not ref.strip():
        raise VersionNotFoundError(f"empty version reference for {uri}")
    text = ref.strip()
    for tag in tags(uri):
        if tag.name == text:
            return tag.version
    when = _parse_timestamp(text)
    if when is not None:
        return version_at(uri, when)
    names = [t.name for t in tags(uri)]
    raise VersionNotFoundError(
        f"{uri}: {ref!r} is not a version number, a version name or a timestamp with a time "
        f"(e.g. 2026-11-21T18:00:00Z); names on this table: {names or 'none'}"
    )


def resolve_dataset_version(curated_uri: str, ref: int | str | datetime, raw_uri: str | None = None) -> int:
    """The curated version to train on for a ``dataset_version`` Param (module doc).

    Tries ``ref`` on the curated table; a name that only the raw table carries means "the newest
    curated version built from that raw version".
    """
    try:
        return resolve_version(curated_uri, ref)
    except VersionNotFoundError:
        if raw_uri is None or not isinstance(ref, str) or ref.strip().isdigit():
            raise
        raw_tag = next((t for t in tags(raw_uri) if t.name == ref.strip()), None)
        if raw_tag is None:
            raise
    for commit in history(curated_uri):
        if commit.metadata.get("raw_version") == str(raw_tag.version):
            return commit.version
    raise VersionNotFoundError(
        f"{ref!r} names raw version {raw_tag.version} of {raw_uri}, and no version of {curated_uri} "
        "was curated from it yet: run cd4ml_curate with that raw_version first"
    )


@dataclass(frozen=True)
class VersionInfo:
    version: int
    timestamp: datetime
    operation: str
    names: tuple[str, ...]
    metadata: dict[str, str]


def versions(uri: str) -> list[VersionInfo]:
    """Every version of ``uri``, newest first, with its names and pipeline metadata (``cd4ml versions``)."""
    names: dict[int, list[str]] = {}
    for tag in tags(uri):
        names.setdefault(tag.version, []).append(tag.name)
    return [
        VersionInfo(c.version, datetime.fromtimestamp(c.timestamp_ms / 1000, tz=UTC), c.operation,
                    tuple(names.get(c.version, ())), c.metadata)
        for c in history(uri)
    ]
