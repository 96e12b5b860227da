"""
### cd4ml_curate: validated raw version -> curated, de-duplicated, split Delta version

Triggered by the `raw_images` Asset (or by hand with an explicit `raw_version`).
Bad images (too small, too dark, too bright, blurry: fastdup's image statistics) are
dropped; exact and near-duplicates (fastdup) are grouped into components; one image per
component is kept, components with conflicting labels are quarantined. Splits follow the
component and never change once recorded, so near-duplicates never straddle splits and new
data never moves a test image into train. Every drop is a row in `curation_report`; the
fastdup galleries are linked from the task log. The new `curated_images` version names the
raw version it came from and is published on the `curated_images` Asset (counts per split
and class, drops by reason), which triggers `cd4ml_train`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import CURATED_IMAGES, RAW_IMAGES
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors, input_version, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs


@dag(
    schedule=[RAW_IMAGES],
    params={
        "raw_version": Param(
            None, type=["null", "integer"], minimum=0,
            description="raw_images version to curate; empty = the one the triggering event names "
            "(or, for a manual run, the one ingested for this logical date).",
        ),
    },
    **dag_kwargs("cd4ml_curate", ["curation", "fastdup"], __doc__),
)
def cd4ml_curate():
    @task(outlets=[CURATED_IMAGES])
    def curate(*, outlet_events=None, **context) -> dict:
        """fastdup near-duplicates, label conflicts, leakage-free split, new curated version."""
        from tasks.curation.curate import curate as run_curation
        from tasks.settings import load_settings

        settings = load_settings()
        check_run_params(context, settings)
        with fail_fast_on_data_errors():
            raw_version = input_version(
                context, param="raw_version", asset=RAW_IMAGES, extra_key="raw_version", table_uri=settings.raw_table
            )
            result = run_curation(settings, raw_version=raw_version, run_id=context["run_id"],
                                  logical_date=logical_date_of(context))
        print(f"curation report: {result.report_path}  (every drop with its reason: {result.report_table})")
        for name, path in result.galleries.items():
            print(f"fastdup gallery {name}: {path}")
        outlet_events[CURATED_IMAGES].extra = {
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
        }
        return result.to_dict()

    curate()


cd4ml_curate()
