"""Who acted in a DAG run: what Airflow recorded, never what the run was given."""

from __future__ import annotations

from types import SimpleNamespace

from cd4ml_airflow.context import run_actor


def test_the_actor_is_the_user_airflow_recorded_or_the_scheduler():
    manual = SimpleNamespace(triggering_user_name="approver", run_type="manual", conf={"by": "ceo@example.com"})
    assert run_actor({"dag_run": manual, "params": {"by": "ceo@example.com"}}) == "approver"
    scheduled = SimpleNamespace(triggering_user_name=None, run_type="asset_triggered")
    assert run_actor({"dag_run": scheduled}) == "scheduler"
