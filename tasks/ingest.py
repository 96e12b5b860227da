"""Ingest a landing folder of images into the versioned ``raw_images`` Delta table.

Layout of the landing folder: ``<landing>/<label>/<any name>.<image extension>``.

* Key: sha256 of the file's bytes. The write is a MERGE that inserts only unseen keys, so a
  re-run, a retry or a backfill never duplicates a row and commits no empty version.
* The original bytes are stored in the ``image`` column (excluded from column statistics);
  decoding and normalisation happen downstream, so the raw table is the untouched record.
* Every file that cannot be used becomes a row in the ``rejects`` table with a reason code
  and detail; the rest of the batch goes on. Reject rows are keyed by (source, content), so
  re-running over the same bad file records it once.
* Each commit carries the run id and the logical date: ``lake.version_as_of`` finds it later.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from tasks import lake
from tasks.images import ImageInfo, Rejection, inspect_image
from tasks.settings import Settings

log = logging.getLogger(__name__)

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

META_COLUMNS = [f.name for f in RAW_SCHEMA if f.name != "image"]


class EmptyLandingError(RuntimeError):
    """The landing folder holds no files: there is nothing to ingest."""


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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Candidate:
    path: Path
    label: str | None


def scan_landing(landing: Path) -> list[_Candidate]:
    """Every regular file below ``landing``, sorted, with the label its folder gives."""
    if not landing.exists():
        raise FileNotFoundError(f"landing folder {landing} does not exist")
    if not landing.is_dir():
        raise NotADirectoryError(f"landing path {landing} is not a folder")
    found = []
    for root, dirs, files in os.walk(landing):
        dirs.sort()
        for name in sorted(files):
            if name.startswith("."):
                continue  # editor and OS droppings (.DS_Store) are not images
            path = Path(root) / name
            rel = path.relative_to(landing)
            found.append(_Candidate(path, rel.parts[0] if len(rel.parts) >= 2 else None))
    return found


def _reject_row(source: str, sha: str | None, label: str | None, rej: Rejection, run_id: str, logical_date: str, now: datetime) -> dict:
    reject_id = hashlib.sha256(f"{source}\0{sha or ''}\0{rej.code}".encode()).hexdigest()
    return {
        "reject_id": reject_id,
        "source_uri": source,
        "sha256": sha,
        "label": label,
        "reason_code": rej.code,
        "reason": rej.detail,
        "ingest_run_id": run_id,
        "logical_date": logical_date,
        "rejected_at": now,
    }


def ingest_landing(settings: Settings, run_id: str, logical_date: str | datetime, landing: str | Path | None = None) -> IngestResult:
    """Ingest every file below the landing folder; returns the raw version holding the batch."""
    cfg = settings.ingest
    landing_path = Path(landing or settings.storage.landing_uri)
    logical = lake.normalise_logical_date(logical_date)
    candidates = scan_landing(landing_path)
    if not candidates:
        raise EmptyLandingError(f"landing folder {landing_path} holds no files: nothing to ingest, no new version")

    raw_uri, rejects_uri = settings.raw_table, settings.rejects_table
    now = datetime.now(UTC)  # a record of when, not an input to any decision
    allowed = set(cfg.allowed_labels)
    extensions = {e.lower() for e in cfg.image_extensions}
    known: dict[str, str] = {}
    current = lake.current_version(raw_uri)
    if current is not None:
        existing = lake.read(raw_uri, current, columns=["sha256", "label"])
        known = dict(zip(existing.column("sha256").to_pylist(), existing.column("label").to_pylist()))

    rows: list[dict] = []
    rejects: list[dict] = []
    seen_in_batch: dict[str, tuple[str, str]] = {}  # sha -> (label, source)
    already_present = 0
    for cand in candidates:
        source = cand.path.resolve().as_uri()

        def reject(code: str, detail: str, sha: str | None = None, source=source, label=cand.label) -> None:
            rejects.append(_reject_row(source, sha, label, Rejection(code, detail), run_id, logical, now))

        if cand.label is None:
            reject("no_label", "file sits directly in the landing folder; put it under <label>/")
            continue
        if cand.label not in allowed:
            reject("unknown_label", f"label {cand.label!r} is not in allowed_labels")
            continue
        if cand.path.suffix.lower() not in extensions:
            reject("bad_extension", f"extension {cand.path.suffix!r} is not an image extension")
            continue
        try:
            data = cand.path.read_bytes()
        except OSError as exc:
            reject("unreadable", f"cannot read file: {exc.strerror or exc}")
            continue
        sha = hashlib.sha256(data).hexdigest()
        prior = known.get(sha)
        if prior is not None:
            if prior != cand.label:
                reject("label_conflict", f"same bytes already ingested with label {prior!r}", sha)
            else:
                already_present += 1
            continue
        if sha in seen_in_batch:
            other_label, other_source = seen_in_batch[sha]
            if other_label != cand.label:
                reject("label_conflict", f"same bytes also at {other_source} with label {other_label!r}", sha)
            else:
                already_present += 1  # an exact copy under the same label: one row is enough
            continue
        info = inspect_image(data, min_side=cfg.min_side, max_side=cfg.max_side, max_pixels=cfg.max_pixels)
        if isinstance(info, Rejection):
            reject(info.code, info.detail, sha)
            continue
        assert isinstance(info, ImageInfo)
        seen_in_batch[sha] = (cand.label, source)
        rows.append(
            {
                "sha256": sha,
                "image": data,
                "width": info.width,
                "height": info.height,
                "format": info.format,
                "mode": info.mode,
                "label": cand.label,
                "source_uri": source,
                "ingest_run_id": run_id,
                "logical_date": logical,
                "ingested_at": now,
            }
        )

    # A conflict discovered later in the batch also disqualifies the copy accepted earlier.
    conflicted = {r["sha256"] for r in rejects if r["reason_code"] == "label_conflict" and r["sha256"] not in known}
    if conflicted:
        kept = []
        for row in rows:
            if row["sha256"] in conflicted:
                rejects.append(
                    _reject_row(row["source_uri"], row["sha256"], row["label"],
                                Rejection("label_conflict", "same bytes appear under another label in this batch"),
                                run_id, logical, now)
                )
            else:
                kept.append(row)
        rows = kept

    metadata = {"run_id": run_id, "logical_date": logical, "step": "ingest"}
    new_version, inserted = lake.merge_new_rows(
        raw_uri, pa.Table.from_pylist(rows, schema=RAW_SCHEMA), "sha256", metadata,
        configuration=lake.stats_columns_config(RAW_SCHEMA),
    )
    lake.merge_new_rows(rejects_uri, pa.Table.from_pylist(rejects, schema=REJECT_SCHEMA), "reject_id", metadata)
    raw_version = new_version if new_version is not None else lake.current_version(raw_uri)
    if raw_version is None:
        raise EmptyLandingError(
            f"landing folder {landing_path}: all {len(candidates)} files were rejected "
            f"(see {rejects_uri}); no raw table version exists"
        )
    result = IngestResult(
        raw_table=raw_uri,
        raw_version=raw_version,
        committed=new_version is not None,
        files_seen=len(candidates),
        inserted=inserted,
        already_present=already_present + (len(rows) - inserted),
        rejected=len(rejects),
        rejects_table=rejects_uri,
        run_id=run_id,
        logical_date=logical,
    )
    log.info("ingest: %s", result)
    return result
