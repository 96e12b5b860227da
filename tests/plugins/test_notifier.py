"""The shared failure callback turns an Airflow context into one structured alert."""

import json
import logging
from types import SimpleNamespace

from cd4ml_airflow.notifier import OnCallNotifier


class _TI(SimpleNamespace):
    def xcom_pull(self, task_ids):
        return self.upstream_results[task_ids]


def test_failure_callback_sends_one_alert_with_what_on_call_needs(settings, caplog):
    ti = _TI(dag_id="cd4ml_train", task_id="train", try_number=3,
             upstream_results={"training_data": {"curated_table": "/lake/curated_images", "curated_version": 7,
                                                 "sample": None, "rows": 1500}})
    context = {
        "dag": SimpleNamespace(dag_id="cd4ml_train"),
        "ti": ti,
        "task": SimpleNamespace(upstream_task_ids={"training_data"}),
        "params": {"dataset_version": None, "curated_version": 7, "tune": False},
        "run_id": "manual__2026-11-21",
        "logical_date": "2026-11-21T00:00:00+00:00",
        "exception": ValueError("loss is NaN\nTraceback line 2"),
    }
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        OnCallNotifier(severity="critical").notify(context)
    [record] = [r for r in caplog.records if "CD4ML_ALERT" in r.getMessage()]
    alert = json.loads(record.getMessage())
    assert alert["source"] == "dag:cd4ml_train/task:train" and alert["kind"] == "task_failed"
    assert alert["summary"] == "cd4ml_train failed in task train"
    assert alert["error"] == "ValueError: loss is NaN"  # the first line only
    assert (alert["dag_id"], alert["task_id"], alert["run_id"]) == ("cd4ml_train", "train", "manual__2026-11-21")
    assert alert["log_url"] == ("http://localhost:8080/dags/cd4ml_train/runs/manual__2026-11-21/tasks/train"
                                "?try_number=3")
    assert alert["versions"] == {"curated_table": "/lake/curated_images", "curated_version": 7}
    assert alert["details"]["try_number"] == 3 and alert["env"] == "sit"
    assert alert["dedup_key"] == "sit:cd4ml_train:manual__2026-11-21"


def test_dag_level_callback_shares_the_runs_dedup_key_and_is_not_sent_twice(settings, caplog):
    task_context = {"dag": SimpleNamespace(dag_id="cd4ml_ingest"), "run_id": "manual__2026-11-21",
                    "ti": SimpleNamespace(dag_id="cd4ml_ingest", task_id="validate", try_number=1),
                    "exception": RuntimeError("boom")}
    dag_context = {"dag": SimpleNamespace(dag_id="cd4ml_ingest"), "run_id": "manual__2026-11-21",
                   "reason": "task_failure"}
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        OnCallNotifier().notify(task_context)
        OnCallNotifier()(dag_context)  # the path Airflow takes: render (a no-op here), then notify
    alerts = [json.loads(r.getMessage()) for r in caplog.records if "CD4ML_ALERT" in r.getMessage()]
    assert len(alerts) == 1 and alerts[0]["dedup_key"] == "sit:cd4ml_ingest:manual__2026-11-21"
    assert "already delivered and not resolved" in caplog.text


def test_success_callback_resolves_what_earlier_runs_left_open(settings, caplog):
    from cd4ml_airflow.notifier import ResolveNotifier
    from tasks.alerting.incidents import open_incidents

    OnCallNotifier().notify({"dag": SimpleNamespace(dag_id="cd4ml_curate"), "run_id": "r1", "reason": "task_failure"})
    assert len(open_incidents(settings, dag_id="cd4ml_curate")) == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        ResolveNotifier()({"dag": SimpleNamespace(dag_id="cd4ml_curate"), "run_id": "r2"})
    assert open_incidents(settings, dag_id="cd4ml_curate") == []
    [resolved] = [json.loads(r.getMessage()) for r in caplog.records if "CD4ML_ALERT" in r.getMessage()]
    assert resolved["action"] == "resolve" and resolved["dedup_key"] == "sit:cd4ml_curate:r1"


def test_pending_approval_is_announced_with_the_required_actions_link(settings, caplog):
    from cd4ml_airflow.notifier import ApprovalRequestNotifier

    ti = SimpleNamespace(dag_id="cd4ml_promote", task_id="approve", run_id="manual__1", try_number=1)
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        ApprovalRequestNotifier()({"ti": ti, "dag": SimpleNamespace(dag_id="cd4ml_promote"), "run_id": "manual__1",
                                   "task": SimpleNamespace(subject="promote v3 to champion")})
    [alert] = [json.loads(r.getMessage()) for r in caplog.records if "CD4ML_ALERT" in r.getMessage()]
    assert alert["kind"] == "approval_pending" and alert["severity"] == "warning"
    assert alert["details"]["required_actions"] == \
        "http://localhost:8080/dags/cd4ml_promote/runs/manual__1/tasks/approve/required_actions"
    assert "promote v3 to champion" in alert["summary"]


def test_data_errors_fail_fast_and_others_propagate():
    import pytest
    from airflow.sdk.exceptions import AirflowFailException

    from cd4ml_airflow.context import fail_fast_on_data_errors
    from tasks.data.validate import ValidationFailedError

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
    [record] = [r for r in caplog.records if "CD4ML_ALERT" in r.getMessage()]
    alert = json.loads(record.getMessage())
    assert alert["env"] == "sit" and alert["dedup_key"] == "sit:cd4ml_curate:r1"
