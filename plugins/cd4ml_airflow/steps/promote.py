"""cd4ml_promote's tasks: the candidate (a copy of the upstream champion, or a version by hand) and the test data."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.context import logical_date_of
from cd4ml_airflow.steps.shape import step


@task
@step(checks_params=True)
def copy_candidate(settings, context) -> dict:
    """The candidate: a copy of the upstream champion (deploy model) or the Param `version` (deploy code)."""
    from tasks.release.release import ReleaseError, copy_from_upstream, upstream_version

    params = context["params"]
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
        events = context.get("triggering_asset_events") or {}
        source = upstream_version(event.extra for asset_events in events.values() for event in asset_events)
    copied = copy_from_upstream(settings, source)
    print(f"candidate: {settings.registry.model_name} v{copied['version']} copied from {copied['source']}"
          + (" (reused)" if copied["reused"] else ""))
    return copied


@task
@step(checks_params=True)
def test_data(settings, context) -> dict:
    """This environment's frozen test split: the curated version of this run (or a sample of it)."""
    from tasks.data import lake
    from tasks.data.sampling import training_data

    version = context["params"]["test_version"]
    if version is None:
        version = lake.version_as_of(settings.curated_table, logical_date_of(context))
    data = training_data(settings, settings.curated_table, int(version), context["run_id"])
    return {"curated_table": data["table"], "curated_version": data["version"]}
