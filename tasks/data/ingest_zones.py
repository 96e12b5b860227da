"""Settled landing zones: skip a zone whose listing has not changed since it was last decided.

The per-file incremental check (``ingest_manifest``: size, mtime, ETag per source URI) already
avoids opening unchanged files, but it still reads the manifest and the raw table's keys and
joins them with the listing: at 100,000 files that is as much work again as the listing itself.
This module makes an unchanged zone cost its listing and two tiny reads.

After an ingest has decided every file of a zone, the ``ingest_zones`` Delta table records,
per zone (root URI + label source + manifest), a digest of the whole listing (every URI,
path, label, size, mtime, ETag and listing problem, plus the rules that decide a file: allowed
labels, extensions, size and pixel bounds, modes) together with the raw table's id and
version after the run, and the counts a re-run would report. The next ingest of that zone
computes the digest of its own listing; when it matches and ``raw_images`` is still at the
recorded version of the same table, the outcome of deciding every file again is known to be
"nothing new": every file was either written, already present, or rejected for a reason that
depends only on its bytes, its path or its label, and none of those changed. The run then
returns at once: no file opened, nothing read but the zone's record and the raw table's
log, nothing committed.

Any difference falls back to the per-file path, which is always correct on its own: one
file touched, added or removed (its stamp is in the digest), a manifest edited (labels are in
the digest), other settings, or another ingest having committed to ``raw_images`` since (its
version moved). A zone is recorded only when its outcome cannot change without its listing
changing: not when a file was ``unreadable`` (a permission fix changes no size or mtime, so
the file must be tried again next time), and not when a file's size or mtime is unknown
(some object stores), where the per-file path never trusts a stamp either.

Like any stat-based check (make, rsync, git), a rewrite that keeps a file's size and
nanosecond mtime is invisible; ``cd4ml ingest --full``, the DAG Param ``full_recheck`` or
``ingest_landing(..., full=True)`` re-decides every file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from tasks.data import lake

log = logging.getLogger(__name__)

ZONES_TABLE = "ingest_zones"
# Bump when the per-file decision rules change in a way settings do not show: every recorded
# zone is then decided again once.
RULES_VERSION = 1

ZONE_SCHEMA = pa.schema(
    [
        pa.field("zone_key", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("label_source", pa.string(), nullable=False),
        pa.field("manifest_uri", pa.string(), nullable=True),
        pa.field("listing_digest", pa.string(), nullable=False),
        pa.field("raw_table_id", pa.string(), nullable=False),
        pa.field("raw_version", pa.int64(), nullable=False),
        pa.field("files_seen", pa.int64(), nullable=False),
        pa.field("already_present", pa.int64(), nullable=False),
        pa.field("rejected", pa.int64(), nullable=False),
        pa.field("ingest_run_id", pa.string(), nullable=False),
        pa.field("logical_date", pa.string(), nullable=False),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


@dataclass(frozen=True)
class Zone:
    """What a re-run over an unchanged zone would find (counts as the per-file path reports them)."""

    key: str
    digest: str
    raw_table_id: str
    raw_version: int
    files_seen: int
    already_present: int
    rejected: int
    ingest_run_id: str


def zone_key(source_uri: str, label_source: str, manifest_uri: str | None) -> str:
    return hashlib.sha256(f"{source_uri}\0{label_source}\0{manifest_uri or ''}".encode()).hexdigest()


def listing_digest(listing: pa.Table, rules: dict) -> str:
    """sha256 of the listing's columns (one Arrow IPC stream, single chunk) and the decision rules."""
    digest = hashlib.sha256(json.dumps({"rules_version": RULES_VERSION, **rules}, sort_keys=True, default=list).encode())
    table = listing.combine_chunks()
    with pa.PythonFile(_HashSink(digest), mode="w") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)  # streamed into the hash: no copy of the listing is held
    return digest.hexdigest()


class _HashSink:
    """A write-only file whose bytes go straight into a hash."""

    def __init__(self, digest) -> None:
        self.digest, self.closed = digest, False

    def write(self, data) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def stable(listing: pa.Table, reject_codes: set[str]) -> bool:
    """Can this run's outcome be recorded (module doc): no transient failure, every stamp known."""
    if "unreadable" in reject_codes:
        return False
    listed = pc.is_null(listing.column("problem_code"))
    unknown = pc.or_(pc.less(listing.column("size"), 0), pc.less(listing.column("mtime_ns"), 0))
    return not pc.any(pc.and_(listed, unknown)).as_py()


def table_identity(uri: str) -> tuple[str, int] | None:
    """(Delta table id, version) of the table's newest snapshot; None when there is no table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(uri, without_files=True)
    except TableNotFoundError:
        return None
    return str(table.metadata().id), int(table.version())


def recorded(zones_uri: str, key: str) -> Zone | None:
    """The zone's last recorded state, or None (no table, or this zone never settled)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(zones_uri)
    except TableNotFoundError:
        return None
    zones = lake.scan(table)  # one row a zone: read whole, filtered here
    rows = zones.filter(pc.equal(zones.column("zone_key"), key)).to_pylist()
    if not rows:
        return None
    row = rows[0]
    return Zone(row["zone_key"], row["listing_digest"], row["raw_table_id"], row["raw_version"], row["files_seen"],
                row["already_present"], row["rejected"], row["ingest_run_id"])


def settled(zones_uri: str, raw_uri: str, key: str, digest: str) -> Zone | None:
    """The recorded zone when its listing digest matches and raw_images has not moved since; else None."""
    zone = recorded(zones_uri, key)
    if zone is None or zone.digest != digest:
        return None
    if table_identity(raw_uri) != (zone.raw_table_id, zone.raw_version):
        return None
    return zone


def record(zones_uri: str, zone: Zone, *, source_uri: str, label_source: str, manifest_uri: str | None,
           logical_date: str, now: datetime) -> None:
    """Upsert the zone's settled state (one small MERGE; only after a run that decided every file)."""
    row = {"zone_key": zone.key, "source_uri": source_uri, "label_source": label_source,
           "manifest_uri": manifest_uri, "listing_digest": zone.digest, "raw_table_id": zone.raw_table_id,
           "raw_version": zone.raw_version, "files_seen": zone.files_seen, "already_present": zone.already_present,
           "rejected": zone.rejected, "ingest_run_id": zone.ingest_run_id, "logical_date": logical_date,
           "recorded_at": now}
    batch = pa.RecordBatch.from_pylist([row], schema=ZONE_SCHEMA)
    lake.upsert_batches(zones_uri, lambda: [batch], ZONE_SCHEMA, "zone_key",
                        {"run_id": zone.ingest_run_id, "logical_date": logical_date, "step": "ingest_zones"})


__all__ = ["RULES_VERSION", "ZONES_TABLE", "ZONE_SCHEMA", "Zone", "listing_digest", "record", "recorded", "settled",
           "stable", "table_identity", "zone_key"]
