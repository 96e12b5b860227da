"""The same ingestion as a Spark job writing Delta through delta-spark, for zones that outgrow one machine.

Chosen by ``ingest.engine: spark`` (or ``ingest_landing(..., engine="spark")``). Same inputs,
same rules, same tables, same ``IngestResult``:

* Listing and listing-level quarantine run on the driver with ``tasks.data.sources`` (paths, labels,
  manifests, symlinks, traversal: identical code). For millions of objects give a manifest.
* Reading, hashing, decoding and normalising run on the executors, through the very function
  the local engine uses (``tasks.data.images.prepare_image``) inside ``process_partition``; files
  are opened by their fsspec URL, so executors need the same fsspec extras and credentials.
* Label conflicts, duplicate copies and "already in the table" are Spark joins and windows
  with the local engine's rules; new rows go in with one delta-spark MERGE (WHEN NOT MATCHED
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

import hashlib
import json
import logging
import os
import posixpath
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.data import lake
from tasks.data.images import Rejection, prepare_image
from tasks.data.sources import LandingNotFoundError, open_source
from tasks.errors import DataError
from tasks.settings import Settings

if TYPE_CHECKING:
    from tasks.data.ingest import IngestResult

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

    Plain Python over plain values, so it is tested without Spark and is the local engine's
    rules by construction (``prepare_image``).
    """
    for row in rows:
        seq, uri, path, label = row[0], row[1], row[2], row[3]
        try:
            data = _read(uri, path)
        except OSError as exc:
            yield (seq, uri, label, None, None, None, None, None, None, None, None, None,
                   "unreadable", f"cannot read file: {exc.strerror or exc}")
            continue
        sha = hashlib.sha256(data).hexdigest()
        info = prepare_image(data, min_side=cfg["min_side"], max_side=cfg["max_side"], max_pixels=cfg["max_pixels"],
                             keep_modes=cfg["keep_modes"], convert_modes=cfg["convert_modes"])
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


def ingest_with_spark(
    settings: Settings,
    run_id: str,
    logical_date: str | datetime,
    landing: str | Path | None = None,
    *,
    label_source: str = "folders",
    manifest: str | None = None,
) -> IngestResult:
    """``ingest_landing`` as a Spark job (module doc); returns the same ``IngestResult``."""
    require_pyspark()  # before any listing: a missing engine is a configuration error, said at once
    from tasks.data.ingest import EmptyLandingError, IngestResult, _reject_row

    started = time.perf_counter()
    cfg = settings.ingest
    landing_uri = str(landing or settings.storage.landing_uri)
    try:
        source = open_source(landing_uri, label_source, manifest)  # type: ignore[arg-type]
    except LandingNotFoundError as exc:
        raise FileNotFoundError(str(exc)) from exc
    spark = spark_session(settings)
    from delta.tables import DeltaTable as SparkDelta
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    logical = lake.normalise_logical_date(logical_date)
    now = datetime.now(UTC)
    allowed = None if cfg.allowed_labels == "discover" else set(cfg.allowed_labels)  # discover: validation decides
    extensions = {e.lower() for e in cfg.image_extensions}
    rejects: list[dict] = []
    candidates: list[tuple] = []
    files_seen = 0
    for seq, entry in enumerate(source.entries()):
        files_seen += 1
        ext = posixpath.splitext(entry.uri)[1]
        problem = entry.problem
        if problem is None and entry.label is None:
            problem = Rejection("no_label", "file sits directly in the landing folder; put it under <label>/")
        elif problem is None and allowed is not None and entry.label not in allowed:
            problem = Rejection("unknown_label", f"label {entry.label!r} is not in allowed_labels")
        elif problem is None and ext.lower() not in extensions:
            problem = Rejection("bad_extension", f"extension {ext!r} is not an image extension")
        if problem is not None:
            rejects.append(_reject_row(entry.uri, None, entry.label, problem.code, problem.detail, run_id, logical, now))
        else:
            candidates.append((seq, entry.uri, entry.path, entry.label))
    if files_seen == 0:
        raise EmptyLandingError(f"landing folder {landing_uri} holds no files: nothing to ingest, no new version")

    conf = {k: getattr(cfg, k) for k in ("min_side", "max_side", "max_pixels", "keep_modes", "convert_modes")}
    partitions = max(1, min(len(candidates) // max(cfg.batch_size, 1) + 1, spark.sparkContext.defaultParallelism * 4))
    results = (
        spark.sparkContext.parallelize(candidates, partitions)
        .mapPartitions(lambda rows: process_partition(rows, conf))
        .toDF(_result_schema())
        .cache()
    )
    for r in results.where(F.col("reason_code").isNotNull()).select("source_uri", "sha256", "label", "reason_code", "reason").collect():
        rejects.append(_reject_row(r.source_uri, r.sha256, r.label, r.reason_code, r.reason, run_id, logical, now))
    ok = results.where(F.col("reason_code").isNull())

    raw_uri, rejects_uri = settings.raw_table, settings.rejects_table
    metadata = {f"{lake.META_PREFIX}{k}": v for k, v in
                {"run_id": run_id, "logical_date": logical, "step": "ingest", "source": source.root_uri,
                 "label_source": label_source, "engine": "spark"}.items()}
    inserted = already_present = attempts = 0
    plan_rejects: list[dict] = []
    for attempts in range(1, cfg.commit_retries + 1):
        exists = lake.exists(raw_uri)
        if exists:
            known = spark.read.format("delta").load(raw_uri).select("sha256", F.col("label").alias("known_label"))
            joined = ok.join(known, "sha256", "left")
        else:
            joined = ok.withColumn("known_label", F.lit(None).cast("string"))
        plan_rejects = [
            _reject_row(r.source_uri, r.sha256, r.label, "label_conflict",
                        f"same bytes already ingested with label {r.known_label!r}", run_id, logical, now)
            for r in joined.where(F.col("known_label").isNotNull() & (F.col("known_label") != F.col("label"))).collect()
        ]
        present = joined.where(F.col("known_label") == F.col("label")).count()
        by_sha = Window.partitionBy("sha256")
        fresh = (joined.where(F.col("known_label").isNull())
                 .withColumn("labels", F.array_sort(F.collect_set("label").over(by_sha)))
                 .withColumn("first_seq", F.min("seq").over(by_sha)))
        for r in fresh.where(F.size("labels") > 1).collect():
            others = [lb for lb in r.labels if lb != r.label]
            plan_rejects.append(_reject_row(r.source_uri, r.sha256, r.label, "label_conflict",
                                            f"same bytes also appear under label(s) {others} in this batch",
                                            run_id, logical, now))
        single = fresh.where(F.size("labels") == 1)
        present += single.where(F.col("seq") != F.col("first_seq")).count()
        new_rows = (single.where(F.col("seq") == F.col("first_seq"))
                    .withColumn("ingest_run_id", F.lit(run_id)).withColumn("logical_date", F.lit(logical))
                    .withColumn("ingested_at", F.lit(now))
                    .select("sha256", "image", "width", "height", "format", "mode", "label", "source_uri",
                            "ingest_run_id", "logical_date", "ingested_at", "source_format", "source_mode", "normalised"))
        count = new_rows.count()
        log.info("spark ingest plan (attempt %d): %d new rows, %d already present, %d label conflicts, %d other rejects",
                 attempts, count, present, len(plan_rejects), len(rejects))
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(metadata))
        try:
            if count and not exists:
                (new_rows.write.format("delta").mode("errorifexists")
                 .option("delta.dataSkippingStatsColumns", ",".join(c for c in new_rows.columns if c != "image"))
                 .save(raw_uri))
            elif count:
                (SparkDelta.forPath(spark, raw_uri).alias("t").merge(new_rows.alias("s"), "t.sha256 = s.sha256")
                 .whenNotMatchedInsertAll().execute())
            inserted, already_present = count, present
            break
        except Exception as exc:
            if attempts == cfg.commit_retries or not (_is_conflict(exc) or (not exists and lake.exists(raw_uri))):
                raise
            log.warning("spark ingest: concurrent commit on %s (%s); re-planning %d/%d", raw_uri, exc, attempts,
                        cfg.commit_retries)
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    rejects += plan_rejects
    results.unpersist()

    if rejects:  # small: the rejects table goes through the same helper as the local engine
        import pyarrow as pa

        from tasks.data.ingest import REJECT_SCHEMA

        lake.merge_new_rows(rejects_uri, pa.Table.from_pylist(rejects, schema=REJECT_SCHEMA), "reject_id",
                            {k[len(lake.META_PREFIX):]: v for k, v in metadata.items()})
    raw_version = lake.current_version(raw_uri)
    if raw_version is None:
        raise EmptyLandingError(
            f"landing folder {landing_uri}: all {files_seen} files were rejected (see {rejects_uri}); "
            "no raw table version exists"
        )
    return IngestResult(
        raw_table=raw_uri, raw_version=raw_version, committed=inserted > 0, files_seen=files_seen,
        inserted=inserted, already_present=already_present, rejected=len(rejects), rejects_table=rejects_uri,
        run_id=run_id, logical_date=logical, source_uri=source.root_uri, label_source=label_source, engine="spark",
        files_read=len(candidates), unchanged_skipped=0, commit_attempts=attempts,
        seconds=round(time.perf_counter() - started, 3),
    )
