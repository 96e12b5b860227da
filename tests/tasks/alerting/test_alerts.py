"""Alerts without Airflow: the log channel, routing per environment and severity, the ledger's
de-duplication and resolution, the message a person reads, and the settings that route them."""

import json
import logging
import re

import pytest

from tasks.alerting.alert import ALERT_KINDS, ALERT_MARKER, Alert, message
from tasks.alerting.delivery import resolve, routed, send


def _alert(severity="critical", kind="task_failed", dag_id="cd4ml_ingest", run_id="r1", **kw):
    return Alert(summary=f"{dag_id} failed in task validate", severity=severity, source=f"dag:{dag_id}/task:validate",
                 env="sit", dedup_key=f"sit:{dag_id}:{run_id}", details={"try_number": 1}, kind=kind, dag_id=dag_id,
                 task_id="validate", run_id=run_id, log_url=f"http://ui/dags/{dag_id}/runs/{run_id}/tasks/validate",
                 error="ValidationFailedError: 3 expectations failed", versions={"raw_version": 4}, **kw)


def _alert_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if ALERT_MARKER in r.getMessage()]


def test_log_channel_writes_one_structured_record(settings, caplog):
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        [delivery] = send(_alert(), settings)
    assert delivery.channel == "log" and delivery.ok and not delivery.suppressed
    [payload] = _alert_lines(caplog)
    assert payload["marker"] == ALERT_MARKER and payload["action"] == "trigger"
    assert payload["severity"] == "critical" and payload["env"] == "sit"
    assert payload["details"] == {"try_number": 1} and payload["versions"] == {"raw_version": 4}
    assert payload["runbook"] == "docs/runbooks/task_failed.md"
    assert [r.levelno for r in caplog.records if ALERT_MARKER in r.getMessage()] == [logging.CRITICAL]


def test_routing_per_environment_and_severity(cd4ml_home):
    from tasks.settings import load_settings

    table = {env: {sev: routed(Alert("s", sev, "x", env, "k"), load_settings(env))
                   for sev in ("info", "warning", "critical")} for env in ("sit", "uat", "prod")}
    assert table["sit"] == {"info": ("log",), "warning": ("log",), "critical": ("log",)}
    assert table["uat"] == {"info": ("log",), "warning": ("log", "slack"), "critical": ("log", "slack")}
    assert table["prod"] == {"info": ("log",), "warning": ("log", "slack", "email"),
                             "critical": ("log", "pagerduty", "slack", "email")}


def test_one_incident_per_key_until_a_later_success_resolves_it(settings, caplog):
    from tasks.alerting.incidents import open_incidents

    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        assert not send(_alert(), settings)[0].suppressed  # the task's callback
        assert send(_alert(), settings)[0].suppressed  # the DAG run's callback: same run, same key
        send(_alert(run_id="r2"), settings)  # another failed run: another incident
        send(_alert(kind="drift", dag_id="cd4ml_train", run_id="r3"), settings)  # an event, not an incident
    assert len(_alert_lines(caplog)) == 3
    assert [i.dedup_key for i in open_incidents(settings, dag_id="cd4ml_ingest")] == ["sit:cd4ml_ingest:r1",
                                                                                      "sit:cd4ml_ingest:r2"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        resolve(settings, "cd4ml_ingest", "r4")
        resolve(settings, "cd4ml_ingest", "r5")  # nothing left open: nothing sent
        resolve(settings, "cd4ml_train", "r6")  # drift is an event a person closes, not a run's incident
    resolved = _alert_lines(caplog)
    assert [(a["action"], a["dedup_key"]) for a in resolved] == [("resolve", "sit:cd4ml_ingest:r1"),
                                                                 ("resolve", "sit:cd4ml_ingest:r2")]
    assert resolved[0]["details"]["resolved_by"] == "run r4 of cd4ml_ingest succeeded"
    assert open_incidents(settings, dag_id="cd4ml_ingest") == []
    # After the resolve, the same key failing again is a new incident.
    assert not send(_alert(), settings)[0].suppressed


def test_a_broken_ledger_does_not_silence_the_alert(settings, caplog):
    from pathlib import Path

    lake = Path(settings.storage.lake_uri)
    lake.parent.mkdir(parents=True, exist_ok=True)
    lake.write_text("a file where the lake folder should be")
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        [delivery] = send(_alert(), settings)
    assert delivery.ok and len(_alert_lines(caplog)) == 1
    assert "alert ledger unavailable" in caplog.text


def test_settings_none_still_logs(caplog):
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        assert [d.channel for d in send(_alert(), None)] == ["log"]
    assert len(_alert_lines(caplog)) == 1


def test_message_carries_what_on_call_needs(settings):
    msg = message(_alert(), settings)
    text, html = msg.markdown(), msg.html()
    for needle in ("[sit] CRITICAL task_failed", "cd4ml_ingest", "validate", "r1",
                   "ValidationFailedError: 3 expectations failed", "raw_version=4",
                   "http://ui/dags/cd4ml_ingest/runs/r1/tasks/validate", "docs/runbooks/task_failed.md"):
        assert needle in text and needle in html, needle
    resolved = message(Alert(**{**_alert().__dict__, "details": {"resolved_by": "run r9 succeeded"}}), settings,
                       "resolve")
    assert resolved.title.startswith("RESOLVED [sit]") and ("Resolved by", "run r9 succeeded") in resolved.facts


def test_routes_must_log_and_email_needs_recipients(cd4ml_home, tmp_path):
    from tasks.settings import REPO_ROOT, SettingsError, load_settings

    conf = tmp_path / "conf"
    conf.mkdir()
    base = (REPO_ROOT / "conf" / "base.yaml").read_text()
    (conf / "base.yaml").write_text(base)
    (conf / "sit.yaml").write_text("alerts:\n  routes:\n    critical: [slack]\n")
    with pytest.raises(SettingsError, match="must include log"):
        load_settings("sit", conf_dir=conf)
    (conf / "sit.yaml").write_text("alerts:\n  routes:\n    critical: [log, email]\n")
    with pytest.raises(SettingsError, match="email_to is empty"):
        load_settings("sit", conf_dir=conf)
    (conf / "sit.yaml").write_text("alerts:\n  routes:\n    critical: [log, sms]\n")
    with pytest.raises(SettingsError):
        load_settings("sit", conf_dir=conf)


def test_every_alert_kind_has_a_runbook_and_every_raised_kind_is_known():
    from tasks.settings import REPO_ROOT

    for kind in ALERT_KINDS:
        text = (REPO_ROOT / "docs" / "runbooks" / f"{kind}.md").read_text()
        assert "## What it means" in text and "## What to do" in text, kind
    raised = set()
    for folder in ("tasks", "dags", "plugins"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            code = path.read_text()
            if "Alert(" in code or "alert_from_context(" in code:  # files that raise alerts
                raised |= set(re.findall(r'(?:kind=|_KIND = )"([a-z_]+)"', code))  # literal or named constant
    raised |= {f"approval_{d}" for d in ("rejected", "timeout")} | {"rollback"}  # tasks/release/release.py's _alert(kind)
    assert raised <= set(ALERT_KINDS), raised - set(ALERT_KINDS)
    assert set(ALERT_KINDS) <= raised | {"task_failed"}, set(ALERT_KINDS) - raised  # every kind is raised somewhere
    with pytest.raises(ValueError, match="unknown alert kind"):
        Alert("s", "warning", "x", "sit", "k", kind="nope")


def test_cli_lists_open_incidents_and_resolves_one_by_hand(settings, capsys):
    from tasks.alerting.incidents import open_incidents
    from tasks.cli import main

    send(_alert(), settings)
    send(_alert(kind="gate_failed", run_id="r9"), settings)
    assert main(["alerts", "--env", "sit"]) == 0
    out = capsys.readouterr().out
    assert "sit:cd4ml_ingest:r1" in out and "r9" not in out  # events only with --all
    assert main(["alerts", "--env", "sit", "--all"]) == 0
    assert "sit:cd4ml_ingest:r9" in capsys.readouterr().out
    assert main(["alerts", "--env", "sit", "--resolve", "sit:cd4ml_ingest:r1", "--reason", "source fixed",
                 "--by", "alice"]) == 0
    assert open_incidents(settings, kinds=frozenset({"task_failed"})) == []
    assert main(["alerts", "--env", "sit", "--resolve", "sit:cd4ml_ingest:r1"]) == 1  # nothing open by that key
