"""cd4ml_score's task: unlabelled images through the champion into ``predictions``, published."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.assets import PREDICTIONS
from cd4ml_airflow.context import logical_date_of
from cd4ml_airflow.steps.shape import skip_on, step


def _predictions_event(result) -> dict:
    return {"model_name": result.model_name, "model_version": result.model_version, "scored": result.scored,
            "quarantined": result.quarantined, "versions": result.versions}


@task(outlets=[PREDICTIONS])
@step(checks_params=True, publishes=(PREDICTIONS, _predictions_event), says=lambda r: (
    f"scored {r.scored} new image(s) with {r.model_name} v{r.model_version} "
    f"({r.already_scored} already scored, {r.quarantined} quarantined: {r.rejected_by_reason})"))
def score(settings, context):
    """Stream the images through the champion into `predictions`; quarantine bad files."""
    from tasks.serving.score import NothingToScoreError
    from tasks.serving.score import score as run_scoring

    with skip_on(NothingToScoreError):  # an empty or absent inbox: the run skips with the reason
        return run_scoring(settings, context["params"]["source"] or settings.storage.scoring_uri,
                           run_id=context["run_id"], logical_date=logical_date_of(context))
