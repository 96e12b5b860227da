"""Alert decisions: what each finding says, how severe it is and which incident (dedup key) it belongs to."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tasks.alerting import policy as alert_policy
from tasks.alerting.policy import Origin

RUN = Origin(env="prod", dag_id="cd4ml_train", task_id="drift_check", run_id="manual__1",
             log_url="http://ui/dags/cd4ml_train/runs/manual__1/tasks/drift_check", versions={"curated_version": 7},
             details={"try_number": 2})
FINDING = SimpleNamespace(reason="KS on softmax p=0.001", champion_version="3", report_path="/r/drift.json",
                          html_path="/r/drift.html", tests=[{"name": "ks"}], severity={"drop": 0.08})
GATE = {"model_name": "digits-prod", "candidate_version": 5, "champion_version": 3, "decision": "fail",
        "report_path": "/r/gate.json", "reasons": ["ok: accuracy +0.01", "FAILED: recall of 7 -0.09", "FAILED: smoke"]}


def test_an_alert_carries_its_origin_and_is_keyed_to_the_run_by_default():
    alert = alert_policy.alert(RUN, kind="task_failed", severity="critical", summary="s", details={"extra": 1})
    assert alert.source == "dag:cd4ml_train/task:drift_check" and alert.env == "prod"
    assert alert.dedup_key == "prod:cd4ml_train:manual__1" == alert_policy.run_key("prod", "cd4ml_train", "manual__1")
    assert (alert.log_url, alert.versions) == (RUN.log_url, {"curated_version": 7})
    assert alert.details == {"try_number": 2, "extra": 1}
    assert Origin(env="sit", dag_id="cd4ml_ingest").source == "dag:cd4ml_ingest"


def test_harmful_drift_that_blocks_is_the_runs_critical_incident():
    alert = alert_policy.drift(RUN, FINDING, table="/lake/curated", version=7, blocking=True)
    assert (alert.kind, alert.severity) == ("drift", "critical")
    assert alert.summary == "training blocked: data drift against champion v3: KS on softmax p=0.001"
    assert alert.dedup_key == "prod:cd4ml_train:manual__1"  # the task's failure callback then pages no second time
    assert alert.details["report"] == "/r/drift.json" and alert.details["severity"] == {"drop": 0.08}


def test_drift_that_only_warns_is_keyed_to_the_data_and_the_champion():
    alert = alert_policy.drift(RUN, FINDING, table="/lake/curated", version=7, blocking=False)
    assert (alert.severity, alert.summary) == ("warning", "data drift against champion v3: KS on softmax p=0.001")
    assert alert.dedup_key == "prod:drift:/lake/curated:v7:champion-v3"
    rerun = alert_policy.drift(Origin(env="prod", dag_id="cd4ml_train", run_id="manual__2"), FINDING,
                               table="/lake/curated", version=7, blocking=False)
    assert rerun.dedup_key == alert.dedup_key  # the same data against the same champion warns once


def test_a_failed_gate_warns_once_per_candidate_with_the_failed_checks():
    alert = alert_policy.gate_failed(RUN, GATE)
    assert (alert.kind, alert.severity, alert.error) == ("gate_failed", "warning", "gate fail")
    assert alert.summary == alert_policy.gate_failure_message(GATE) == (
        "digits-prod v5: gate fail, champion stays v3: FAILED: recall of 7 -0.09; FAILED: smoke")
    assert alert.dedup_key == "prod:gate:digits-prod:v5"
    assert alert.details == {"try_number": 2, "gate_report": "/r/gate.json", "decision": "fail"}


def test_failed_validation_is_the_runs_critical_incident_with_the_first_ten_failures():
    failures = [f"check {i}" for i in range(12)]
    alert = alert_policy.validation_failed(RUN, raw_version=4, failures=failures, report_path="/r/v.json",
                                           error="ValidationFailedError: 12 expectations failed")
    assert (alert.kind, alert.severity) == ("validation_failed", "critical")
    assert alert.summary == "raw_images v4 failed validation: 12 check(s)"
    assert alert.details["failures"] == failures[:10] and alert.dedup_key == "prod:cd4ml_train:manual__1"


def test_a_pending_approval_is_one_warning_per_run():
    alert = alert_policy.approval_pending(RUN, subject="Promote v5?", required_actions="http://ui/ra",
                                          timeout_hours=72)
    assert (alert.kind, alert.severity, alert.summary) == ("approval_pending", "warning",
                                                           "approval needed in prod: Promote v5?")
    assert alert.dedup_key == "prod:approval:cd4ml_train:manual__1"
    assert alert.details["required_actions"] == "http://ui/ra" and alert.details["timeout_hours"] == 72


@pytest.mark.parametrize(("task_id", "summary"), [("train", "cd4ml_train failed in task train"),
                                                   ("", "cd4ml_train failed: task_failure")])
def test_a_failure_names_the_task_or_else_airflows_reason(task_id, summary):
    origin = Origin(env="sit", dag_id="cd4ml_train", task_id=task_id, run_id="r1")
    alert = alert_policy.task_failed(origin, "critical", reason="task_failure", error="ValueError: NaN")
    assert (alert.kind, alert.summary, alert.error) == ("task_failed", summary, "ValueError: NaN")
    assert alert.dedup_key == "sit:cd4ml_train:r1"


@pytest.mark.parametrize(("minutes", "span"), [(0.5, "30 s"), (45, "45 min"), (180, "3 h")])
def test_a_missed_deadline_is_its_own_incident_beside_the_runs(minutes, span):
    origin = Origin(env="sit", dag_id="cd4ml_ingest", run_id="scheduled__1")
    run = {"state": "running", "queued_at": "2026-11-25T00:00:00", "logical_date": None}
    alert = alert_policy.deadline_missed(origin, minutes=minutes, reference="queued_at",
                                         deadline_time="2026-11-25T01:00:00", run=run)
    assert alert.summary == f"cd4ml_ingest run scheduled__1 not finished {span} after its queued at"
    assert (alert.kind, alert.severity) == ("deadline_missed", "critical")
    assert alert.error == "deadline 2026-11-25T01:00:00 passed with the run running"
    assert alert.dedup_key == "sit:cd4ml_ingest:scheduled__1:deadline"
    assert alert.details["queued_at"] == "2026-11-25T00:00:00" and alert.source == "dag:cd4ml_ingest"
