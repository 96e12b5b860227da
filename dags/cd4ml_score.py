"""
### cd4ml_score: unlabelled images -> the champion's predictions in the `predictions` Delta table

Scores a folder or fsspec URL (Param `source`; empty = the environment's `storage.scoring_uri`)
with `models:/<model>@champion`, pinned to its version for the whole run. Every image gets one
row per model version (label, confidence, every class probability, the run's logical date): a
retry, a cleared task or a backfill scores only what that version has not scored. Bad files
are quarantined in `scoring_rejects` with ingest's reasons and the batch goes on. An absent or
empty inbox skips the run with the reason; no champion fails it before any image is read. New predictions are published on the `predictions` Asset.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import PREDICTIONS
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs


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
    @task(outlets=[PREDICTIONS])
    def score(*, outlet_events=None, **context) -> dict:
        """Stream the images through the champion into `predictions`; quarantine bad files."""
        from airflow.sdk.exceptions import AirflowSkipException

        from tasks.serving.score import NothingToScoreError
        from tasks.serving.score import score as run_scoring
        from tasks.settings import load_settings

        settings = load_settings()
        check_run_params(context, settings)
        with fail_fast_on_data_errors():
            try:
                result = run_scoring(settings, context["params"]["source"] or settings.storage.scoring_uri,
                                     run_id=context["run_id"], logical_date=logical_date_of(context))
            except NothingToScoreError as exc:  # an empty or absent inbox: the run skips with the reason
                raise AirflowSkipException(str(exc)) from exc
        print(f"scored {result.scored} new image(s) with {result.model_name} v{result.model_version} "
              f"({result.already_scored} already scored, {result.quarantined} quarantined: {result.rejected_by_reason})")
        outlet_events[PREDICTIONS].extra = {
            "model_name": result.model_name, "model_version": result.model_version, "scored": result.scored,
            "quarantined": result.quarantined, "versions": result.versions,
        }
        return result.to_dict()

    score()


cd4ml_score()
