"""
### cd4ml_ingest: images -> versioned `raw_images` Delta table -> validation

1. **ingest**: every file of the source (a local path or an fsspec URL; labels from folder
   names or a CSV/JSONL manifest) is hashed (sha256 of the bytes), fully decoded and checked;
   unchanged files are skipped without being read, and a zone whose whole listing is unchanged
   since it was last decided costs its listing alone (Param `full_recheck` re-reads all). New
   images land in `raw_images` in one Delta commit per run (the dataset version); bad files
   go to the `rejects` table with a reason. An empty source skips the run with a message and
   writes no version.
2. **validate**: a great-expectations suite over that raw version; thresholds come from the
   environment's settings. Only a passing version is named (Param `dataset_version_name`)
   and published on the `raw_images` Asset, which triggers `cd4ml_curate`.

Runs on `ingest.schedule` and on the monitor's `retrain_request` Asset event (the labelled live
images it copied into the landing zone are the new data).
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import RAW_IMAGES, RETRAIN_REQUEST
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors, logical_date_of
from cd4ml_airflow.defaults import cron_or_asset, dag_kwargs
from cd4ml_airflow.notifier import alert_from_context

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
    @task
    def ingest(**context) -> dict:
        """Hash, decode and MERGE new images; quarantine bad files."""
        from airflow.sdk.exceptions import AirflowSkipException

        from tasks.data.ingest import EmptyLandingError, ingest_landing
        from tasks.settings import load_settings

        p = context["params"]
        settings = load_settings()
        check_run_params(context, settings)
        try:
            with fail_fast_on_data_errors():  # a wrong path, manifest or engine will not fix itself
                result = ingest_landing(
                    settings,
                    run_id=context["run_id"],
                    logical_date=logical_date_of(context),
                    landing=p["source_uri"],
                    label_source=p["label_source"],
                    manifest=p["manifest_uri"],
                    engine=p["engine"],
                    full=p["full_recheck"],
                )
        except EmptyLandingError as exc:
            raise AirflowSkipException(str(exc)) from exc
        print(f"ingest: {result.inserted} new, {result.already_present} already present, {result.rejected} rejected "
              f"(rejects table {result.rejects_table}); raw_images v{result.raw_version}")
        return result.to_dict()

    @task(outlets=[RAW_IMAGES])
    def validate(batch: dict, *, outlet_events=None, **context) -> dict:
        """great-expectations suite on the raw version; publishes (and names) it only when it passes."""
        from tasks.alerting.alert import first_line
        from tasks.alerting.delivery import send
        from tasks.data import lake
        from tasks.data.validate import ValidationFailedError, validate_batch
        from tasks.settings import load_settings

        settings = load_settings()
        name = context["params"]["dataset_version_name"]
        with fail_fast_on_data_errors():
            try:
                result = validate_batch(
                    settings,
                    raw_version=batch["raw_version"],
                    files_seen=batch["files_seen"],
                    rejected=batch["rejected"],
                    run_id=context["run_id"],
                )
            except ValidationFailedError as exc:  # the run's incident, with the failed checks and report
                send(alert_from_context(
                    context, settings, settings.env, kind="validation_failed", severity="critical",
                    summary=f"raw_images v{batch['raw_version']} failed validation: {len(exc.failures)} check(s)",
                    error=first_line(exc), details={"report": exc.report_path, "failures": exc.failures[:10]}),
                    settings)
                raise
            if name:
                lake.tag_version(settings.raw_table, batch["raw_version"], name, run_id=context["run_id"])
        print(f"validation report: {result.report_path}  data docs: {result.docs_path}")
        outlet_events[RAW_IMAGES].extra = {
            "raw_table": batch["raw_table"], "raw_version": batch["raw_version"], "name": name,
        }
        return result.to_dict()

    validate(ingest())


cd4ml_ingest()
