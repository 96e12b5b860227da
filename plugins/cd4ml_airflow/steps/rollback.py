"""cd4ml_rollback's task: the champion back to the previous one (or a named version), published."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.assets import CHAMPION_MODEL
from cd4ml_airflow.steps.shape import step


def _champion_event(result) -> dict:
    return {"model_name": result.model_name, "version": result.to_version, "rollback": True}


@task(outlets=[CHAMPION_MODEL])
@step(checks_params=True, says=lambda r: r.message, publishes=(CHAMPION_MODEL, _champion_event))
def rollback(settings, context):
    """Move champion back; a no-op when it is already where this rollback would put it."""
    from cd4ml_airflow.champion_queue import announce_champion
    from cd4ml_airflow.context import run_actor
    from tasks.release.release import rollback as roll_back

    params = context["params"]
    result = roll_back(settings, reason=params["reason"], to_version=params["to_version"], actor=run_actor(context),
                       run_id=context["run_id"])
    announce_champion(settings, result)  # the downstream deployment hears of it (release.publish); never fails the task
    return result
