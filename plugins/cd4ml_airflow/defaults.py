"""Defaults shared by every cd4ml DAG: defined once, so no DAG copies them."""

from __future__ import annotations

from datetime import timedelta

import pendulum

from cd4ml_airflow.deadlines import deadline_for
from cd4ml_airflow.notifier import OnCallNotifier, ResolveNotifier

START_DATE = pendulum.datetime(2026, 11, 1, tz="UTC")
on_failure = OnCallNotifier(severity="critical")
on_success = ResolveNotifier()

DEFAULT_ARGS = {
    "owner": "ml-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=15),
    "on_failure_callback": [on_failure],
}


def dag_kwargs(dag_id: str, tags: list[str], doc_md: str | None) -> dict:
    """Keyword arguments every cd4ml ``@dag`` takes: retries, alert callbacks, the deadline from settings."""
    return {
        "dag_id": dag_id,
        "start_date": START_DATE,
        "catchup": False,
        "max_active_runs": 1,
        "default_args": DEFAULT_ARGS,
        "on_failure_callback": [on_failure],
        "on_success_callback": [on_success],  # resolves the incidents earlier runs left open
        "deadline": deadline_for(dag_id),
        "tags": ["cd4ml", *tags],
        "doc_md": doc_md,
    }


def cron_or_asset(cron: str | None, asset):
    """A schedule that runs on ``cron`` (UTC) and whenever ``asset`` gets an event; only on the event without cron."""
    if not cron:
        return [asset]
    from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable

    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=asset)
