"""What an on-call alert is: its kinds, its fields, its dedup key, and the message a person reads.

An ``Alert`` is built by whoever noticed the problem (an Airflow callback, the validation task,
the gate, a drift check, a release decision, a missed deadline, the monitor). Delivering it is
``tasks.alerting.delivery``; remembering it (one incident per dedup key) is
``tasks.alerting.incidents``. This module holds no I/O: it is the vocabulary both share, so that
neither imports the other's machinery.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Literal
from urllib.parse import quote

from tasks.settings import Settings

Severity = Literal["info", "warning", "critical"]
Action = Literal["trigger", "resolve"]

# Every kind of alert the project raises, each with a runbook at docs/runbooks/<kind>.md saying
# what it means and what to do (a test checks that each one exists).
ALERT_KINDS = (
    "task_failed",  # a task or DAG run failed (the callback of every DAG)
    "validation_failed",  # a raw version failed its great-expectations suite: nothing was published
    "deadline_missed",  # a DAG run had not finished by its deadline (Airflow DeadlineAlert)
    "drift",  # the new training data drifted from the champion's
    "gate_failed",  # a candidate did not pass the gate (or the gate could not decide)
    "approval_pending",  # prod waits for a person in the Required Actions page
    "approval_rejected",  # a person said no: the champion stays
    "approval_timeout",  # nobody answered in time: the champion stays
    "rollback",  # the champion was moved back
    "release_refused",  # a promotion without a recorded gate or approval was refused (e.g. a task marked success by hand)
    "model_degraded",  # the champion's live metrics broke a monitoring rule (accuracy, recall, calibration, shift)
    "model_tampered",  # a model version's files differ from the manifest recorded at registration: it was not loaded
    "source_unverifiable",  # an upstream version to import has no manifest, lineage or upstream gate pass: not imported
    "announce_failed",  # a new champion could not be announced on the hop's queue: the downstream's reconcile imports it
)
# Kinds that say "this DAG is broken or late": a later successful run of the same DAG resolves them.
# The others are events (one per gate, batch or decision) that a person closes.
INCIDENT_KINDS = frozenset({"task_failed", "validation_failed", "deadline_missed"})
RUNBOOKS = "docs/runbooks"
ALERT_MARKER = "CD4ML_ALERT"


class ChannelNotConfigured(Exception):
    """The channel's Connection does not exist: retrying cannot help, so it is not retried."""


class ChannelError(Exception):
    """A channel failed; the message names the failure and never carries the channel's secrets."""


@dataclass(frozen=True)
class Alert:
    summary: str
    severity: Severity
    source: str  # what raised it: "dag:cd4ml_ingest/task:ingest", "gate", ...
    env: str
    dedup_key: str  # the same problem keeps the same key, so it is delivered once and resolved once
    details: dict = field(default_factory=dict)
    kind: str = "task_failed"  # one of ALERT_KINDS
    dag_id: str = ""
    task_id: str = ""
    run_id: str = ""
    log_url: str = ""  # the task's log (or the run) in the Airflow UI
    error: str = ""  # the first line of the error
    versions: dict = field(default_factory=dict)  # the data and model versions involved

    def __post_init__(self) -> None:
        if self.kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {self.kind!r}; known: {', '.join(ALERT_KINDS)}")

    @property
    def runbook(self) -> str:
        return f"{RUNBOOKS}/{self.kind}.md"

    def to_json(self, action: Action = "trigger") -> str:
        return json.dumps({"marker": ALERT_MARKER, "action": action, **asdict(self), "runbook": self.runbook},
                          sort_keys=True, default=str)



def first_line(exc: BaseException | None, limit: int = 300) -> str:
    """``Type: first line of the message``, what an alert shows of an error."""
    if exc is None:
        return ""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ui_link(settings: Settings, dag_id: str, run_id: str = "", task_id: str = "", try_number: int | None = None) -> str:
    """A link into the Airflow UI: the DAG, a run, or a task's log (with its try)."""
    url = f"{settings.alerts.ui_base_url.rstrip('/')}/dags/{quote(dag_id, safe='')}"
    if run_id:
        url += f"/runs/{quote(run_id, safe='')}"
        if task_id:
            url += f"/tasks/{quote(task_id, safe='')}" + (f"?try_number={try_number}" if try_number else "")
    return url


def runbook_url(alert: Alert, settings: Settings) -> str:
    base = settings.alerts.runbook_base_url
    return f"{base.rstrip('/')}/{alert.runbook}" if base else alert.runbook


# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Message:
    """What a person reads, independent of the channel: a title, labelled facts and links."""

    title: str
    facts: tuple[tuple[str, str], ...]
    links: tuple[tuple[str, str], ...]

    def markdown(self) -> str:
        """Slack mrkdwn."""
        lines = [f"*{self.title}*", *(f"*{label}:* {value}" for label, value in self.facts)]
        if self.links:
            lines.append("  |  ".join(f"<{url}|{text}>" for text, url in self.links))
        return "\n".join(lines)

    def html(self) -> str:
        rows = "".join(f"<tr><th align='left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in self.facts)
        links = "".join(f"<li><a href='{html.escape(url)}'>{html.escape(text)}</a></li>" for text, url in self.links)
        return f"<h3>{html.escape(self.title)}</h3><table>{rows}</table><ul>{links}</ul>"


def message(alert: Alert, settings: Settings, action: Action = "trigger") -> Message:
    head = "RESOLVED " if action == "resolve" else ""
    title = f"{head}[{alert.env}] {alert.severity.upper()} {alert.kind}: {alert.summary}"
    facts = [("Environment", alert.env), ("Kind", alert.kind)]
    facts += [(label, value) for label, value in (
        ("DAG", alert.dag_id), ("Task", alert.task_id), ("Run", alert.run_id), ("Error", alert.error),
    ) if value]
    if alert.versions:
        facts.append(("Versions", ", ".join(f"{k}={v}" for k, v in sorted(alert.versions.items()))))
    if action == "resolve" and alert.details.get("resolved_by"):
        facts.append(("Resolved by", str(alert.details["resolved_by"])))
    facts.append(("Dedup key", alert.dedup_key))
    links = [(text, url) for text, url in (
        ("Required Actions", alert.details.get("required_actions", "")),
        ("Task log" if alert.task_id else "Airflow run", alert.log_url),
        (f"Runbook: {alert.kind}", runbook_url(alert, settings)),
    ) if url]
    return Message(title=title[:250], facts=tuple(facts), links=tuple(links))
