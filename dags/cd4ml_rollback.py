"""
### cd4ml_rollback: champion back to the previous champion (or a named version), in one step

Trigger by hand with a `reason` (required) and optionally `to_version`. One task: `champion`
moves back (tasks/release/release.py `rollback`), the demoted version is tagged `cd4ml.rolled_back` with
the reason so no automatic release promotes it again, the release ledger gets its row (who: the
user who triggered the run), on-call is alerted, and no data is touched. Triggering the same
rollback again changes nothing.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import CHAMPION_MODEL
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors
from cd4ml_airflow.defaults import dag_kwargs


@dag(
    schedule=None,
    params={
        "reason": Param(
            "", type="string", minLength=3,
            description="Why: recorded in the release audit, tagged on the demoted version, sent to on-call.",
        ),
        "to_version": Param(
            None, type=["null", "integer"], minimum=1,
            description="Roll back to this version; empty = the champion before the current one.",
        ),
    },
    **dag_kwargs("cd4ml_rollback", ["release", "rollback", "registry"], __doc__),
)
def cd4ml_rollback():
    @task(outlets=[CHAMPION_MODEL])
    def rollback(*, outlet_events=None, **context) -> dict:
        """Move champion back; a no-op when it is already where this rollback would put it."""
        from tasks.release.release import rollback as roll_back
        from tasks.settings import load_settings

        params = context["params"]
        settings = load_settings()
        check_run_params(context, settings)
        run = context["dag_run"]
        actor = getattr(run, "triggering_user_name", None) or "airflow"
        with fail_fast_on_data_errors():
            result = roll_back(settings, reason=params["reason"], to_version=params["to_version"], actor=actor,
                               run_id=context["run_id"])
        print(result.message)
        outlet_events[CHAMPION_MODEL].extra = {"model_name": result.model_name, "version": result.to_version,
                                               "rollback": True}
        return result.to_dict()

    rollback()


cd4ml_rollback()
