"""On-call alerts as plain data, and the channels that deliver them.

An ``Alert`` is built by whoever noticed the problem (an Airflow callback, a gate, a drift
check) and handed to ``send``. The only channel today is ``log``: one structured JSON line
on the ``cd4ml.alerts`` logger, which any log shipper can route. Slack, PagerDuty and email
channels plug in here (their endpoints from environment variables or Airflow Connections).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from tasks.settings import Settings

Severity = Literal["info", "warning", "critical"]

# Every kind of alert the project raises, each with a runbook at docs/runbooks/<kind>.md saying
# what it means and what to do (a test checks that each one exists).
ALERT_KINDS = (
    "task_failed",  # a task or DAG run failed (the callback of every DAG)
    "drift",  # the new training data drifted from the champion's
    "gate_failed",  # a candidate did not pass the gate (or the gate could not decide)
    "approval_pending",  # prod waits for a person in the Required Actions page
    "approval_rejected",  # a person said no: the champion stays
    "approval_timeout",  # nobody answered in time: the champion stays
    "rollback",  # the champion was moved back
)
RUNBOOKS = "docs/runbooks"
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
ALERT_MARKER = "CD4ML_ALERT"

log = logging.getLogger("cd4ml.alerts")


@dataclass(frozen=True)
class Alert:
    summary: str
    severity: Severity
    source: str  # what raised it: "dag:cd4ml_ingest/task:ingest", "gate", ...
    env: str
    dedup_key: str  # the same problem keeps the same key, so on-call tools can group it
    details: dict = field(default_factory=dict)
    kind: str = "task_failed"  # one of ALERT_KINDS

    def __post_init__(self) -> None:
        if self.kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {self.kind!r}; known: {', '.join(ALERT_KINDS)}")

    @property
    def runbook(self) -> str:
        return f"{RUNBOOKS}/{self.kind}.md"

    def to_json(self) -> str:
        return json.dumps({"marker": ALERT_MARKER, **asdict(self), "runbook": self.runbook}, sort_keys=True, default=str)


def _log_channel(alert: Alert) -> None:
    level = logging.CRITICAL if alert.severity == "critical" else logging.WARNING if alert.severity == "warning" else logging.INFO
    log.log(level, alert.to_json())


CHANNELS: dict[str, Callable[[Alert], None]] = {"log": _log_channel}


def send(alert: Alert, settings: Settings | None) -> list[str]:
    """Deliver to every configured channel at or above the minimum severity; returns channels used.

    ``settings=None`` means the settings themselves could not be loaded, which is exactly
    when on-call must hear about it: the alert then goes to the log channel unconditionally.
    """
    if settings is None:
        _log_channel(alert)
        return ["log"]
    if SEVERITY_RANK[alert.severity] < SEVERITY_RANK[settings.alerts.min_severity]:
        return []
    delivered = []
    for name in settings.alerts.channels:
        CHANNELS[name](alert)
        delivered.append(name)
    return delivered
