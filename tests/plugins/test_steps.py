"""The shared task shape (``cd4ml_airflow.steps.shape``): settings, fail fast, log, Asset extra, XCom; skip on empty."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk import DAG, Asset, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from cd4ml_airflow.steps.shape import skip_on, step
from tasks.errors import DataError

COUNTED = Asset(name="counted", uri="file:///tmp/counted")


class Counted:
    def __init__(self, n: int, env: str):
        self.n, self.env = n, env

    def to_dict(self) -> dict:
        return {"n": self.n, "env": self.env}


@task(outlets=[COUNTED])
@step(says=lambda r: f"counted {r.n} in {r.env}", publishes=(COUNTED, lambda r: {"n": r.n}))
def count(settings, context, items: list, extra: int = 0):
    """Count the items (and the Param `plus`)."""
    return Counted(len(items) + extra + (1 if context["params"]["plus"] else 0), settings.env)


def test_the_task_keeps_the_bodys_name_doc_and_arguments_and_returns_a_dict():
    with DAG("shape", start_date=pendulum.datetime(2026, 11, 1), schedule=None, params={"plus": True}) as dag:
        count([1, 2, 3], extra=10)
    op = dag.get_task("count")
    assert op.doc_md == "Count the items (and the Param `plus`)."
    assert list(op.op_args) == [[1, 2, 3]]
    assert op.op_kwargs == {"extra": 10}
    assert op.multiple_outputs is True  # inferred from `-> dict`, as for the tasks written by hand
    assert str(inspect.signature(count.function)) == "(items: 'list', extra: 'int' = 0, **context)"


def test_a_run_loads_settings_logs_publishes_and_returns_the_result_as_a_dict(settings, capsys):
    with DAG("shape", start_date=pendulum.datetime(2026, 11, 1), schedule=None, params={"plus": True}) as dag:
        count([1, 2, 3], extra=10)
    events = {COUNTED: SimpleNamespace(extra=None)}
    context = {"params": {"plus": True}, "run_id": "r1", "outlet_events": events, "ti": SimpleNamespace()}
    assert dag.get_task("count").execute(context) == {"n": 14, "env": "sit"}  # Airflow's own call path
    assert "counted 14 in sit" in capsys.readouterr().out
    assert events[COUNTED].extra == {"n": 14}


def _raising(error: BaseException, **options):
    @step(**options)
    def body(settings, context):
        raise error

    return body


def test_data_errors_fail_at_once_other_errors_are_left_to_retries(settings):
    with pytest.raises(AirflowFailException, match="^DataError: the manifest names no image"):
        _raising(DataError("the manifest names no image"))(params={})
    with pytest.raises(OSError, match="disk full"):
        _raising(OSError("disk full"))(params={})
    with pytest.raises(DataError):  # the body says which part fails fast
        _raising(DataError("lineage missing"), fail_fast=False)(params={})


def test_a_first_task_checks_the_runs_params_before_its_body(settings):
    called = []

    @step(checks_params=True)
    def ingest(settings, context):
        called.append(True)
        return {}

    params = {"label_source": "csv", "manifest_uri": None, "engine": None, "dataset_version_name": None}
    with pytest.raises(AirflowFailException, match="needs manifest_uri"):
        ingest(dag=SimpleNamespace(dag_id="cd4ml_ingest"), params=params, run_id="r1")
    assert called == []
    assert ingest(dag=SimpleNamespace(dag_id="cd4ml_ingest"), params={**params, "label_source": "folders"}) == {}
    assert called == [True]


def test_a_plain_dict_result_is_the_xcom_as_it_is(settings):
    @step()
    def pinned(settings, context, data: dict):
        return {"curated_version": data["v"], "run": context["run_id"]}

    assert pinned({"v": 3}, run_id="r7", params={}) == {"curated_version": 3, "run": "r7"}
    assert pinned(data={"v": 4}, run_id="r8") == {"curated_version": 4, "run": "r8"}


def test_a_body_that_returns_no_dict_says_so_and_airflow_pushes_it_whole():
    @task.short_circuit
    @step(fail_fast=False)
    def gate(settings, context, drift: dict) -> bool:
        return drift["status"] == "drift"

    with DAG("shape", start_date=pendulum.datetime(2026, 11, 1), schedule=None):
        gate({"status": "drift"})
    assert gate.function.__annotations__ == {"return": "bool"}
    assert gate.multiple_outputs is False


def test_a_body_takes_settings_and_context_first():
    with pytest.raises(TypeError, match=r"takes \(settings, context, \.\.\.\)"):
        @step()
        def wrong(context, settings):
            return {}


def test_skip_on_skips_only_for_the_named_errors():
    class NothingThere(RuntimeError):
        pass

    with pytest.raises(AirflowSkipException, match="^the inbox is empty$"):
        with skip_on(NothingThere):
            raise NothingThere("the inbox is empty")
    with pytest.raises(ValueError):
        with skip_on(NothingThere):
            raise ValueError("a real failure")
    with skip_on(NothingThere):
        pass  # nothing raised, nothing skipped
