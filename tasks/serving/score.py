"""Batch scoring: a folder or fsspec URL of unlabelled images -> the ``predictions`` Delta table.

``score(settings, source, run_id=..., logical_date=...)`` runs in named phases:

The source's URI scheme must be one ``serving.allowed_schemes`` allows (local paths by default;
``tasks.data.inputs``): anything else is refused before it is opened.

1. **champion**: ``models:/<name>@champion`` of the environment, pinned to its version before
   any image is read (no champion: ``NoChampionError``, nothing read or written; a source that
   does not exist or holds no file is ``NothingToScoreError`` first, which a scheduled run skips);
2. **known**: the (source_uri, sha256) pairs this model version already scored: a re-run, a
   retried task or a backfill scores each image once per model version, never twice;
3. **stream**: the source's files in a stable order, ``serving.batch_size`` at a time: read
   (a file above ``ingest.max_file_bytes`` is ``file_too_large``, unread; a name that is not
   UTF-8 is ``undecodable_name``), hash, screen with ingest's own header rules (``tasks.data.images.screen``: empty, not an
   image, too many pixels, animated, unsupported mode, too small or large), then the model's own
   bundled preprocessing and network; a body that fails to decode is ``corrupt_image``;
4. **commit**: every ``serving.commit_every`` predictions are one Delta commit (bounded memory:
   ``lake.append_stream`` writes row groups as they come), so a killed run keeps what it
   committed and the retry scores only the rest; quarantined files are rows of
   ``scoring_rejects`` with their reason (merged by reject id: a re-run adds nothing).

A row of ``predictions``: image key (sha256 of the bytes), source URI, model name and version,
label, confidence, every class probability (``probabilities`` in the order of ``classes``),
the run's logical date, when it was scored, the Airflow (or CLI) run id.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.data import lake
from tasks.data.admission import read_bounded
from tasks.data.images import Rejection, screen
from tasks.data.sources import Entry, LandingNotFoundError, Source, open_source
from tasks.errors import DataError
from tasks.models.champion import ServingModel, serving_model
from tasks.settings import Settings

log = logging.getLogger(__name__)

PREDICTIONS_SCHEMA = pa.schema([
    pa.field("image_key", pa.string(), nullable=False),  # sha256 of the file's bytes
    pa.field("source_uri", pa.string(), nullable=False),
    pa.field("model_name", pa.string(), nullable=False),
    pa.field("model_version", pa.int64(), nullable=False),
    pa.field("label", pa.string(), nullable=False),
    pa.field("confidence", pa.float64(), nullable=False),
    pa.field("classes", pa.list_(pa.string()), nullable=False),
    pa.field("probabilities", pa.list_(pa.float32()), nullable=False),
    pa.field("logical_date", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("scored_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
])

SCORING_REJECTS_SCHEMA = pa.schema([
    pa.field("reject_id", pa.string(), nullable=False),
    pa.field("source_uri", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=True),  # null: the file could not be read
    pa.field("reason_code", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("model_name", pa.string(), nullable=False),
    pa.field("model_version", pa.int64(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("logical_date", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("rejected_at", pa.timestamp("us", tz="UTC"), nullable=False),
])
SCORING_REJECTS_TABLE = "scoring_rejects"


class NothingToScoreError(DataError, FileNotFoundError):
    """The source does not exist or holds no file: a scheduled run skips, a person gets this line."""


@dataclass(frozen=True)
class ScoreResult:
    env: str
    source_uri: str
    model_name: str
    model_version: int
    predictions_table: str
    rejects_table: str
    files_seen: int
    scored: int  # new prediction rows this run
    already_scored: int  # skipped: this model version scored them before
    quarantined: int
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)  # predictions commits of this run
    run_id: str = ""
    logical_date: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Batch:
    """One batch's outcome: prediction columns for the new images, rejects for the bad ones."""

    keys: list[str] = field(default_factory=list)
    uris: list[str] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)
    rejects: list[tuple[Entry, str | None, Rejection]] = field(default_factory=list)
    known: int = 0


def _as_timestamp(logical_date: str | datetime) -> datetime:
    """The run's logical date as a UTC timestamp (second precision, as commit metadata has it)."""
    return datetime.fromisoformat(lake.normalise_logical_date(logical_date))


def known_pairs(uri: str, model: ServingModel, source_uris: Sequence[str]) -> set[tuple[str, str]]:
    """(source_uri, image_key) of these files this model version has a prediction for.

    Only the chunk's own files are looked up, so memory follows the chunk, not the table.
    """
    if not lake.exists(uri) or not source_uris:
        return set()
    table = lake.open_table(uri)
    rows = lake.scan(table, columns=["source_uri", "image_key"],
                     filters=[("model_name", "=", model.name), ("model_version", "=", model.version),
                              ("source_uri", "in", list(source_uris))])
    return set(zip(rows.column("source_uri").to_pylist(), rows.column("image_key").to_pylist()))


def _predict_each(predictor: Any, images: list[bytes]) -> list[np.ndarray | Rejection]:
    """Per-image fallback when a batch holds an image the model cannot decode: find which, keep the rest."""
    out: list[np.ndarray | Rejection] = []
    for data in images:
        try:
            out.append(predictor.predict_proba([data])[0])
        except ValueError as exc:  # the runtime's ImageDecodeError (a ValueError, from the model's own copy)
            out.append(Rejection("corrupt_image", f"decode failed (truncated or damaged): {exc}"))
    return out


@dataclass
class _Read:
    """One batch read, hashed and screened (the part that overlaps the model's work on the previous batch)."""

    images: list[bytes] = field(default_factory=list)
    pending: list[tuple[Entry, str]] = field(default_factory=list)
    rejects: list[tuple[Entry, str | None, Rejection]] = field(default_factory=list)
    known: int = 0


def _read_batch(source: Source, entries: Sequence[Entry], known: set[tuple[str, str]], settings: Settings) -> _Read:
    """Read, hash and screen one batch of files (phase 3 of the module doc, before the model)."""
    ing, read = settings.ingest, _Read()
    keep, convert = frozenset(ing.keep_modes), frozenset(ing.convert_modes)
    for entry in entries:
        if entry.problem is not None:
            read.rejects.append((entry, None, entry.problem))
            continue
        data = read_bounded(source, entry, ing.max_file_bytes)
        if isinstance(data, Rejection):
            read.rejects.append((entry, None, data))
            continue
        key = hashlib.sha256(data).hexdigest()
        if (entry.uri, key) in known:
            read.known += 1
            continue
        problem = screen(data, min_side=ing.min_side, max_side=ing.max_side, max_pixels=ing.max_pixels,
                         keep_modes=keep, convert_modes=convert)
        if problem is not None:
            read.rejects.append((entry, key, problem))
            continue
        read.images.append(data)
        read.pending.append((entry, key))
    return read


def _predict_batch(predictor: Any, read: _Read, decoded: tuple[np.ndarray, dict[int, str]] | None = None) -> _Batch:
    """The model's own preprocessing and network on the screened images of one batch.

    ``decoded`` = (pixels of the images that decoded, {position: error}) from a decode worker;
    without it the predictor decodes here.
    """
    batch = _Batch(rejects=list(read.rejects), known=read.known)
    if not read.images:
        return batch
    outcomes: list[np.ndarray | Rejection]
    if decoded is not None:
        pixels, bad = decoded
        probs = iter(predictor.proba_of_pixels(pixels)) if len(pixels) else iter(())
        outcomes = [Rejection("corrupt_image", f"decode failed (truncated or damaged): {bad[i]}") if i in bad
                    else next(probs) for i in range(len(read.images))]
    else:
        try:
            outcomes = list(predictor.predict_proba(read.images))
        except ValueError:
            outcomes = _predict_each(predictor, read.images)
    for (entry, key), outcome in zip(read.pending, outcomes):
        if isinstance(outcome, Rejection):
            batch.rejects.append((entry, key, outcome))
        else:
            batch.keys.append(key)
            batch.uris.append(entry.uri)
            batch.probs.append(outcome)
    return batch


def _scored_batches(source: Source, predictor: Any, entries: Sequence[Entry], known: set[tuple[str, str]],
                    settings: Settings, decoder: Any = None) -> Iterator[_Batch]:
    """Batches in order. With a decode worker (``decoder``), a pipeline of three stages.

    The worker decodes batch i while this process reads, hashes and screens batch i+1 and runs the
    network on batch i-1: Pillow's decode, most of the cost for small images, leaves this process.
    Without one, each batch is read, screened and predicted here in turn (a reader thread was
    measured at 0.58x the bare loop: reading, screening and Pillow all hold the GIL).
    """
    size = settings.serving.batch_size
    chunks = [entries[start:start + size] for start in range(0, len(entries), size)]
    if decoder is None:
        for chunk in chunks:
            yield _predict_batch(predictor, _read_batch(source, chunk, known, settings))
        return
    from tasks.serving import decode_worker

    spec = predictor.spec.to_dict()
    pending = None  # (read, future) of the batch being decoded
    for chunk in chunks:
        read = _read_batch(source, chunk, known, settings)
        future = decoder.submit(decode_worker.decode, read.images, spec) if read.images else None
        if pending is not None:
            yield _predict_batch(predictor, pending[0], decoder.result(pending[1]))
        pending = (read, future)
    if pending is not None:
        yield _predict_batch(predictor, pending[0], decoder.result(pending[1]))


class _LazyPool:
    """A one-process decode pool started at the first image to decode (a re-run of known files starts nothing)."""

    def __init__(self, workers: int, runtime_dir: Path) -> None:
        self.workers, self.runtime_dir, self.pool, self.broken = workers, runtime_dir, None, False

    def submit(self, fn: Any, *args: Any) -> Any:
        if self.broken:
            return None
        if self.pool is None:
            from tasks.serving import decode_worker
            from tasks.worker_pool import spawn_pool

            self.pool = spawn_pool(self.workers, initializer=decode_worker.init, initargs=(str(self.runtime_dir),))
        return self.pool.submit(fn, *args)

    def result(self, future: Any) -> tuple[np.ndarray, dict[int, str]] | None:
        """The worker's pixels, or None (the batch is decoded in process) when the worker died."""
        from concurrent.futures.process import BrokenProcessPool

        if future is None:
            return None
        try:
            return future.result()
        except BrokenProcessPool as exc:
            log.warning("the decode worker died (%s): decoding in this process from here on", exc)
            self.broken = True
            return None

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def decoder_for(settings: Settings, predictor: Any, runtime_dir: Path, files: int) -> Iterator[_LazyPool | None]:
    """A decode pool when it pays (``serving.decode_workers``, enough files, a runtime that can), else None."""
    workers = settings.serving.decode_workers
    if workers == 0 or files < settings.serving.decode_min_files or not hasattr(predictor, "proba_of_pixels"):
        yield None
        return
    import os

    import torch

    threads = torch.get_num_threads()  # the decode workers take their cores from torch's intra-op threads:
    torch.set_num_threads(max(1, min(threads, (os.cpu_count() or 1) - workers)))  # 2 cores, 2 threads + 1 worker: 0.75x
    pool = _LazyPool(workers, runtime_dir)
    try:
        yield pool
    finally:
        pool.shutdown()
        torch.set_num_threads(threads)


def _record_batch(batch: _Batch, model: ServingModel, classes: list[str], run_id: str, when: datetime,
                  scored_at: datetime) -> pa.RecordBatch:
    probs = np.stack(batch.probs).astype(np.float32)
    top = probs.argmax(axis=1)
    n, k = probs.shape
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32))  # every row holds k classes / probabilities
    return pa.RecordBatch.from_arrays([
        pa.array(batch.keys, pa.string()),
        pa.array(batch.uris, pa.string()),
        pa.array([model.name] * n, pa.string()),
        pa.array([model.version] * n, pa.int64()),
        pa.array([classes[i] for i in top.tolist()], pa.string()),
        pa.array(probs[np.arange(n), top].astype(np.float64), pa.float64()),
        pa.ListArray.from_arrays(offsets, pa.array(classes, pa.string()).take(pa.array(np.tile(np.arange(k), n)))),
        pa.ListArray.from_arrays(offsets, pa.array(probs.ravel())),
        pa.array([when] * n, pa.timestamp("us", tz="UTC")),
        pa.array([scored_at] * n, pa.timestamp("us", tz="UTC")),
        pa.array([run_id] * n, pa.string()),
    ], schema=PREDICTIONS_SCHEMA)


def _reject_rows(rejects: list[tuple[Entry, str | None, Rejection]], model: ServingModel, run_id: str,
                 when: datetime, now: datetime) -> list[dict[str, Any]]:
    return [{
        "reject_id": hashlib.sha256(f"{entry.uri}\0{sha or ''}\0{problem.code}".encode()).hexdigest(),
        "source_uri": entry.uri, "sha256": sha, "reason_code": problem.code, "reason": problem.detail,
        "model_name": model.name, "model_version": model.version, "run_id": run_id,
        "logical_date": when, "rejected_at": now,
    } for entry, sha, problem in rejects]


def _commit_chunk(settings: Settings, source: Source, predictor: Any, model: ServingModel, entries: list[Entry],
                  run_id: str, when: datetime, totals: dict[str, Any], decoder: Any = None) -> None:
    """Score one chunk of files into one predictions commit (re-planned from the table if a writer raced it)."""
    uri = settings.predictions_table

    def attempt(_: int) -> tuple[int | None, int]:
        table = lake.open_table(uri) if lake.exists(uri) else None
        known = known_pairs(uri, model, [entry.uri for entry in entries])
        totals["chunk"] = {"known": 0, "rejects": []}

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in _scored_batches(source, predictor, entries, known, settings, decoder):
                totals["chunk"]["known"] += batch.known
                totals["chunk"]["rejects"] += batch.rejects
                if batch.keys:
                    yield _record_batch(batch, model, predictor.classes, run_id, when, datetime.now(UTC))

        reader = pa.RecordBatchReader.from_batches(PREDICTIONS_SCHEMA, batches())
        return lake.append_stream(uri, reader, {"run_id": run_id, "step": "score", "model_version": model.version,
                                                "logical_date": when.isoformat()}, table)

    version, rows = lake.retry_on_conflict(attempt, f"score into {uri}")
    chunk = totals.pop("chunk")
    totals["scored"] += rows
    totals["already_scored"] += chunk["known"]
    if version is not None:
        totals["versions"].append(version)
    if chunk["rejects"]:
        rows_ = _reject_rows(chunk["rejects"], model, run_id, when, datetime.now(UTC))
        lake.merge_new_rows(settings.table_uri(SCORING_REJECTS_TABLE),
                            pa.Table.from_pylist(rows_, schema=SCORING_REJECTS_SCHEMA), "reject_id",
                            {"run_id": run_id, "step": "score"})
        for row in rows_:
            totals["rejected"][row["reason_code"]] = totals["rejected"].get(row["reason_code"], 0) + 1
            log.warning("quarantined %s: %s (%s)", row["source_uri"], row["reason_code"], row["reason"])


def score(settings: Settings, source: str, *, run_id: str, logical_date: str | datetime) -> ScoreResult:
    """Score every image under ``source`` with the environment's champion (module doc), reading the
    registry as its read-only account where one is configured (``tasks.models.identity``)."""
    from tasks.models.identity import as_reader

    with as_reader():
        return _score(settings, source, run_id=run_id, logical_date=logical_date)


def _score(settings: Settings, source: str, *, run_id: str, logical_date: str | datetime) -> ScoreResult:
    from tasks.models.loading import opened_predictor

    started = time.monotonic()
    try:
        files = open_source(source, allowed_schemes=settings.serving.allowed_schemes, schemes_key="serving.allowed_schemes")
    except LandingNotFoundError as exc:
        raise NothingToScoreError(f"nothing to score: {exc}") from exc
    entries = files.entries()
    first = list(itertools.islice(entries, 1))
    if not first:
        raise NothingToScoreError(f"nothing to score: {files.root_uri} holds no files")
    model = serving_model(settings)  # 1. champion, before any image is read
    when = _as_timestamp(logical_date)
    totals: dict[str, Any] = {"scored": 0, "already_scored": 0, "rejected": {}, "versions": [], "seen": 0}
    entries = itertools.chain(first, entries)
    chunk = list(itertools.islice(entries, settings.serving.commit_every))
    # the model's own bundled preprocessing and network; a decode worker imports the same runtime folder
    with opened_predictor(settings, model.uri) as (predictor, runtime_dir), \
            decoder_for(settings, predictor, runtime_dir, len(chunk)) as decoder:
        while chunk:  # 2-4, a commit per chunk
            totals["seen"] += len(chunk)
            _commit_chunk(settings, files, predictor, model, chunk, run_id, when, totals, decoder)
            log.info("scored %d of %d files so far with %s", totals["scored"], totals["seen"], model.uri)
            chunk = list(itertools.islice(entries, settings.serving.commit_every))
    result = ScoreResult(
        env=settings.env, source_uri=files.root_uri, model_name=model.name, model_version=model.version,
        predictions_table=settings.predictions_table, rejects_table=settings.table_uri(SCORING_REJECTS_TABLE),
        files_seen=totals["seen"], scored=totals["scored"], already_scored=totals["already_scored"],
        quarantined=sum(totals["rejected"].values()), rejected_by_reason=dict(sorted(totals["rejected"].items())),
        versions=totals["versions"], run_id=run_id, logical_date=when.isoformat(),
        seconds=round(time.monotonic() - started, 3),
    )
    log.info("scoring done: %s", result.to_dict())
    return result


def predictions_of(settings: Settings, model: ServingModel, *, since: datetime | None = None,
                   until: datetime | None = None, columns: Sequence[str] | None = None) -> pa.Table:
    """One model version's predictions whose scoring run's logical date is in [since, until]."""
    uri = settings.predictions_table
    cols = list(columns) if columns is not None else PREDICTIONS_SCHEMA.names
    if not lake.exists(uri):
        return PREDICTIONS_SCHEMA.empty_table().select(cols)
    filters: list[tuple[str, str, Any]] = [("model_name", "=", model.name), ("model_version", "=", model.version)]
    if since is not None:
        filters.append(("logical_date", ">=", since))
    if until is not None:
        filters.append(("logical_date", "<=", until))
    rows = lake.scan(lake.open_table(uri), columns=cols, filters=filters)
    if "source_uri" in cols and "image_key" in cols:  # the table's order is commit order; make it stable
        rows = rows.sort_by([("source_uri", "ascending"), ("image_key", "ascending")])
    return rows


__all__ = ["NothingToScoreError", "PREDICTIONS_SCHEMA", "SCORING_REJECTS_SCHEMA", "ScoreResult", "known_pairs", "predictions_of", "score"]
