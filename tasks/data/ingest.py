"""Ingest a landing zone of images into the versioned ``raw_images`` Delta table.

Where files come from and where labels come from is ``tasks.data.sources`` (local path or fsspec
URL; label = folder, or a CSV/JSONL manifest). What is stored per image is
``tasks.data.images.prepare_image``. Which file becomes a row and which a reject is
``tasks.data.admission`` (the same rules for the Spark engine, ``tasks.data.spark_ingest``). This
module applies them, streams and commits:

* Key: ``sha256`` of the file's bytes. Only keys absent from the table snapshot the run planned
  against are written, and the commit is refused if that snapshot is no longer the latest, so a
  re-run, a retry or a backfill never duplicates a row and commits no empty version.
* ``image`` holds the file's original bytes, or a lossless PNG of the normalised pixels when
  the file needed an EXIF rotation or a mode conversion (``normalised`` says which; ``sha256``
  stays the key of the source file either way). Bytes live inline in the table and are kept
  out of Delta column statistics (``delta.dataSkippingStatsColumns``).
* One ingest run = at most ONE commit to ``raw_images``: the dataset version. Files are read,
  hashed and decoded in batches of ``ingest.batch_size``; accepted rows go to a local Arrow IPC
  spill file (not memory), and after the whole zone is decided the spill is streamed through
  ``lake.append_stream``: pyarrow writes Parquet row groups as they come (files of
  ``ingest.target_file_mb``) and all files are committed as one transaction. (delta-rs'
  ``write_deltalake`` reads a fast stream ahead without bound; measured, its peak memory grows
  with the zone.) Image bytes therefore never accumulate in memory; what grows with the zone is
  a few columns of per-file facts (URIs, hashes, labels: a few hundred bytes a file, see
  bench/README.md).
* Same bytes under two labels: every copy is rejected (``label_conflict``), whether the other
  copy is in this run or already in the table (the table's label stands). Same bytes under the
  same label: one row, the other copies count as ``already_present``.
* Every file that cannot be used becomes a row of the ``rejects`` table with a reason code and
  a detail; the batch goes on. Reject rows are keyed by (source, content, reason), so re-running
  over the same bad file records it once. Codes: the listing's (``tasks.data.sources``: path_traversal,
  outside_landing, missing_file, bad_manifest_row, symlink_outside_landing, broken_symlink,
  not_a_file, undecodable_name), the label's (``no_label``, ``unknown_label``, ``label_conflict``),
  ``bad_extension``, ``file_too_large``, ``unreadable`` and the content's (``tasks.data.images``: empty_file,
  not_an_image, corrupt_image, too_many_pixels, animated, too_small, too_large, unsupported_mode).
* Incremental: the ``ingest_manifest`` table remembers, per source URI, size, mtime (ns), ETag
  and what the content was (sha256, or its reject code). A file whose size, mtime and ETag are
  unchanged is not opened again: its sha256 decides (already present, conflicting, or cached
  reject). The manifest's rows and the raw table's labels are read by key for the files listed
  (``lake.rows_for_keys``), never whole. An unchanged zone therefore costs one listing (stat) and two
  small table reads, and commits nothing anywhere. Unknown size or mtime (some object stores) is never "unchanged".
* Settled zones (``tasks.data.ingest_zones``): after a run has decided every file, a digest of the
  whole listing and the raw version are recorded per zone; a later run whose listing has the
  same digest, while ``raw_images`` is still at that version, returns at once without reading
  the manifest or the raw keys. ``full=True`` re-decides every file, opening each again.
* Concurrency: the plan (which keys are new, which conflict) is made against one snapshot of
  ``raw_images`` and committed against that same snapshot with no automatic rebase; if another
  ingest committed meanwhile, Delta refuses the commit, the attempt deletes its files, and the
  run re-plans from the new snapshot (``ingest.commit_retries`` times), streaming again from its
  spill file (no file is read twice). Two overlapping ingests therefore leave no
  duplicate and lose nothing. A kill -9 leaves at most orphan Parquet files that no commit
  names (the table stays readable at its last version; VACUUM removes them) and a re-run
  completes the work; the manifest is committed after the raw table, so it never claims work
  the raw table lacks.
* Each commit carries the run id and the logical date: ``lake.version_as_of`` finds it later.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tasks.data import admission, ingest_zones, lake
from tasks.data.admission import RAW_SCHEMA, REJECT_SCHEMA, EmptyLandingError, IngestResult
from tasks.data.images import Rejection
from tasks.data.sources import Entry, Source
from tasks.data.spark_ingest import ingest_with_spark
from tasks.settings import Settings

log = logging.getLogger(__name__)

MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("mtime_ns", pa.int64(), nullable=False),
        pa.field("etag", pa.string(), nullable=True),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("content_code", pa.string(), nullable=True),  # null = a usable image
        pa.field("content_detail", pa.string(), nullable=True),
        pa.field("ingest_run_id", pa.string(), nullable=False),
        pa.field("checked_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

# The columns every version of raw_images has had (validation reads exactly these).
META_COLUMNS = ["sha256", "width", "height", "format", "mode", "label", "source_uri", "ingest_run_id",
                "logical_date", "ingested_at"]
MANIFEST_TABLE = "ingest_manifest"
_SPILL_SCHEMA = RAW_SCHEMA.append(pa.field("seq", pa.int64(), nullable=False))
# Content verdicts worth remembering: they depend on the bytes only, so an unchanged file keeps them.
_CONTENT_CODES = {"empty_file", "not_an_image", "corrupt_image", "too_many_pixels", "animated", "too_small",
                  "too_large", "unsupported_mode"}


class _Spill:
    """An Arrow IPC file written batch by batch and read back batch by batch (never all at once)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path, self.schema, self.rows = path, schema, 0
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_file(self._sink, schema)

    def write(self, columns: dict[str, list]) -> None:
        n = len(next(iter(columns.values())))
        if n:
            self._writer.write_batch(pa.record_batch([pa.array(columns[f.name], f.type) for f in self.schema],
                                                     schema=self.schema))
            self.rows += n

    def close(self) -> None:
        self._writer.close()
        self._sink.close()

    def batches(self) -> Iterator[pa.RecordBatch]:
        with pa.OSFile(str(self.path), "rb") as source:  # plain reads, not mmap: RSS stays flat
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _cached(manifest_uri: str, listing: pa.Table, trust: bool = True) -> pa.Table:
    """Per listed file, aligned with the listing: unchanged since the last check? and what it held then.

    ``trust=False`` (a full re-check) treats every file as changed.
    """
    n = listing.num_rows
    empty = pa.table({"unchanged": pa.array(np.zeros(n, dtype=bool)), "sha256": pa.nulls(n, pa.string()),
                      "content_code": pa.nulls(n, pa.string()), "content_detail": pa.nulls(n, pa.string())})
    version = lake.current_version(manifest_uri) if trust else None
    if version is None:
        return empty
    rows = lake.rows_for_keys(manifest_uri, version, "source_uri", listing.column("uri"),
                              ["source_uri", "size", "mtime_ns", "etag", "sha256", "content_code", "content_detail"])
    hit = pc.is_valid(rows.column("source_uri"))
    if not pc.any(hit).as_py():
        return empty
    same = pc.and_(pc.equal(listing.column("size"), rows.column("size")),
                   pc.equal(listing.column("mtime_ns"), rows.column("mtime_ns")))
    etag_same = pc.or_(pc.and_(pc.is_null(listing.column("etag")), pc.is_null(rows.column("etag"))),
                       pc.fill_null(pc.equal(listing.column("etag"), rows.column("etag")), False))
    known_stamp = pc.and_(pc.greater_equal(listing.column("size"), 0), pc.greater_equal(listing.column("mtime_ns"), 0))
    unchanged = pc.fill_null(pc.and_(pc.and_(hit, same), pc.and_(etag_same, known_stamp)), False)
    return pa.table({"unchanged": unchanged, "sha256": rows.column("sha256"),
                     "content_code": rows.column("content_code"), "content_detail": rows.column("content_detail")})


class _Known(NamedTuple):
    """The raw table's labels as of the snapshot the commit is checked against (``version`` None: no table yet),
    read by sha256 for the images asked about (never the whole table: a batch against millions of rows)."""

    uri: str
    version: int | None

    @classmethod
    def of(cls, uri: str, table: DeltaTable | None) -> _Known:
        return cls(uri, table.version() if table is not None else None)

    def labels(self, shas: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The table's label for each sha (null: not in the table, or no sha)."""
        if self.version is None:
            return pa.nulls(len(shas), pa.string())
        return lake.rows_for_keys(self.uri, self.version, "sha256", shas, ["label"]).column("label").combine_chunks()


def _settled(listing: pa.Table, cache: pa.Table, cached_label, allowed: set[str] | None, extensions: set[str]) -> np.ndarray:
    """Files decided without a Python step: unchanged, fine before, already in the table under this label.

    In an unchanged zone that is every file, which is what makes a re-ingest cheap.
    """
    ext = pc.utf8_lower(pc.struct_field(pc.extract_regex(listing.column("uri"), r"(?P<ext>\.[^./]*)$"), [0]))
    ok = pc.and_(cache.column("unchanged"), pc.is_null(listing.column("problem_code")))
    if allowed is not None:  # None: discover, any label
        ok = pc.and_(ok, pc.is_in(listing.column("label"), value_set=pa.array(sorted(allowed), pa.string())))
    ok = pc.and_(ok, pc.is_in(ext, value_set=pa.array(sorted(extensions), pa.string())))
    ok = pc.and_(ok, pc.is_null(cache.column("content_code")))
    ok = pc.and_(ok, pc.equal(cached_label, listing.column("label")))
    return pc.fill_null(ok, False).to_numpy(zero_copy_only=False)


def _with_columns(table: DeltaTable | None, schema: pa.Schema) -> DeltaTable | None:
    """An older raw table gains the columns added since (nullable; one metadata commit, once)."""
    if table is None:
        return None
    from deltalake import Schema

    have = {f.name for f in table.schema().fields}
    missing = [f for f in schema if f.name not in have]
    if not missing:
        return table
    table.alter.add_columns(Schema.from_arrow(pa.schema(missing)).fields)
    return table  # its snapshot moved to the new version: the plan it serves was made on the same rows


@dataclass
class _Plan:
    keep: np.ndarray  # bool per listing seq: this spilled row is written
    rejects: list[dict]
    already_present: int
    to_insert: int


def _plan(cands: pa.Table, known: _Known, uris: pa.ChunkedArray, n: int, reject) -> _Plan:
    """Decide the spilled candidates against the table snapshot and against each other."""
    keep = np.zeros(n, dtype=bool)
    rejects: list[dict] = []
    present = 0
    if cands.num_rows == 0:
        return _Plan(keep, rejects, 0, 0)
    table_label = known.labels(cands.column("sha256")).to_pylist()
    seqs = cands.column("seq").to_pylist()
    shas = cands.column("sha256").to_pylist()
    labels = cands.column("label").to_pylist()
    fresh: dict[str, list[int]] = {}  # sha -> positions in cands, in listing order
    for i, (sha, label, prior) in enumerate(zip(shas, labels, table_label)):
        if prior is None:
            fresh.setdefault(sha, []).append(i)
        elif prior == label:
            present += 1
        else:
            conflict = admission.table_conflict(prior)
            rejects.append(reject(uris[seqs[i]].as_py(), sha, label, conflict.code, conflict.detail))
    inserted = 0
    for sha, positions in fresh.items():
        group_labels = sorted({labels[i] for i in positions})
        if len(group_labels) > 1:
            for i in positions:
                conflict = admission.batch_conflict([lb for lb in group_labels if lb != labels[i]])
                rejects.append(reject(uris[seqs[i]].as_py(), sha, labels[i], conflict.code, conflict.detail))
            continue
        keep[seqs[positions[0]]] = True  # the first copy in listing order
        inserted += 1
        present += len(positions) - 1
    return _Plan(keep, rejects, present, inserted)


@dataclass
class _Run:
    """What every phase of one local ingest run shares: its identity, the table URIs, the rules."""

    settings: Settings
    run_id: str
    logical: str
    now: datetime  # a record of when, not an input to any decision
    source: Source
    label_source: str
    listing: pa.Table
    allowed: set[str] | None  # None: classes are discovered (validation decides)
    extensions: set[str]
    rules: dict  # prepare_image's limits (admission.image_rules)
    zone_key: str
    digest: str
    started: float

    @property
    def n(self) -> int:
        return self.listing.num_rows

    def reject(self, source_uri: str, sha: str | None, label: str | None, code: str, detail: str) -> dict:
        return admission.reject_row(source_uri, sha, label, code, detail, self.run_id, self.logical, self.now)


@dataclass
class _Scan:
    """Phase 2's outcome: candidates spilled to disk, manifest rows, rejects and counters."""

    spill: _Spill
    seen: _Spill
    cands: pa.Table  # seq, sha256, label of every candidate row
    rejects: list[dict]
    already_present: int  # settled by the incremental state: in the table with the same label
    skipped: int  # those, plus unchanged files whose verdict is remembered (content rejects, label conflicts)
    files_read: int


def _open_run(settings: Settings, run_id: str, logical_date: str | datetime, landing_uri: str, label_source: str,
              manifest: str | None, started: float) -> _Run:
    """Phase 1: the source, its listing (an empty one is EmptyLandingError) and the run's rules."""
    cfg = settings.ingest
    source = admission.open_landing(landing_uri, label_source, manifest, cfg)
    listing = source.listing()
    if listing.num_rows == 0:
        raise admission.no_files(landing_uri)
    allowed, extensions = admission.allowed_labels(cfg), admission.image_extensions(cfg)
    rules = admission.image_rules(cfg)
    digest = ingest_zones.listing_digest(listing, {
        "allowed": sorted(allowed) if allowed is not None else "discover", "extensions": sorted(extensions), **rules,
        "max_file_bytes": cfg.max_file_bytes})
    return _Run(settings, run_id, lake.normalise_logical_date(logical_date), datetime.now(UTC), source, label_source,
                listing, allowed, extensions, rules,
                ingest_zones.zone_key(source.root_uri, label_source, source.manifest_uri), digest, started)


def _unchanged_zone(run: _Run, zone: ingest_zones.Zone) -> IngestResult:
    """The shortcut: the zone's whole listing was decided before; nothing is opened, read or written."""
    settings = run.settings
    log.info("ingest: zone unchanged since run %s (listing digest %s, raw_images v%d): nothing read or written",
             zone.ingest_run_id, run.digest[:12], zone.raw_version)
    return IngestResult(
        raw_table=settings.raw_table, raw_version=zone.raw_version, committed=False, files_seen=run.n, inserted=0,
        already_present=zone.already_present, rejected=zone.rejected, rejects_table=settings.rejects_table,
        run_id=run.run_id, logical_date=run.logical, source_uri=run.source.root_uri, label_source=run.label_source,
        engine="local", files_read=0, unchanged_skipped=run.n, commit_attempts=0,
        seconds=round(time.perf_counter() - run.started, 3), zone_unchanged=True)


def _decide_file(run: _Run, part: dict[str, list], hits: dict[str, list], prior: str | None, j: int, seq: int,
                 rows: dict[str, list], checked: dict[str, list], checked_uris: set[str] | None,
                 counts: dict[str, int], rejects: list[dict]) -> None:
    """One file of a batch: a reject row, a candidate row (and a manifest row), or nothing to do."""
    uri, label = part["uri"][j], part["label"][j]
    if part["problem_code"][j]:
        rejects.append(run.reject(uri, None, label, part["problem_code"][j], part["problem_detail"][j]))
        return
    problem = admission.listing_problem(uri, label, run.allowed, run.extensions)
    if problem is not None:
        rejects.append(run.reject(uri, None, label, problem.code, problem.detail))
        return
    unchanged = hits["unchanged"][j]
    if unchanged:
        sha = hits["sha256"][j]
        if hits["content_code"][j]:
            rejects.append(run.reject(uri, sha, label, hits["content_code"][j], hits["content_detail"][j]))
            counts["skipped"] += 1
            return
        if prior is not None:  # (the same label was settled before the scan, without this loop)
            counts["skipped"] += 1
            conflict = admission.table_conflict(prior)
            rejects.append(run.reject(uri, sha, label, conflict.code, conflict.detail))
            return
        # Unchanged but not in the table (it lost a label conflict, or the table is new): read it.
    data = admission.read_bounded(run.source, Entry(uri, part["path"][j], label, part["size"][j]),
                                  run.settings.ingest.max_file_bytes)
    if isinstance(data, Rejection):
        rejects.append(run.reject(uri, None, label, data.code, data.detail))
        return
    counts["files_read"] += 1
    sha, info = admission.examine(data, run.rules)
    if not unchanged and (checked_uris is None or uri not in checked_uris):
        if checked_uris is not None:
            checked_uris.add(uri)
        content_code = info.code if isinstance(info, Rejection) and info.code in _CONTENT_CODES else None
        for key, value in (("source_uri", uri), ("size", part["size"][j]), ("mtime_ns", part["mtime_ns"][j]),
                           ("etag", part["etag"][j]), ("sha256", sha), ("content_code", content_code),
                           ("content_detail", info.detail if content_code else None),
                           ("ingest_run_id", run.run_id), ("checked_at", run.now)):
            checked[key].append(value)
    if isinstance(info, Rejection):
        rejects.append(run.reject(uri, sha, label, info.code, info.detail))
        return
    for key, value in (("sha256", sha), ("image", info.data), ("width", info.width), ("height", info.height),
                       ("format", info.format), ("mode", info.mode), ("label", label), ("source_uri", uri),
                       ("ingest_run_id", run.run_id), ("logical_date", run.logical), ("ingested_at", run.now),
                       ("source_format", info.source_format), ("source_mode", info.source_mode),
                       ("normalised", info.normalised), ("seq", seq)):
        rows[key].append(value)


def _scan(run: _Run, tmp: Path, full: bool, known: _Known) -> _Scan:
    """Phase 2: decide every file the incremental state does not settle, batch by batch, spilled to disk."""
    cfg, listing = run.settings.ingest, run.listing
    cache = _cached(run.settings.table_uri(MANIFEST_TABLE), listing, trust=not full)
    cached_label = known.labels(cache.column("sha256"))
    settled = _settled(listing, cache, cached_label, run.allowed, run.extensions)
    todo = np.flatnonzero(~settled)
    rejects: list[dict] = []
    counts = {"skipped": int(settled.sum()), "files_read": 0}
    checked_uris: set[str] | None = None if run.label_source == "folders" else set()  # a manifest may name a file twice
    spill = _Spill(tmp / "candidates.arrow", _SPILL_SCHEMA)
    seen = _Spill(tmp / "manifest.arrow", MANIFEST_SCHEMA)
    cand_index: list[pa.Table] = []
    for start in range(0, len(todo), cfg.batch_size):
        seqs = todo[start:start + cfg.batch_size]
        take = pa.array(seqs)
        part, hits = listing.take(take).to_pydict(), cache.take(take).to_pydict()
        priors = cached_label.take(take).to_pylist()
        rows: dict[str, list] = {f.name: [] for f in _SPILL_SCHEMA}
        checked: dict[str, list] = {f.name: [] for f in MANIFEST_SCHEMA}
        for j in range(len(seqs)):
            _decide_file(run, part, hits, priors[j], j, int(seqs[j]), rows, checked, checked_uris, counts, rejects)
        spill.write(rows)
        seen.write(checked)
        if rows["seq"]:
            cand_index.append(pa.table({"seq": pa.array(rows["seq"], pa.int64()),
                                        "sha256": pa.array(rows["sha256"], pa.string()),
                                        "label": pa.array(rows["label"], pa.string())}))
    spill.close()
    seen.close()
    cands = pa.concat_tables(cand_index) if cand_index else pa.table(
        {"seq": pa.array([], pa.int64()), "sha256": pa.array([], pa.string()), "label": pa.array([], pa.string())})
    return _Scan(spill, seen, cands, rejects, already_present=int(settled.sum()), skipped=counts["skipped"],
                 files_read=counts["files_read"])


def _commit(run: _Run, scan: _Scan, snapshot: DeltaTable | None, known: _Known, metadata: dict
            ) -> tuple[int | None, int, _Plan, int, int | None]:
    """Phase 3: the candidates not in the table yet, in ONE Delta commit (re-planned after a lost race).

    Returns (new version or None, rows inserted, the plan, attempts, the version planned against).
    """
    cfg, raw_uri = run.settings.ingest, run.settings.raw_table
    uris = run.listing.column("uri")
    configuration = {**lake.stats_columns_config(RAW_SCHEMA), "delta.targetFileSize": str(cfg.target_file_mb << 20)}
    state: dict = {"attempts": 0}

    def commit(attempt: int) -> tuple[int | None, int]:
        state["attempts"] = attempt
        table = snapshot if attempt == 1 else (DeltaTable(raw_uri) if lake.exists(raw_uri) else None)
        plan = _plan(scan.cands, known if attempt == 1 else _Known.of(raw_uri, table), uris, run.n, run.reject)
        state["plan"], state["planned_version"] = plan, table.version() if table is not None else None
        if plan.to_insert == 0:
            return None, 0

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in scan.spill.batches():
                mask = plan.keep[batch.column("seq").to_numpy()]
                if mask.any():
                    yield batch.filter(pa.array(mask)).select(RAW_SCHEMA.names).cast(RAW_SCHEMA)

        reader = pa.RecordBatchReader.from_batches(RAW_SCHEMA, batches())
        return lake.append_stream(raw_uri, reader, metadata, table=_with_columns(table, RAW_SCHEMA),
                                  configuration=configuration, target_file_size=cfg.target_file_mb << 20)

    new_version, inserted = lake.retry_on_conflict(commit, f"ingest into {raw_uri}", attempts=cfg.commit_retries)
    return new_version, inserted, state["plan"], state["attempts"], state["planned_version"]


def _record_zone(run: _Run, rejects: list[dict], new_version: int | None, planned_version: int | None,
                 identity: tuple[str, int] | None, decided: int) -> None:
    """Phase 4: a stable listing is recorded as settled, last: everything it vouches for is written."""
    if not ingest_zones.stable(run.listing, {r["reason_code"] for r in rejects}):
        return
    decided_at = new_version if new_version is not None else planned_version
    if identity is not None and decided_at is not None:
        ingest_zones.record(run.settings.table_uri(ingest_zones.ZONES_TABLE), ingest_zones.Zone(
            run.zone_key, run.digest, identity[0], decided_at, run.n, decided, len(rejects), run.run_id),
            source_uri=run.source.root_uri, label_source=run.label_source, manifest_uri=run.source.manifest_uri,
            logical_date=run.logical, now=run.now)


def ingest_landing(
    settings: Settings,
    run_id: str,
    logical_date: str | datetime,
    landing: str | Path | None = None,
    *,
    label_source: str | None = None,
    manifest: str | None = None,
    engine: str | None = None,
    full: bool = False,
) -> IngestResult:
    """Ingest the landing zone (default: the environment's) into ``raw_images`` (module doc).

    ``label_source`` (folders | csv | jsonl), ``manifest`` and ``engine`` (local | spark) default
    to ``settings.ingest``. ``full`` trusts no incremental state: every file is opened and decided
    again (the table still gets no duplicate). Returns the raw version holding the batch.
    Phases: open the run (listing, rules), the unchanged-zone shortcut, scan, commit, rejects and
    manifest, record the zone.
    """
    cfg = settings.ingest
    engine = engine or cfg.engine
    label_source = label_source or cfg.label_source
    manifest = manifest if manifest is not None else (cfg.manifest_uri if label_source != "folders" else None)
    if engine == "spark":
        return ingest_with_spark(settings, run_id, logical_date, landing, label_source=label_source, manifest=manifest)
    if engine != "local":
        raise ValueError(f"ingest engine must be local or spark, got {engine!r}")
    started = time.perf_counter()
    landing_uri = str(landing or settings.storage.landing_uri)
    run = _open_run(settings, run_id, logical_date, landing_uri, label_source, manifest, started)
    listed_s = time.perf_counter() - started
    raw_uri, rejects_uri = settings.raw_table, settings.rejects_table
    zone = None if full else ingest_zones.settled(settings.table_uri(ingest_zones.ZONES_TABLE), raw_uri,
                                                  run.zone_key, run.digest)
    if zone is not None:
        return _unchanged_zone(run, zone)

    snapshot = DeltaTable(raw_uri) if lake.exists(raw_uri) else None
    known = _Known.of(raw_uri, snapshot)
    metadata = {"run_id": run_id, "logical_date": run.logical, "step": "ingest", "source": run.source.root_uri,
                "label_source": label_source}
    with tempfile.TemporaryDirectory(prefix="cd4ml-ingest-") as tmp:
        scan = _scan(run, Path(tmp), full, known)
        scanned_s = time.perf_counter() - started - listed_s
        new_version, inserted, plan, attempts, planned_version = _commit(run, scan, snapshot, known, metadata)
        rejects = scan.rejects + plan.rejects
        already_present = scan.already_present + plan.already_present
        written_s = time.perf_counter() - started - listed_s - scanned_s
        lake.merge_new_rows(rejects_uri, pa.Table.from_pylist(rejects, schema=REJECT_SCHEMA), "reject_id", metadata)
        if scan.seen.rows:
            lake.upsert_batches(settings.table_uri(MANIFEST_TABLE), scan.seen.batches, MANIFEST_SCHEMA, "source_uri",
                                {**metadata, "step": "ingest_manifest"})

    identity = ingest_zones.table_identity(raw_uri)  # (table id, newest version): one log load serves both uses
    raw_version = new_version if new_version is not None else (identity[1] if identity is not None else None)
    if raw_version is None:
        raise admission.all_rejected(landing_uri, run.n, rejects_uri)
    _record_zone(run, rejects, new_version, planned_version, identity, already_present + inserted)
    result = IngestResult(
        raw_table=raw_uri, raw_version=raw_version, committed=new_version is not None, files_seen=run.n,
        inserted=inserted, already_present=already_present, rejected=len(rejects), rejects_table=rejects_uri,
        run_id=run_id, logical_date=run.logical, source_uri=run.source.root_uri, label_source=label_source,
        engine="local", files_read=scan.files_read, unchanged_skipped=scan.skipped, commit_attempts=attempts,
        seconds=round(time.perf_counter() - started, 3),
    )
    log.info("ingest: %s (list %.2fs, read+decode %.2fs, write %.2fs)", result, listed_s, scanned_s, written_s)
    return result


__all__ = [
    "EmptyLandingError",
    "IngestResult",
    "MANIFEST_SCHEMA",
    "META_COLUMNS",
    "RAW_SCHEMA",
    "REJECT_SCHEMA",
    "ingest_landing",
]
