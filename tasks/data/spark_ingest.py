"""The same ingestion as a Spark job writing Delta through delta-spark, for zones that outgrow one machine.

Chosen by ``ingest.engine: spark`` (or ``ingest_landing(..., engine="spark")``). Same inputs,
same rules, same tables, same ``IngestResult``:

* Listing and listing-level quarantine run on the driver with ``tasks.data.sources`` (paths, labels,
  manifests, symlinks, traversal: identical code). For millions of objects give a manifest.
* Reading, hashing, decoding and normalising run on the executors, through the very function
  the local engine uses (``tasks.data.images.prepare_image``) inside ``process_partition``; files
  are opened by their fsspec URL, so executors need the same fsspec extras and credentials.
* The admission rules and reject rows are the local engine's own (``tasks.data.admission``);
  label conflicts, duplicate copies and "already in the table" are Spark joins and windows; new rows go in with one delta-spark MERGE (WHEN NOT MATCHED
  INSERT), rejects with another, retried after a concurrent-commit exception. The pipeline's
  ``cd4ml.*`` commit metadata goes into ``userMetadata`` (JSON), which ``lake.history`` reads,
  so ``version_as_of``, tags and time travel work on Spark-written versions too.
* Not here: the incremental manifest (every Spark run re-reads its zone; it is the bulk path).

Requirements: ``pip install -r requirements-spark.txt`` (pyspark + delta-spark) and the Delta
Lake jars on Spark's classpath, e.g. ``ingest.spark_conf: {spark.jars.packages:
io.delta:delta-spark_2.13:<version>}`` where Maven is reachable, or ``spark.jars`` pointing at
local jar files, or a cluster image that ships them. On a cluster the executors also need this
repository's ``tasks`` package (``spark-submit --py-files``). Missing pyspark, and missing Delta
classes, each stop the job before any work with ``SparkUnavailableError`` saying what to do.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from tasks.data import admission, lake
from tasks.data.admission import RAW_SCHEMA, REJECT_SCHEMA, IngestResult
from tasks.data.images import Rejection
from tasks.data.sources import Source, too_large
from tasks.errors import DataError
from tasks.settings import Settings

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install -r requirements-spark.txt"
DELTA_CLASS = "io.delta.tables.DeltaTable"


class SparkUnavailableError(DataError, RuntimeError):
    """The Spark engine cannot run here (pyspark or the Delta jars are missing); the message says how to fix it."""


def require_pyspark() -> Any:
    """The pyspark module, or a clear error naming the requirements file."""
    try:
        import pyspark
        from pyspark.sql import SparkSession  # noqa: F401
    except ImportError as exc:
        raise SparkUnavailableError(
            f"ingest.engine is 'spark' but pyspark is not installed ({exc}); install it with `{INSTALL_HINT}` "
            "(pyspark + delta-spark, Java 17), or set ingest.engine: local"
        ) from exc
    return pyspark


def check_delta_jars(spark: Any) -> None:
    """Fail clearly when the delta-spark classes are not on the session's classpath."""
    jvm = spark._jvm
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)
    except Exception as exc:  # py4j wraps ClassNotFoundException
        raise SparkUnavailableError(
            f"the Delta Lake jars are not on Spark's classpath ({DELTA_CLASS} not found): the delta-spark Python "
            "package does not ship them. Set ingest.spark_conf to {'spark.jars.packages': "
            "'io.delta:delta-spark_2.13:<version matching delta-spark>'} where Maven is reachable, or "
            "{'spark.jars': '/path/delta-spark_2.13-<v>.jar,/path/delta-storage-<v>.jar'}, or run on a cluster "
            "image with Delta installed"
        ) from exc


def spark_session(settings: Settings) -> Any:
    """A Spark session with the Delta extension configured and its jars verified."""
    require_pyspark()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.ingest.spark_master)
        .appName(f"cd4ml-ingest-{settings.env}")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", "false")
    )
    if settings.ingest.spark_master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # local executors: this very environment
    for key, value in settings.ingest.spark_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    check_delta_jars(spark)
    return spark


def _read(uri: str, path: str) -> bytes:
    if uri.startswith("file://") and path:
        with open(path, "rb") as fh:
            return fh.read()
    import fsspec

    with fsspec.open(uri, "rb") as fh:
        return fh.read()


def process_partition(rows: Iterable[Any], cfg: dict[str, Any]) -> Iterator[tuple]:
    """Executor side: (seq, uri, path, label) -> one result tuple per file (``RESULT_FIELDS``).

    ``cfg`` is ``admission.image_rules``. Plain Python over plain values, so it is tested without
    Spark and is the local engine's rules by construction (``admission.examine``).
    """
    for row in rows:
        seq, uri, path, label = row[0], row[1], row[2], row[3]
        try:
            data = _read(uri, path)
        except OSError as exc:
            problem = admission.unreadable(exc)
            yield (seq, uri, label, None, None, None, None, None, None, None, None, None, problem.code, problem.detail)
            continue
        sha, info = admission.examine(data, cfg)
        if isinstance(info, Rejection):
            yield (seq, uri, label, sha, None, None, None, None, None, None, None, None, info.code, info.detail)
        else:
            yield (seq, uri, label, sha, info.data, info.width, info.height, info.format, info.mode,
                   info.source_format, info.source_mode, info.normalised, None, None)


RESULT_FIELDS = ("seq", "source_uri", "label", "sha256", "image", "width", "height", "format", "mode",
                 "source_format", "source_mode", "normalised", "reason_code", "reason")


def _result_schema() -> Any:
    from pyspark.sql import types as T

    s, i = T.StringType(), T.IntegerType()
    return T.StructType([
        T.StructField("seq", T.LongType(), False), T.StructField("source_uri", s, False), T.StructField("label", s),
        T.StructField("sha256", s), T.StructField("image", T.BinaryType()), T.StructField("width", i),
        T.StructField("height", i), T.StructField("format", s), T.StructField("mode", s),
        T.StructField("source_format", s), T.StructField("source_mode", s), T.StructField("normalised", s),
        T.StructField("reason_code", s), T.StructField("reason", s),
    ])


def _is_conflict(exc: Exception) -> bool:
    return "Concurrent" in type(exc).__name__ or "ConcurrentAppend" in str(exc) or "ConcurrentModification" in str(exc)



@dataclass
class _SparkRun:
    """What every phase of one Spark ingest run shares: its identity, its source, its rejects so far."""

    settings: Settings
    run_id: str
    logical: str
    now: datetime  # a record of when, not an input to any decision
    source: Source
    label_source: str
    rejects: list[dict] = field(default_factory=list)

    def reject(self, source_uri: str, sha: str | None, label: str | None, problem: Rejection) -> dict:
        return admission.reject_row(source_uri, sha, label, problem.code, problem.detail, self.run_id, self.logical,
                                    self.now)


def ingest_with_spark(
    settings: Settings,
    run_id: str,
    logical_date: str | datetime,
    landing: str | Path | None = None,
    *,
    label_source: str = "folders",
    manifest: str | None = None,
) -> IngestResult:
    """``ingest_landing`` as a Spark job (module doc); returns the same ``IngestResult``.

    Phases: admit the listing (driver), decode (executors), plan and commit, record the rejects.
    """
    require_pyspark()  # before any listing: a missing engine is a configuration error, said at once
    from pyspark.sql import functions as F

    started = time.perf_counter()
    landing_uri = str(landing or settings.storage.landing_uri)
    source = admission.open_landing(landing_uri, label_source, manifest, settings.ingest)
    spark = spark_session(settings)
    run = _SparkRun(settings, run_id, lake.normalise_logical_date(logical_date), datetime.now(UTC), source,
                    label_source)
    candidates, files_seen = _admit_listing(run)
    if files_seen == 0:
        raise admission.no_files(landing_uri)
    results = _decode(spark, run, candidates)
    metadata = {f"{lake.META_PREFIX}{k}": v for k, v in
                {"run_id": run_id, "logical_date": run.logical, "step": "ingest", "source": source.root_uri,
                 "label_source": label_source, "engine": "spark"}.items()}
    inserted, already_present, attempts, conflicts = _commit(spark, run, results.where(F.col("reason_code").isNull()),
                                                             metadata)
    run.rejects += conflicts
    results.unpersist()

    raw_uri, rejects_uri = settings.raw_table, settings.rejects_table
    if run.rejects:  # small: the rejects table goes through the same helper as the local engine
        lake.merge_new_rows(rejects_uri, pa.Table.from_pylist(run.rejects, schema=REJECT_SCHEMA), "reject_id",
                            {k[len(lake.META_PREFIX):]: v for k, v in metadata.items()})
    raw_version = lake.current_version(raw_uri)
    if raw_version is None:
        raise admission.all_rejected(landing_uri, files_seen, rejects_uri)
    return IngestResult(
        raw_table=raw_uri, raw_version=raw_version, committed=inserted > 0, files_seen=files_seen,
        inserted=inserted, already_present=already_present, rejected=len(run.rejects), rejects_table=rejects_uri,
        run_id=run_id, logical_date=run.logical, source_uri=source.root_uri, label_source=label_source,
        engine="spark", files_read=len(candidates), unchanged_skipped=0, commit_attempts=attempts,
        seconds=round(time.perf_counter() - started, 3),
    )


def _admit_listing(run: _SparkRun) -> tuple[list[tuple], int]:
    """Driver side, admission rules 1-2: (candidates as (seq, uri, path, label), files listed)."""
    cfg = run.settings.ingest
    allowed, extensions = admission.allowed_labels(cfg), admission.image_extensions(cfg)
    candidates: list[tuple] = []
    files_seen = 0
    for seq, entry in enumerate(run.source.entries()):
        files_seen += 1
        problem = entry.problem
        if problem is None:
            problem = admission.listing_problem(entry.uri, entry.label, allowed, extensions)
        if problem is None:  # from the listed size: the executors never open a file above the limit
            problem = too_large(entry, cfg.max_file_bytes)
        if problem is not None:
            run.rejects.append(run.reject(entry.uri, None, entry.label, problem))
        else:
            candidates.append((seq, entry.uri, entry.path, entry.label))
    return candidates, files_seen


def _decode(spark: Any, run: _SparkRun, candidates: list[tuple]) -> Any:
    """Executor side, admission rule 3 (``process_partition``); content rejects join the run's rejects.

    Returns the cached results DataFrame (``RESULT_FIELDS``); the caller unpersists it.
    """
    from pyspark.sql import functions as F

    cfg = run.settings.ingest
    conf = admission.image_rules(cfg)
    partitions = max(1, min(len(candidates) // max(cfg.batch_size, 1) + 1, spark.sparkContext.defaultParallelism * 4))
    results = (
        spark.sparkContext.parallelize(candidates, partitions)
        .mapPartitions(lambda rows: process_partition(rows, conf))
        .toDF(_result_schema())
        .cache()
    )
    failed = results.where(F.col("reason_code").isNotNull()).select("source_uri", "sha256", "label", "reason_code",
                                                                    "reason")
    for r in failed.collect():
        run.rejects.append(run.reject(r.source_uri, r.sha256, r.label, Rejection(r.reason_code, r.reason)))
    return results


def _commit(spark: Any, run: _SparkRun, ok: Any, metadata: dict[str, str]) -> tuple[int, int, int, list[dict]]:
    """The new rows in ONE commit (a write, or a MERGE that inserts only unknown keys), re-planned after a race.

    Returns (rows inserted, copies already present, attempts, label-conflict rejects of the committed plan).
    """
    from delta.tables import DeltaTable as SparkDelta

    cfg, raw_uri = run.settings.ingest, run.settings.raw_table
    attempts, conflicts = 0, []
    for attempts in range(1, cfg.commit_retries + 1):
        exists = lake.exists(raw_uri)
        new_rows, present, conflicts = _plan(spark, run, ok, exists)
        count = new_rows.count()
        log.info("spark ingest plan (attempt %d): %d new rows, %d already present, %d label conflicts, %d other rejects",
                 attempts, count, present, len(conflicts), len(run.rejects))
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(metadata))
        try:
            if count and not exists:
                (new_rows.write.format("delta").mode("errorifexists")
                 .option("delta.dataSkippingStatsColumns", ",".join(c for c in new_rows.columns if c != "image"))
                 .save(raw_uri))
            elif count:
                (SparkDelta.forPath(spark, raw_uri).alias("t").merge(new_rows.alias("s"), "t.sha256 = s.sha256")
                 .whenNotMatchedInsertAll().execute())
            return count, present, attempts, conflicts
        except Exception as exc:
            if attempts == cfg.commit_retries or not (_is_conflict(exc) or (not exists and lake.exists(raw_uri))):
                raise
            log.warning("spark ingest: concurrent commit on %s (%s); re-planning %d/%d", raw_uri, exc, attempts,
                        cfg.commit_retries)
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    return 0, 0, attempts, conflicts


def _plan(spark: Any, run: _SparkRun, ok: Any, exists: bool) -> tuple[Any, int, list[dict]]:
    """Admission rule 4 against the table and within the batch: (rows to insert, copies present, conflicts)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if exists:
        known = spark.read.format("delta").load(run.settings.raw_table).select(
            "sha256", F.col("label").alias("known_label"))
        joined = ok.join(known, "sha256", "left")
    else:
        joined = ok.withColumn("known_label", F.lit(None).cast("string"))
    clash = joined.where(F.col("known_label").isNotNull() & (F.col("known_label") != F.col("label")))
    conflicts = [run.reject(r.source_uri, r.sha256, r.label, admission.table_conflict(r.known_label))
                 for r in clash.collect()]
    present = joined.where(F.col("known_label") == F.col("label")).count()
    by_sha = Window.partitionBy("sha256")
    fresh = (joined.where(F.col("known_label").isNull())
             .withColumn("labels", F.array_sort(F.collect_set("label").over(by_sha)))
             .withColumn("first_seq", F.min("seq").over(by_sha)))
    for r in fresh.where(F.size("labels") > 1).collect():
        others = [lb for lb in r.labels if lb != r.label]
        conflicts.append(run.reject(r.source_uri, r.sha256, r.label, admission.batch_conflict(others)))
    single = fresh.where(F.size("labels") == 1)
    present += single.where(F.col("seq") != F.col("first_seq")).count()
    new_rows = (single.where(F.col("seq") == F.col("first_seq"))
                .withColumn("ingest_run_id", F.lit(run.run_id)).withColumn("logical_date", F.lit(run.logical))
                .withColumn("ingested_at", F.lit(run.now))
                .select(*RAW_SCHEMA.names))
    return new_rows, present, conflicts
