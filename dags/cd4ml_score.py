"""
### cd4ml_score: unlabelled images -> the champion's predictions in the `predictions` Delta table

Scores a folder or fsspec URL (Param `source`; empty = the environment's `storage.scoring_uri`)
with `models:/<model>@champion`, pinned to its version for the whole run. Every image gets one
row per model version (label, confidence, every class probability, the run's logical date): a
retry, a cleared task or a backfill scores only what that version has not scored. Bad files
are quarantined in `scoring_rejects` with ingest's reasons and the batch goes on. An absent or
empty inbox skips the run with the reason; no champion fails it before any image is read. New predictions are published on the `predictions` Asset.

Task bodies: `plugins/cd4ml_airflow/steps/score.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.steps.score import score


@dag(
    schedule=SETTINGS.serving.schedule,
    params={
        "source": Param(
            None, type=["null", "string"],
            description="The images to score: a local folder or an fsspec URL (s3://, gs://, file://). "
            "Empty = the environment's scoring_uri.",
        ),
    },
    **dag_kwargs("cd4ml_score", ["serving", "scoring"], __doc__),
)
def cd4ml_score():
    score()


cd4ml_score()
