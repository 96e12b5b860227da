"""
### cd4ml_rollback: champion back to the previous champion (or a named version), in one step

Trigger by hand with a `reason` (required) and optionally `to_version`. One task: `champion`
moves back (tasks/release/release.py `rollback`; only to a version that held it here before), the demoted version is tagged `cd4ml.rolled_back` with
the reason so no automatic release promotes it again, the release ledger gets its row (who: the
user who triggered the run), on-call is alerted, and no data is touched. Triggering the same
rollback again changes nothing.

Task bodies: `plugins/cd4ml_airflow/steps/rollback.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.steps.rollback import rollback


@dag(
    schedule=None,
    params={
        "reason": Param(
            "", type="string", minLength=3,
            description="Why: recorded in the release audit, tagged on the demoted version, sent to on-call.",
        ),
        "to_version": Param(
            None, type=["null", "integer"], minimum=1,
            description="Roll back to this version, a former champion of this environment (any other is a "
            "promotion: cd4ml_promote); empty = the champion before the current one.",
        ),
    },
    **dag_kwargs("cd4ml_rollback", ["release", "rollback", "registry"], __doc__),
)
def cd4ml_rollback():
    rollback()


cd4ml_rollback()
