"""Deadlines: every DAG named in ``alerts.deadlines`` gets an Airflow ``DeadlineAlert``.

The scheduler checks deadlines; when a run has not finished by its logical date (or the time
it was queued) plus the configured minutes, the triggerer awaits ``deadline_missed``, which
raises a ``deadline_missed`` alert through the same routing as every other alert. A later
successful run of the DAG resolves it.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any


def deadline_for(dag_id: str) -> list:
    """The DAG's DeadlineAlert from this environment's settings (none if not configured), at parse time."""
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

    from cd4ml_airflow.config import SETTINGS

    deadline = SETTINGS.alerts.deadlines.get(dag_id)
    if deadline is None or under_dags_test():
        return []
    reference = (DeadlineReference.DAGRUN_LOGICAL_DATE if deadline.reference == "logical_date"
                 else DeadlineReference.DAGRUN_QUEUED_AT)
    return [DeadlineAlert(
        reference=reference, interval=timedelta(minutes=deadline.minutes),
        callback=AsyncCallback(deadline_missed, kwargs={
            "dag_id": dag_id, "minutes": deadline.minutes, "reference": deadline.reference}),
        name=f"{dag_id}-{deadline.reference}-{deadline.minutes:g}min",
    )]


def under_dags_test() -> bool:
    """True in ``airflow dags test``, which runs no scheduler and so checks no deadline anyway.

    Airflow 3.3.2's ``dags test`` cannot finish a *successful* run of a DAG that has a
    DeadlineAlert: ``DagRun.update_state`` looks each deadline up by id, but the DAG that
    ``dag.test`` hands it holds the serialized alerts (AttributeError: 'dict' object has no
    attribute 'hex'). Parsed by the DAG processor (scheduler, standalone, Celery), DAGs get theirs.
    """
    return len(sys.argv) >= 3 and Path(sys.argv[0]).name == "airflow" and sys.argv[1:3] == ["dags", "test"]


async def deadline_missed(dag_id: str, minutes: float, reference: str, context: dict[str, Any] | None = None,
                          **_: Any) -> None:
    """Triggerer callback: the run is late. Delivery (blocking I/O, retries) runs in a thread."""
    await asyncio.to_thread(send_deadline_alert, dag_id, minutes, reference, context or {})


def send_deadline_alert(dag_id: str, minutes: float, reference: str, context: dict[str, Any]) -> None:
    from cd4ml_airflow.notifier import settings_or_none
    from tasks.alerting import policy as alert_policy
    from tasks.alerting.alert import ui_link
    from tasks.alerting.delivery import send

    settings, env = settings_or_none()
    run = context.get("dag_run") or {}
    run_id = run.get("dag_run_id") or run.get("run_id") or ""
    origin = alert_policy.Origin(env=env, dag_id=dag_id, run_id=run_id,
                                 log_url=ui_link(settings, dag_id, run_id) if settings else "")
    send(alert_policy.deadline_missed(origin, minutes=minutes, reference=reference,
                                      deadline_time=(context.get("deadline") or {}).get("deadline_time"), run=run),
         settings)
