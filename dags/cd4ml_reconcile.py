"""
### cd4ml_reconcile: a lost hand-off only delays a release

**deploy model** only (`release.pattern: deploy_model`), on `release.upstream_registry.reconcile_schedule`:
`pending_import` asks the upstream's registry for its champion and looks here for a version imported
from it whose gate ran; when there is none (the event that should have started `cd4ml_promote` was
lost, or its run failed before the gate), `import_needed` lets `trigger_promote` start `cd4ml_promote`
with that `source_version`. The import finds an earlier import of the same source and reuses it, so a
late event and the reconcile together still import one version.

Task bodies: `plugins/cd4ml_airflow/steps/reconcile.py`.
"""

from __future__ import annotations

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import dag

from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.steps.reconcile import import_needed, pending_import

DEPLOY_MODEL = SETTINGS.release.pattern == "deploy_model"


@dag(
    schedule=SETTINGS.release.upstream_registry.reconcile_schedule if DEPLOY_MODEL else None,
    **dag_kwargs("cd4ml_reconcile", ["release", "registry"], __doc__),
)
def cd4ml_reconcile():
    pending = pending_import()
    import_needed(pending) >> TriggerDagRunOperator(
        task_id="trigger_promote", trigger_dag_id="cd4ml_promote", conf={"source_version": pending["source_version"]})


cd4ml_reconcile()
