"""Delta Lake access through delta-rs (the embedded engine).

Every commit the pipeline makes carries custom metadata (``cd4ml.*`` keys: run id, logical
date, input versions, config hash). That metadata is how a later step finds "the version a
given logical date produced" without ever reading "latest", and how a re-run recognises work
it already committed.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from tasks.errors import DataError

log = logging.getLogger(__name__)

META_PREFIX = "cd4ml."


class VersionNotFoundError(DataError, LookupError):
    """No table version satisfies the request; the message says what was asked."""


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


def read(uri: str, version: int, columns: Iterable[str] | None = None, filter: Any = None) -> pa.Table:
    """Read one explicit version (time travel); never implicitly the newest."""
    cols = list(columns) if columns is not None else None
    return open_table(uri, version).to_pyarrow_table(columns=cols, filters=filter)


def history(uri: str) -> list[Commit]:
    """Commits newest first, with the pipeline's own metadata split out."""
    commits = []
    for h in open_table(uri).history():
        meta = {k[len(META_PREFIX):]: str(v) for k, v in h.items() if k.startswith(META_PREFIX)}
        commits.append(Commit(int(h["version"]), str(h.get("operation", "")), int(h.get("timestamp", 0)), meta))
    return sorted(commits, key=lambda c: c.version, reverse=True)


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


def _with_retry(op, what: str, attempts: int = 8):
    """Retry a commit that lost an optimistic-concurrency race; re-planned from the new state."""
    for attempt in range(1, attempts + 1):
        try:
            return op()
        except CommitFailedError as exc:
            if attempt == attempts:
                raise
            delay = min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())
            log.warning("%s: commit conflict (%s), retry %d/%d in %.2fs", what, exc, attempt, attempts, delay)
            time.sleep(delay)


def _props(metadata: dict[str, Any]) -> CommitProperties:
    return CommitProperties(custom_metadata={META_PREFIX + k: str(v) for k, v in metadata.items()})


def merge_new_rows(
    uri: str,
    rows: pa.Table,
    key: str | list[str],
    metadata: dict[str, Any],
    configuration: dict[str, str] | None = None,
) -> tuple[int | None, int]:
    """Insert the rows whose key is not in the table yet (MERGE ... WHEN NOT MATCHED INSERT).

    Returns (version, inserted). A batch with nothing new commits nothing and returns
    (None, 0), so re-runs leave the table's version history untouched.
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
            .merge(rows, predicate=predicate, source_alias="s", target_alias="t", commit_properties=_props(metadata))
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


def stats_columns_config(schema: pa.Schema) -> dict[str, str]:
    """Keep binary columns out of Delta column statistics (min/max of image bytes is waste)."""
    cols = [f.name for f in schema if not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))]
    return {"delta.dataSkippingStatsColumns": ",".join(cols)}
