"""
### cd4ml_ingest: images -> versioned `raw_images` Delta table -> validation

1. **ingest**: every file of the source (a local path or an fsspec URL; labels from folder
   names or a CSV/JSONL manifest) is hashed (sha256 of the bytes), fully decoded and checked;
   unchanged files are skipped without being read, and a zone whose whole listing is unchanged
   since it was last decided costs its listing alone (Param `full_recheck` re-reads all). New
   images land in `raw_images` in one Delta commit per run (the dataset version); bad files
   go to the `rejects` table with a reason. A missing or empty source fails the run at once (a data
   error: no retries, an alert) and writes no version.
2. **validate**: a great-expectations suite over that raw version; thresholds come from the
   environment's settings. Only a passing version is named (Param `dataset_version_name`)
   and published on the `raw_images` Asset, which triggers `cd4ml_curate`.

Runs on `ingest.schedule` and on the monitor's `retrain_request` Asset event (the labelled live
images it copied into the landing zone are the new data).

Task bodies: `plugins/cd4ml_airflow/steps/ingest.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.assets import RETRAIN_REQUEST
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.defaults import cron_or_asset, dag_kwargs
from cd4ml_airflow.steps.ingest import ingest, validate

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@dag(
    schedule=cron_or_asset(SETTINGS.ingest.schedule, RETRAIN_REQUEST),  # the monitor's retrain request too
    params={
        "source_uri": Param(
            None, type=["null", "string"],
            description="Where the images are: a local path or an fsspec URL (s3://, gs://, abfs://, file://). "
            "Empty = the environment's landing_uri.",
        ),
        "label_source": Param(
            None, type=["null", "string"], enum=[None, "folders", "csv", "jsonl"],
            description="folders: label = first folder under the source; csv / jsonl: a manifest with path,label. "
            "Empty = the environment's setting.",
        ),
        "manifest_uri": Param(
            None, type=["null", "string"],
            description="The CSV or JSONL manifest (paths relative to its folder). Needed for csv / jsonl.",
        ),
        "engine": Param(
            None, type=["null", "string"], enum=[None, "local", "spark"],
            description="local: this worker (delta-rs); spark: a Spark job with delta-spark, for clusters.",
        ),
        "full_recheck": Param(
            False, type="boolean",
            description="Open and decide every file again, trusting no incremental state (after a rewrite that "
            "kept a file's size and mtime). Never duplicates rows.",
        ),
        "dataset_version_name": Param(
            None, type=["null", "string"], pattern=NAME_PATTERN,
            description="Name the validated raw version (e.g. release-3); names are immutable.",
        ),
    },
    **dag_kwargs("cd4ml_ingest", ["ingest", "validation"], __doc__),
)
def cd4ml_ingest():
    validate(ingest())


cd4ml_ingest()
