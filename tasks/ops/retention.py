"""Retention (VACUUM) that never removes a version a registered model was trained on.

Time travel needs two things of an old version: its data files and its log. Both are guarded:

* Data files: ``vacuum`` passes the protected versions to delta-rs as ``keep_versions``, so the
  files those snapshots reference are never deleted, however old; every other file no version
  references any more (superseded snapshots, the orphans a killed writer left) is deleted once
  it is older than ``retention.retention_hours``. The window also protects writers in flight:
  a file younger than it is never touched, committed or not.
* Logs: delta-rs deletes commit JSON files older than ``delta.logRetentionDuration`` whenever
  it writes a checkpoint, and a version whose JSON is gone cannot be loaded. Before the first
  vacuum of a table that has protected versions, ``delta.enableExpiredLogCleanup`` is set to
  ``false`` on it (one metadata-only commit, once). Log files are small; losing a model's
  training data is not.

Protected versions come from ``protected_versions``: every version of this environment's
registered model names its curated table and version and its raw version (tags set by
``tasks.models.registry``); named dataset versions (``lake.tag_version``) are protected too while
``retention.protect_tagged`` is on. After the vacuum every protected version is opened and each
of its files checked on disk; a missing one is an error, never silence.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from urllib.parse import unquote, urlparse

from deltalake import CommitProperties, DeltaTable

from tasks.data import lake
from tasks.settings import Settings

log = logging.getLogger(__name__)

TABLES = ("raw_images", "rejects", "curated_images", "training_sample", "ingest_manifest", "ingest_zones", lake.TAGS_TABLE)


class RetentionError(RuntimeError):
    """A protected version lost a file: stop and investigate before anything else is deleted."""


@dataclass(frozen=True)
class VacuumResult:
    table: str
    retention_hours: int
    protected_versions: list[int]
    deleted_files: int
    dry_run: bool
    deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _uri(settings: Settings, table: str) -> str:
    return table if "/" in table or "://" in table else settings.table_uri(table)


def protected_versions(settings: Settings, table: str) -> set[int]:
    """Versions of ``table`` (a name or URI) that VACUUM must keep (module doc)."""
    from tasks.models import registry  # imports MLflow: only when retention actually runs

    uri = _uri(settings, table)
    keep: set[int] = set()
    for mv in registry.model_versions(settings):
        if uri == settings.raw_table and mv.get("raw_version") is not None:
            keep.add(int(mv["raw_version"]))
        curated = mv.get("curated_table") or settings.curated_table
        if uri == curated and mv.get("curated_version") is not None:
            keep.add(int(mv["curated_version"]))
        if uri == settings.curated_table and curated == settings.sample_table and mv.get("curated_version") is not None:
            source = _sampled_from(settings.sample_table, int(mv["curated_version"]))  # the version a sample was cut from
            if source is not None:
                keep.add(source)
    if settings.retention.protect_tagged:
        keep |= {t.version for t in lake.tags(uri)}
    return keep


def _sampled_from(sample_table: str, version: int) -> int | None:
    commit = lake.commit_at(sample_table, version)
    source = commit.metadata.get("curated_version") if commit is not None else None
    return int(source) if source not in (None, "") else None


def _keep_logs(table: DeltaTable) -> None:
    config = table.metadata().configuration or {}
    if str(config.get("delta.enableExpiredLogCleanup", "")).lower() == "false":
        return
    table.alter.set_table_properties(
        {"delta.enableExpiredLogCleanup": "false"},
        commit_properties=CommitProperties(custom_metadata={lake.META_PREFIX + "step": "retention"}),
    )


def _local_path(table_uri: str, file_uri: str) -> str | None:
    parsed = urlparse(file_uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else os.path.join(table_uri, file_uri)
    return None  # object stores: trust the listing delta-rs already did


def check_readable(uri: str, version: int) -> None:
    """Open ``version`` and confirm every file it references exists (local tables)."""
    table = lake.open_table(uri, version)
    missing = [f for f in table.file_uris() if (p := _local_path(uri, f)) is not None and not os.path.exists(p)]
    if missing:
        raise RetentionError(f"{uri} version {version} lost {len(missing)} files to VACUUM, e.g. {missing[0]}")


def vacuum(
    settings: Settings,
    table: str,
    protected_versions: Iterable[int],
    *,
    retention_hours: int | None = None,
    dry_run: bool = False,
) -> VacuumResult:
    """VACUUM ``table`` (a name under the lake, or a URI) keeping ``protected_versions`` intact."""
    uri = _uri(settings, table)
    hours = settings.retention.retention_hours if retention_hours is None else int(retention_hours)
    if hours < 0:
        raise ValueError(f"retention_hours must be >= 0, got {hours}")
    dt = lake.open_table(uri)
    latest = dt.version()
    keep = sorted({int(v) for v in protected_versions if 0 <= int(v) <= latest})
    dropped = sorted(set(int(v) for v in protected_versions) - set(keep))
    if dropped:
        log.warning("retention: %s has no versions %s; nothing to protect there", uri, dropped)
    for v in keep:  # a protected version that is already unreadable must not be made worse silently
        check_readable(uri, v)
    if keep and not dry_run:
        _keep_logs(dt)
        dt = lake.open_table(uri)
    deleted = dt.vacuum(
        retention_hours=hours,
        dry_run=dry_run,
        enforce_retention_duration=False,  # the environment's setting is the policy, not delta-rs' 7-day default
        full=True,  # also orphans of killed writers, which no log entry names
        keep_versions=keep or None,
        commit_properties=CommitProperties(custom_metadata={lake.META_PREFIX + "step": "retention"}),
    )
    if not dry_run:
        for v in keep:
            check_readable(uri, v)
    result = VacuumResult(uri, hours, keep, len(deleted), dry_run, sorted(deleted))
    log.info("retention: %s: %s %d files (retention %dh, protected versions %s)", uri,
             "would delete" if dry_run else "deleted", len(deleted), hours, keep)
    return result


def vacuum_lake(settings: Settings, dry_run: bool = False) -> list[VacuumResult]:
    """VACUUM every pipeline table of this environment that exists, each with its protected versions."""
    results = []
    for name in TABLES:
        uri = settings.table_uri(name)
        if lake.exists(uri):
            results.append(vacuum(settings, uri, protected_versions(settings, uri), dry_run=dry_run))
    return results
