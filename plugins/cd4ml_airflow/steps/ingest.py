"""cd4ml_ingest's tasks: ingest the source into ``raw_images``, then validate and publish that version."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.assets import RAW_IMAGES
from cd4ml_airflow.context import logical_date_of
from cd4ml_airflow.notifier import origin_of
from cd4ml_airflow.steps.shape import step


@task
@step(checks_params=True, says=lambda r: (
    f"ingest: {r.inserted} new, {r.already_present} already present, {r.rejected} rejected "
    f"(rejects table {r.rejects_table}); raw_images v{r.raw_version}"))
def ingest(settings, context):
    """Hash, decode and MERGE new images; quarantine bad files."""
    from tasks.data.ingest import ingest_landing

    # A missing or empty source (EmptyLandingError, a DataError) fails the run at once, without
    # retries, and alerts: a feed that delivered nothing is broken upstream. A source whose files
    # are all ingested already is not empty: it ends with 0 new images and no new version.
    p = context["params"]
    return ingest_landing(settings, run_id=context["run_id"], logical_date=logical_date_of(context),
                          landing=p["source_uri"], label_source=p["label_source"], manifest=p["manifest_uri"],
                          engine=p["engine"], full=p["full_recheck"])


@task(outlets=[RAW_IMAGES])
@step(says=lambda r: f"validation report: {r.report_path}  data docs: {r.docs_path}")
def validate(settings, context, batch: dict):
    """great-expectations suite on the raw version; publishes (and names) it only when it passes."""
    from tasks.alerting import policy as alert_policy
    from tasks.alerting.alert import first_line
    from tasks.alerting.delivery import send
    from tasks.data import lake
    from tasks.data.validate import ValidationFailedError, validate_batch

    name = context["params"]["dataset_version_name"]
    try:
        result = validate_batch(settings, raw_version=batch["raw_version"], files_seen=batch["files_seen"],
                                rejected=batch["rejected"], run_id=context["run_id"])
    except ValidationFailedError as exc:  # the run's incident, with the failed checks and report
        send(alert_policy.validation_failed(origin_of(context, settings, settings.env), raw_version=batch["raw_version"],
                                            failures=exc.failures, report_path=exc.report_path,
                                            error=first_line(exc)), settings)
        raise
    if name:
        lake.tag_version(settings.raw_table, batch["raw_version"], name, run_id=context["run_id"])
    context["outlet_events"][RAW_IMAGES].extra = {
        "raw_table": batch["raw_table"], "raw_version": batch["raw_version"], "name": name,
    }
    return result
