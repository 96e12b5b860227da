import json
import logging

import pytest

from tasks.alerts import ALERT_MARKER, Alert, send


def _alert(severity="critical"):
    return Alert(summary="cd4ml_ingest failed: validate", severity=severity, source="dag:cd4ml_ingest/task:validate",
                 env="sit", dedup_key="sit:dag:cd4ml_ingest/task:validate", details={"try_number": 1})


def test_log_channel_writes_one_structured_record(settings, caplog):
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        assert send(_alert(), settings) == ["log"]
    [record] = caplog.records
    payload = json.loads(record.getMessage())
    assert payload["marker"] == ALERT_MARKER
    assert payload["severity"] == "critical" and payload["env"] == "sit"
    assert payload["details"] == {"try_number": 1}
    assert record.levelno == logging.CRITICAL


def test_below_min_severity_is_not_sent(settings, caplog):
    with caplog.at_level(logging.INFO, logger="cd4ml.alerts"):
        assert send(_alert("info"), settings) == []
    assert caplog.records == []


def test_every_alert_kind_has_a_runbook_and_every_raised_kind_is_known():
    import re

    from tasks.alerts import ALERT_KINDS, Alert
    from tasks.settings import REPO_ROOT

    for kind in ALERT_KINDS:
        text = (REPO_ROOT / "docs" / "runbooks" / f"{kind}.md").read_text()
        assert "## What it means" in text and "## What to do" in text, kind
    raised = set()
    for folder in ("tasks", "dags", "plugins"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            code = path.read_text()
            if "Alert(" in code:  # files that raise alerts (kind= elsewhere is e.g. a sort kind)
                raised |= set(re.findall(r'kind="([a-z_]+)"', code))
    raised |= {f"approval_{d}" for d in ("rejected", "timeout")}  # built from the decision in tasks/release.py
    assert raised <= set(ALERT_KINDS), raised - set(ALERT_KINDS)
    assert json.loads(Alert("s", "warning", "x", "sit", "k", kind="rollback").to_json())["runbook"] == \
        "docs/runbooks/rollback.md"
    with pytest.raises(ValueError, match="unknown alert kind"):
        Alert("s", "warning", "x", "sit", "k", kind="nope")
