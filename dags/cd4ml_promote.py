"""
### cd4ml_promote: a registered model version -> this environment's champion, through the gate

**deploy model** (`release.pattern: deploy_model`, e.g. uat from sit, prod from uat): scheduled on
the champion Asset of `release.upstream`. `copy_candidate` copies the upstream champion (or the
Param `source_version`) into this environment's registered model with MLflow
`copy_model_version`, lineage tags kept, no retraining.

**deploy code** (`release.pattern: deploy_code`): by hand only, with the Param `version`: a
version already registered here (e.g. a challenger whose approval was rejected or timed out)
goes through the gate and the approval again.

Then the shared release tail (`cd4ml_airflow.release`): `evaluate_gate` on this environment's
frozen test split (Param `test_version`, else the curated version of this logical date) ->
`mark_challenger` -> [`approval_request` -> `approve`, where `release.approval: required`] ->
`promote` (publishes this environment's champion Asset) -> `finish` (records a reject or a
timeout, alerts).
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import UPSTREAM_CHAMPION
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.release import release_flow

DEPLOY_MODEL = SETTINGS.release.pattern == "deploy_model"


@dag(
    schedule=[UPSTREAM_CHAMPION] if DEPLOY_MODEL and UPSTREAM_CHAMPION is not None else None,
    params={
        "source_version": Param(
            None, type=["null", "integer"], minimum=1,
            description="deploy model: the upstream version to copy; empty = the upstream's champion "
            "(the version the triggering event names).",
        ),
        "version": Param(
            None, type=["null", "integer"], minimum=1,
            description="deploy code: a version of this environment's registered model to gate and promote.",
        ),
        "test_version": Param(
            None, type=["null", "integer"], minimum=0,
            description="curated_images version whose test split gates the candidate; empty = the one curated "
            "for this logical date.",
        ),
    },
    **dag_kwargs("cd4ml_promote", ["release", "gate", "registry"], __doc__),
)
def cd4ml_promote():
    @task
    def copy_candidate(**context) -> dict:
        """The candidate: a copy of the upstream champion (deploy model) or the Param `version` (deploy code)."""
        from tasks.release.release import ReleaseError, copy_from_upstream
        from tasks.settings import load_settings

        settings = load_settings()
        params = context["params"]
        check_run_params(context, settings)
        with fail_fast_on_data_errors():
            if params["version"] is not None:
                print(f"candidate: {settings.registry.model_name} v{params['version']} (Param version)")
                return {"version": int(params["version"]), "source": "param"}
            if settings.release.pattern != "deploy_model":
                raise ReleaseError(
                    f"{settings.env} deploys code (release.pattern: deploy_code): its candidates come from "
                    "cd4ml_train; trigger this DAG with the Param `version` to gate and promote a registered version"
                )
            source = params["source_version"]
            if source is None:
                for events in (context.get("triggering_asset_events") or {}).values():
                    for event in events:
                        source = (event.extra or {}).get("version", source)
            copied = copy_from_upstream(settings, source)
        print(f"candidate: {settings.registry.model_name} v{copied['version']} copied from {copied['source']}"
              + (" (reused)" if copied["reused"] else ""))
        return copied

    @task
    def test_data(**context) -> dict:
        """This environment's frozen test split: the curated version of this run (or a sample of it)."""
        from tasks.data import lake
        from tasks.data.sampling import training_data
        from tasks.settings import load_settings

        settings = load_settings()
        check_run_params(context, settings)
        with fail_fast_on_data_errors():
            version = context["params"]["test_version"]
            if version is None:
                version = lake.version_as_of(settings.curated_table, logical_date_of(context))
            data = training_data(settings, settings.curated_table, int(version), context["run_id"])
        return {"curated_table": data["table"], "curated_version": data["version"]}

    release_flow(copy_candidate(), test_data())


cd4ml_promote()
