"""
### cd4ml_curate: validated raw version -> curated, de-duplicated, split Delta version

Triggered by the `raw_images` Asset (or by hand with an explicit `raw_version`).
Bad images (constant frames; too small, too dark, too bright, flat or blurry against the
version's own images: the project's statistics, docs/curation.md) are dropped; exact and near-duplicates (fastdup) are grouped into components; one image per
component is kept, components with conflicting labels are quarantined. Splits follow the
component and never change once recorded, so near-duplicates never straddle splits and new
data never moves a test image into train. Every drop is a row in `curation_report`; the
fastdup galleries are linked from the task log. The new `curated_images` version names the
raw version it came from and is published on the `curated_images` Asset (counts per split
and class, drops by reason), which triggers `cd4ml_train`.

Task bodies: `plugins/cd4ml_airflow/steps/curate.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.assets import RAW_IMAGES
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.steps.curate import curate


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
    curate()


cd4ml_curate()
