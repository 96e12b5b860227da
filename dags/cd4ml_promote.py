"""
### cd4ml_promote: a registered model version -> this environment's champion, through the gate

**deploy model** (`release.pattern: deploy_model`, e.g. uat from sit, prod from uat): scheduled on
the champion Asset of `release.upstream`, or, between separate deployments (`release.upstream_event`),
on the Asset whose AssetWatcher hears the upstream's announcements on the hop's queue; and started by
`cd4ml_reconcile` for whatever the queue lost. `copy_candidate`
imports the upstream champion (or the Param `source_version`) from the upstream's registry
(`release.upstream_registry`) into this environment's registered model: every file checked against
its manifest first, lineage and provenance tags kept, no retraining.

**deploy code** (`release.pattern: deploy_code`): by hand only, with the Param `version`: a
version already registered here (e.g. a challenger whose approval was rejected or timed out)
goes through the gate and the approval again.

Then the shared release tail (`cd4ml_airflow.release`): `evaluate_gate` on this environment's
frozen test split (Param `test_version`, else the curated version of this logical date) ->
`mark_challenger` -> [`approval_request` -> `approve`, where `release.approval: required`] ->
`promote` (publishes this environment's champion Asset) -> `finish` (records a reject or a
timeout, alerts).

Task bodies: `plugins/cd4ml_airflow/steps/promote.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.assets import UPSTREAM_CHAMPION
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.release import release_flow
from cd4ml_airflow.steps.promote import copy_candidate, test_data

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
    release_flow(copy_candidate(), test_data())


cd4ml_promote()
