"""cd4ml_curate's task: a validated raw version -> a curated, de-duplicated, split version, published."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.assets import CURATED_IMAGES, RAW_IMAGES
from cd4ml_airflow.context import input_version, logical_date_of
from cd4ml_airflow.steps.shape import step


def _said(result) -> str:
    lines = [f"curation report: {result.report_path}  (every drop with its reason: {result.report_table})"]
    if result.report_html:
        lines.append(f"curation page: {result.report_html}")
    lines += [f"fastdup gallery {name}: {path}" for name, path in result.galleries.items()]
    return "\n".join(lines)


def _curated_event(result) -> dict:
    """The Asset event cd4ml_train starts from: the version, its counts and drops."""
    return {
        "curated_table": result.curated_table,
        "curated_version": result.curated_version,
        "raw_version": result.raw_version,
        "kept": result.kept,
        "counts_by_split": result.counts_by_split,
        "counts_by_split_and_label": result.counts_by_split_and_label,
        "dropped_by_reason": result.dropped_by_reason,
        "report_table": result.report_table,
        "components_version": result.components_version,
        "galleries": result.galleries,
        "report_html": result.report_html,
    }


@task(outlets=[CURATED_IMAGES])
@step(checks_params=True, says=_said, publishes=(CURATED_IMAGES, _curated_event))
def curate(settings, context):
    """fastdup near-duplicates, label conflicts, leakage-free split, new curated version."""
    from tasks.curation.curate import curate as run_curation

    raw_version = input_version(context, param="raw_version", asset=RAW_IMAGES, extra_key="raw_version",
                                table_uri=settings.raw_table)
    return run_curation(settings, raw_version=raw_version, run_id=context["run_id"],
                        logical_date=logical_date_of(context))
