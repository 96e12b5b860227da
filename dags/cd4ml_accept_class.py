"""
### cd4ml_accept_class: accept new classes found by validation (`ingest.allowed_labels: discover`)

Trigger by hand with `labels`, the class names validation reported as new. One task: the labels
are checked against the label rules (tasks/data/classes.py: bounded, no control characters, no
path) and appended to the `classes` table with `added_by: accepted` and `actor`: the user who
triggered the run, as Airflow recorded it. Where approval is required, `cd4ml classes --accept`
triggers this DAG as the signed-in user, so Airflow's auth manager decides who may. Accepting a
recorded class again changes nothing.

Task bodies: `plugins/cd4ml_airflow/steps/classes.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.steps.classes import MAX_ACCEPTED, MAX_LABEL_CHARS, accept_class


@dag(
    schedule=None,
    params={
        "labels": Param(
            [], type="array", minItems=1, maxItems=MAX_ACCEPTED,
            items={"type": "string", "minLength": 1, "maxLength": MAX_LABEL_CHARS},
            description="The new class names to accept, as validation reported them (each checked against the "
            "label rules before anything is written).",
        ),
    },
    **dag_kwargs("cd4ml_accept_class", ["data", "classes"], __doc__),
)
def cd4ml_accept_class():
    accept_class()


cd4ml_accept_class()
