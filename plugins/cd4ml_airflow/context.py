"""Read what a task needs from the Airflow context: dates, explicit input versions, who acted."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk import Asset


def logical_date_of(context) -> str:
    """The run's logical date as ISO-8601; asset-triggered runs have none, so use run_after."""
    when = context.get("logical_date") or context["dag_run"].run_after
    return when.isoformat()


def run_actor(context) -> str:
    """Who acted in this run, as Airflow recorded it: the user it names as having triggered the run
    (the API server records the signed-in user of the UI or REST call), else the scheduler (scheduled
    and asset-triggered runs). Never a Param or anything else the triggering user could type."""
    return getattr(context["dag_run"], "triggering_user_name", None) or "scheduler"


def input_version(context, *, param: str, asset: Asset, extra_key: str, table_uri: str) -> int:
    """Which version of an input table this run reads, never "whatever is newest".

    In order: the explicit Param (manual trigger from the UI), the newest triggering asset
    event's extra (the producer said which version it published), else the version the
    producer committed for this run's logical date or before (scheduled runs, backfills).
    """
    explicit = context["params"].get(param)
    if explicit is not None:
        return int(explicit)
    events = context.get("triggering_asset_events") or {}
    try:
        for event in reversed(list(events[asset])):
            extra = event.extra or {}
            if extra.get(extra_key) is not None:
                return int(extra[extra_key])
    except KeyError:
        pass
    from tasks.data import lake

    return lake.version_as_of(table_uri, logical_date_of(context))


@contextmanager
def fail_fast_on_data_errors() -> Iterator[None]:
    """A ``tasks.errors.DataError`` fails the task without retries: the data will not change."""
    from airflow.sdk.exceptions import AirflowFailException

    from tasks.errors import DataError

    try:
        yield
    except DataError as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def check_run_params(context, settings) -> None:
    """Fail the run's first task, without retries, when a Param names something that does not exist."""
    from tasks.ops.params import check_params

    with fail_fast_on_data_errors():
        check_params(context["dag"].dag_id, settings, context["params"])
