"""The shared failure callback turns an Airflow context into one structured alert."""

import json
import logging
from types import SimpleNamespace

from cd4ml_airflow.notifier import OnCallNotifier


def test_failure_callback_sends_one_alert(settings, caplog):
    ti = SimpleNamespace(dag_id="cd4ml_ingest", task_id="validate", try_number=3, log_url="http://airflow/log")
    context = {
        "dag": SimpleNamespace(dag_id="cd4ml_ingest"),
        "ti": ti,
        "run_id": "manual__2026-11-21",
        "logical_date": "2026-11-21T00:00:00+00:00",
        "exception": ValueError("label in set: 3 unexpected"),
    }
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        OnCallNotifier(severity="critical").notify(context)
    [record] = caplog.records
    alert = json.loads(record.getMessage())
    assert alert["source"] == "dag:cd4ml_ingest/task:validate"
    assert alert["summary"] == "cd4ml_ingest failed in task validate"
    assert alert["details"]["error"] == "ValueError: label in set: 3 unexpected"
    assert alert["details"]["try_number"] == 3 and alert["env"] == "sit"
    assert alert["dedup_key"] == "sit:cd4ml_ingest:manual__2026-11-21"


def test_dag_level_callback_shares_the_runs_dedup_key(settings, caplog):
    context = {"dag": SimpleNamespace(dag_id="cd4ml_ingest"), "run_id": "manual__2026-11-21", "reason": "task_failure"}
    notifier = OnCallNotifier()
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        notifier(context)  # the path Airflow takes: render (a no-op here), then notify
    [record] = caplog.records
    alert = json.loads(record.getMessage())
    assert alert["source"] == "dag:cd4ml_ingest" and alert["summary"] == "cd4ml_ingest failed: task_failure"
    assert alert["dedup_key"] == "sit:cd4ml_ingest:manual__2026-11-21"


def test_data_errors_fail_fast_and_others_propagate():
    import pytest
    from airflow.sdk.exceptions import AirflowFailException

    from cd4ml_airflow.context import fail_fast_on_data_errors
    from tasks.validate import ValidationFailedError

    with pytest.raises(AirflowFailException, match="^ValidationFailedError: 3 expectations failed"):
        with fail_fast_on_data_errors():
            raise ValidationFailedError("3 expectations failed", failures=[], report_path="r.json", result=None)
    with pytest.raises(OSError):  # infrastructure trouble is left to Airflow's retries
        with fail_fast_on_data_errors():
            raise OSError("disk full")


def test_broken_settings_still_reach_on_call(cd4ml_home, tmp_path, monkeypatch, caplog):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "base.yaml").write_text("project: [unclosed\n")
    monkeypatch.setenv("CD4ML_CONF_DIR", str(tmp_path / "conf"))
    context = {"dag": SimpleNamespace(dag_id="cd4ml_curate"), "run_id": "r1", "exception": RuntimeError("boom")}
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        OnCallNotifier().notify(context)
    [record] = caplog.records
    alert = json.loads(record.getMessage())
    assert alert["env"] == "sit" and alert["dedup_key"] == "sit:cd4ml_curate:r1"
