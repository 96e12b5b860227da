import json
import logging

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
