"""Ingest's admission rules, written once for both engines (``tasks.data.ingest`` and ``tasks.data.spark_ingest``).

What a file must be to become a row of ``raw_images``, and what a file that cannot becomes (a
row of the ``rejects`` table, keyed by source, content and reason), in the order both engines
apply them:

1. the listing's own verdict (``tasks.data.sources``: traversal, symlinks, manifest rows, ...);
2. the label and the name (``listing_problem``): ``no_label``, ``unknown_label``, ``bad_extension``;
3. the bytes: ``file_too_large`` (from the listed size, before opening; a read never takes more
   than ``ingest.max_file_bytes``), ``unreadable``, then the content (``examine``: ``tasks.data.images.prepare_image``
   under ``ingest``'s size and mode limits);
4. the same bytes under two labels: ``label_conflict`` for every copy, whether the other copy is
   already in the table (``table_conflict``) or in this batch (``batch_conflict``).

The engines differ in how they apply the rules (Python loops over Arrow batches, or Spark joins
and windows), never in the rules, the reject rows or the result they return.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from tasks.data.images import PreparedImage, Rejection, prepare_image
from tasks.data.sources import Entry, FileTooLargeError, Source, open_source, too_large
from tasks.errors import DataError
from tasks.settings import IngestSettings

RAW_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("image", pa.binary(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("format", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("ingest_run_id", pa.string(), nullable=False),
        pa.field("logical_date", pa.string(), nullable=False),
        pa.field("ingested_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # Added by the data plane; null on rows written before it (older tables evolve on merge).
        pa.field("source_format", pa.string(), nullable=True),
        pa.field("source_mode", pa.string(), nullable=True),
        pa.field("normalised", pa.string(), nullable=True),
    ]
)

REJECT_SCHEMA = pa.schema(
    [
        pa.field("reject_id", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=True),
        pa.field("label", pa.string(), nullable=True),
        pa.field("reason_code", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("ingest_run_id", pa.string(), nullable=False),
        pa.field("logical_date", pa.string(), nullable=False),
        pa.field("rejected_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

# The ``ingest`` settings that decide whether the bytes are a usable image (``prepare_image``'s limits).
IMAGE_RULES = ("min_side", "max_side", "max_pixels", "keep_modes", "convert_modes")


class EmptyLandingError(DataError, RuntimeError):
    """The landing zone holds no candidate files (or none usable): a retry cannot help, the run fails at once."""


@dataclass(frozen=True)
class IngestResult:
    raw_table: str
    raw_version: int  # the version that holds this batch (new, or unchanged when nothing was new)
    committed: bool  # False when every image was already in the table
    files_seen: int
    inserted: int
    already_present: int
    rejected: int
    rejects_table: str
    run_id: str
    logical_date: str
    source_uri: str = ""
    label_source: str = "folders"
    engine: str = "local"
    files_read: int = 0  # files opened this run (the rest were unchanged and skipped)
    unchanged_skipped: int = 0
    commit_attempts: int = 1
    seconds: float = 0.0
    zone_unchanged: bool = False  # the listing matched the zone's settled state: nothing opened or read

    def to_dict(self) -> dict:
        return asdict(self)


def reject_row(source: str, sha: str | None, label: str | None, code: str, detail: str, run_id: str,
               logical_date: str, now: datetime) -> dict:
    """One row of the rejects table; its id is (source, content, reason), so a re-run records it once."""
    reject_id = hashlib.sha256(f"{source}\0{sha or ''}\0{code}".encode()).hexdigest()
    return {
        "reject_id": reject_id,
        "source_uri": source,
        "sha256": sha,
        "label": label,
        "reason_code": code,
        "reason": detail,
        "ingest_run_id": run_id,
        "logical_date": logical_date,
        "rejected_at": now,
    }


def open_landing(landing_uri: str, label_source: str, manifest: str | None, cfg: IngestSettings) -> Source:
    """The landing zone as a ``Source`` under ``cfg``'s schemes and row bound.

    A missing root (``LandingNotFoundError``) or a file (``LandingNotAFolderError``) stays a
    ``DataError`` (and the built-in error of that name): the DAG fails it at once, unretried.
    """
    return open_source(landing_uri, label_source, manifest, allowed_schemes=cfg.allowed_schemes,  # type: ignore[arg-type]
                       schemes_key="ingest.allowed_schemes", max_row_bytes=cfg.max_manifest_row_bytes)


def read_bounded(source: Source, entry: Entry, max_bytes: int) -> bytes | Rejection:
    """Rule 3's first half: the file's bytes, or ``file_too_large`` / ``unreadable`` (never a read of more)."""
    problem = too_large(entry, max_bytes)
    if problem is not None:
        return problem
    try:
        return source.read(entry, max_bytes)
    except FileTooLargeError:
        return Rejection("file_too_large", f"file is above max_file_bytes {max_bytes} (grew after the listing)")
    except OSError as exc:
        return unreadable(exc)


def no_files(landing_uri: str) -> EmptyLandingError:
    return EmptyLandingError(f"landing folder {landing_uri} holds no files: nothing to ingest, no new version")


def all_rejected(landing_uri: str, files: int, rejects_uri: str) -> EmptyLandingError:
    return EmptyLandingError(
        f"landing folder {landing_uri}: all {files} files were rejected (see {rejects_uri}); no raw table version exists"
    )


def allowed_labels(cfg: IngestSettings) -> set[str] | None:
    """The labels a file may have; None: classes are discovered (validation decides)."""
    return None if cfg.allowed_labels == "discover" else set(cfg.allowed_labels)


def image_extensions(cfg: IngestSettings) -> set[str]:
    return {e.lower() for e in cfg.image_extensions}


def image_rules(cfg: IngestSettings) -> dict[str, Any]:
    """``prepare_image``'s limits as plain values (they travel to Spark executors as they are)."""
    return {k: getattr(cfg, k) for k in IMAGE_RULES}


def listing_problem(uri: str, label: str | None, allowed: set[str] | None, extensions: set[str]) -> Rejection | None:
    """Rule 2: what is wrong with a listed file's label or name, before it is opened."""
    if label is None:
        return Rejection("no_label", "file sits directly in the landing folder; put it under <label>/")
    if allowed is not None and label not in allowed:
        return Rejection("unknown_label", f"label {label!r} is not in allowed_labels")
    ext = posixpath.splitext(uri)[1]
    if ext.lower() not in extensions:
        return Rejection("bad_extension", f"extension {ext!r} is not an image extension")
    return None


def unreadable(exc: OSError) -> Rejection:
    return Rejection("unreadable", f"cannot read file: {exc.strerror or exc}")


def examine(data: bytes, rules: dict[str, Any]) -> tuple[str, PreparedImage | Rejection]:
    """Rule 3: the file's key (sha256 of its bytes) and what is stored for it, or why it cannot be."""
    return hashlib.sha256(data).hexdigest(), prepare_image(data, **rules)


def table_conflict(table_label: str) -> Rejection:
    """Rule 4: the same bytes are already in the table under another label (the table's label stands)."""
    return Rejection("label_conflict", f"same bytes already ingested with label {table_label!r}")


def batch_conflict(other_labels: list[str]) -> Rejection:
    """Rule 4: the same bytes appear under other labels in this batch: no copy is admitted."""
    return Rejection("label_conflict", f"same bytes also appear under label(s) {other_labels} in this batch")
