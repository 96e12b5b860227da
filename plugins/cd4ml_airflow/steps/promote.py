"""cd4ml_promote's tasks: the candidate (a copy of the upstream champion, or a version by hand) and the test data."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.context import logical_date_of
from cd4ml_airflow.steps.shape import step


@task
@step(checks_params=True)
def copy_candidate(settings, context) -> dict:
    """The candidate: the upstream champion imported from its registry (deploy model) or the Param `version` (deploy code)."""
    from tasks.release.model_import import import_model
    from tasks.release.release import ReleaseError, upstream_version

    params = context["params"]
    if params["version"] is not None:
        print(f"candidate: {settings.registry.model_name} v{params['version']} (Param version)")
        return {"version": int(params["version"]), "source": "param"}
    if settings.release.pattern != "deploy_model":
        raise ReleaseError(
            f"{settings.env} deploys code (release.pattern: deploy_code): its candidates come from "
            "cd4ml_train; trigger this DAG with the Param `version` to gate and promote a registered version"
        )
    source = params["source_version"]  # by hand: that version, if the upstream's gate passed it
    events = context.get("triggering_asset_events") or {}
    announced = upstream_version(event.extra for asset_events in events.values() for event in asset_events)
    # An announcement only says "look again": what is imported is the upstream's champion now, read from its
    # registry (a stale, repeated or forged message cannot choose a version)
    imported = import_model(settings, source, credentials=upstream_credentials(settings))
    if source is None and announced not in (None, imported.source_version):
        print(f"the announcement named v{announced}; the upstream's champion is now v{imported.source_version}")
    print(f"candidate: {settings.registry.model_name} v{imported.version} imported from {imported.source} in "
          f"{imported.source_registry}" + (" (reused)" if imported.reused else ""))
    return imported.to_dict()


def upstream_credentials(settings) -> tuple[str, str] | None:
    """The upstream registry's read-only account from the Airflow Connection the settings name (secrets backends
    included); None where the registry is shared or the Connection is not defined."""
    from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

    from cd4ml_airflow.channels import register_secrets

    registry = settings.release.upstream_registry
    if registry.tracking_uri is None:
        return None
    try:
        conn = BaseHook.get_connection(registry.conn_id)
    except AirflowNotFoundException:
        return None
    if not conn.login or not conn.password:
        return None
    register_secrets([conn.password])
    return conn.login, conn.password


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
