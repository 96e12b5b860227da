"""On-call alerts: what happened (``Alert``), where it goes (routes in settings), delivery that never fails.

An ``Alert`` is built by whoever noticed the problem (an Airflow callback, the validation
task, the gate, a drift check, a release decision, a missed deadline) and handed to ``send``:

1. the ``log`` channel, always: one JSON line on the ``cd4ml.alerts`` logger, the record of
   every alert whatever else happens (a log shipper can route it too);
2. the alert ledger (``tasks/ops/incidents.py``): a dedup key that was already delivered and is
   not resolved is not delivered again, so the task-level and DAG-level callbacks of one run,
   a retried task or a cleared run raise one incident, not several;
3. every other channel routed for the alert's severity in this environment's settings
   (``alerts.routes``), one after the other, each tried ``alerts.retry.attempts`` times with
   exponential back-off. A channel that still fails is logged (never with its secrets) and
   the others still fire: ``send`` never raises, so alerting can never fail a DAG.

``resolve`` closes the incidents a DAG left open (failed runs, failed validation, missed
deadlines) when a later run of the same DAG in the same environment succeeds: PagerDuty gets a
``resolve`` with the same dedup key and Slack a resolved message.

Channels other than ``log`` are Airflow's provider notifiers (Slack webhook, PagerDuty Events
API v2, SMTP) wrapped in ``plugins/cd4ml_airflow/channels.py`` and loaded by name, so this
module stays free of Airflow imports. Their endpoints and secrets come from Airflow Connections.
"""

from __future__ import annotations

import html
import importlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
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
    "model_degraded",  # the champion's live metrics broke a monitoring rule (accuracy, recall, calibration, shift)
)
# Kinds that say "this DAG is broken or late": a later successful run of the same DAG resolves them.
# The others are events (one per gate, batch or decision) that a person closes.
INCIDENT_KINDS = frozenset({"task_failed", "validation_failed", "deadline_missed"})
RUNBOOKS = "docs/runbooks"
ALERT_MARKER = "CD4ML_ALERT"

# Channel name -> "module:function" taking (alert, settings, action). Loaded on first use.
CHANNELS = {
    "slack": "cd4ml_airflow.channels:slack",
    "pagerduty": "cd4ml_airflow.channels:pagerduty",
    "email": "cd4ml_airflow.channels:email",
}

log = logging.getLogger("cd4ml.alerts")


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


@dataclass(frozen=True)
class Delivery:
    channel: str
    ok: bool
    attempts: int
    error: str = ""
    suppressed: bool = False  # already delivered and still open: not sent again


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


# --------------------------------------------------------------------------- delivery


def _log_line(alert: Alert, action: Action) -> None:
    level = logging.INFO if action == "resolve" or alert.severity == "info" else (
        logging.CRITICAL if alert.severity == "critical" else logging.WARNING)
    log.log(level, alert.to_json(action))


def _channel(name: str) -> Callable[[Alert, Settings, Action], None]:
    module, _, function = CHANNELS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def _deliver(name: str, alert: Alert, settings: Settings, action: Action) -> Delivery:
    """One channel, retried with exponential back-off; never raises."""
    retry = settings.alerts.retry
    error = ""
    for attempt in range(1, retry.attempts + 1):
        try:
            _channel(name)(alert, settings, action)
        except ChannelNotConfigured as exc:
            log.error("alert %s (%s) not delivered to %s: %s", alert.dedup_key, action, name, exc)
            return Delivery(name, False, attempt, str(exc))
        except Exception as exc:  # noqa: BLE001 - a channel must never fail the caller
            error = str(exc) if isinstance(exc, ChannelError) else type(exc).__name__
            if attempt < retry.attempts:
                wait = min(retry.max_backoff_s, retry.backoff_s * 2 ** (attempt - 1))
                log.warning("alert %s (%s): %s attempt %d/%d failed (%s); retrying in %.1f s",
                            alert.dedup_key, action, name, attempt, retry.attempts, error, wait)
                time.sleep(wait)
        else:
            log.info("alert %s (%s) delivered to %s (attempt %d)", alert.dedup_key, action, name, attempt)
            return Delivery(name, True, attempt)
    log.error("alert %s (%s) NOT delivered to %s after %d attempts: %s; its log line above is the record",
              alert.dedup_key, action, name, retry.attempts, error)
    return Delivery(name, False, retry.attempts, error)


def routed(alert: Alert, settings: Settings) -> tuple[str, ...]:
    """The channels this environment routes the alert's severity to, log first."""
    return ("log", *(c for c in settings.alerts.routes[alert.severity] if c != "log"))


def send(alert: Alert, settings: Settings | None) -> list[Delivery]:
    """Log the alert, then deliver it once to every routed channel. Never raises.

    A dedup key already delivered and not resolved is not delivered again (nor logged as a new
    alert: one line says it was suppressed). ``settings=None`` means the settings themselves
    could not be loaded, which is exactly when on-call must hear about it: the log line then.
    """
    if settings is None:
        _log_line(alert, "trigger")
        return [Delivery("log", True, 1)]
    channels = routed(alert, settings)
    from tasks.ops import incidents

    try:
        first = incidents.claim(settings, alert, channels)
    except Exception as exc:  # noqa: BLE001 - the ledger being down must not silence the alert
        log.error("alert ledger unavailable (%s); delivering %s without de-duplication",
                  first_line(exc), alert.dedup_key)
        first = True
    if not first:
        log.info("alert %s (%s) already delivered and not resolved: not sent again", alert.dedup_key, alert.kind)
        return [Delivery("log", True, 1, suppressed=True)]
    _log_line(alert, "trigger")
    return [Delivery("log", True, 1), *(_deliver(name, alert, settings, "trigger") for name in channels[1:])]


def resolve(settings: Settings, dag_id: str, run_id: str) -> list[Delivery]:
    """A successful run of ``dag_id`` resolves every incident that DAG left open in this environment.

    Each incident is resolved on the channels its trigger went to (PagerDuty by its dedup key,
    Slack with a resolved message, email not: a resolved email nobody needs is noise). Never raises.
    """
    from tasks.ops import incidents

    try:
        opened = incidents.open_incidents(settings, dag_id=dag_id, kinds=INCIDENT_KINDS)
    except Exception as exc:  # noqa: BLE001
        log.error("alert ledger unavailable (%s); open incidents of %s not resolved", first_line(exc), dag_id)
        return []
    return [d for incident in opened
            for d in resolve_incident(settings, incident, run_id, f"run {run_id} of {dag_id} succeeded")]


def resolve_incident(settings: Settings, incident, resolver: str, reason: str) -> list[Delivery]:
    """Close one open incident in the ledger (once, whoever races), then tell the channels it went to."""
    from tasks.ops import incidents

    if not incidents.close(settings, incident.dedup_key, resolver):
        return []  # another process resolved it first
    alert = replace(incident.alert, details={**incident.alert.details, "resolved_by": reason})
    _log_line(alert, "resolve")
    return [Delivery("log", True, 1), *(_deliver(name, alert, settings, "resolve") for name in incident.channels
                                        if name in ("pagerduty", "slack"))]
