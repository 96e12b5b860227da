"""Which alert a finding raises: its kind, severity, summary, details and dedup key.

The Airflow side says where an alert comes from (an ``Origin``: environment, DAG, task, run,
log link, versions); this module decides what it says and how it is keyed. The dedup key
decides how many incidents a problem makes, since ``tasks.alerting.delivery.send`` delivers a key once
until it is resolved:

- a run's own trouble, ``<env>:<dag_id>:<run_id>`` (``run_key``): the task- and DAG-level failure
  callbacks and the alerts a task raises about its own run (validation failed, drift blocking
  training) share it, so one failed run pages once;
- a missed deadline, the run's key + ``:deadline``: the late run may still fail, and page, later;
- drift that only warns, ``<env>:drift:<table>:v<version>:champion-v<N>``: a re-run on the same
  data against the same champion does not warn again;
- a failed gate, ``<env>:gate:<model>:v<N>``: one per candidate;
- a pending approval, ``<env>:approval:<dag_id>:<run_id>``: one per run waiting for a person.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.alerting.alert import Alert, Severity


@dataclass(frozen=True)
class Origin:
    """Where an alert comes from; ``details`` are the run's own (logical date, try), merged under the alert's."""

    env: str
    dag_id: str
    task_id: str = ""
    run_id: str = ""
    log_url: str = ""
    versions: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return f"dag:{self.dag_id}" + (f"/task:{self.task_id}" if self.task_id else "")


class DriftFinding(Protocol):
    """What the drift alert reads of a drift check's result (``tasks.monitoring.drift.DriftResult``)."""

    reason: str
    champion_version: str | None
    report_path: str
    html_path: str | None
    tests: list[dict]
    severity: dict


def run_key(env: str, dag_id: str, run_id: str | None) -> str:
    """One incident per DAG run."""
    return f"{env}:{dag_id}:{run_id}"


def alert(origin: Origin, *, kind: str, severity: Severity, summary: str, error: str = "",
          details: Mapping[str, Any] | None = None, dedup_key: str | None = None) -> Alert:
    """An alert about ``origin``; keyed to its run unless ``dedup_key`` says otherwise."""
    return Alert(
        summary=summary, severity=severity, source=origin.source, env=origin.env,
        dedup_key=dedup_key or run_key(origin.env, origin.dag_id, origin.run_id), kind=kind,
        dag_id=origin.dag_id, task_id=origin.task_id, run_id=origin.run_id, log_url=origin.log_url, error=error,
        versions=dict(origin.versions), details=dict(origin.details) | dict(details or {}),
    )


def task_failed(origin: Origin, severity: Severity, *, reason: str, error: str) -> Alert:
    """A failed task (task-level callback) or run (DAG-level callback, ``reason`` from Airflow)."""
    summary = f"{origin.dag_id} failed" + (f" in task {origin.task_id}" if origin.task_id else f": {reason}")
    return alert(origin, kind="task_failed", severity=severity, summary=summary, error=error)


def deadline_missed(origin: Origin, *, minutes: float, reference: str, deadline_time: Any,
                    run: Mapping[str, Any]) -> Alert:
    """A run not finished ``minutes`` after its reference (logical date or queued time): its own incident."""
    return alert(
        origin, kind="deadline_missed", severity="critical",
        summary=f"{origin.dag_id} run {origin.run_id} not finished {_span(minutes)} after its "
                f"{reference.replace('_', ' ')}",
        error=f"deadline {deadline_time} passed with the run {run.get('state', 'unfinished')}",
        details={"deadline": str(deadline_time), "reference": reference, "minutes": minutes,
                 "queued_at": run.get("queued_at"), "logical_date": run.get("logical_date")},
        dedup_key=run_key(origin.env, origin.dag_id, origin.run_id) + ":deadline",
    )


def validation_failed(origin: Origin, *, raw_version: int, failures: list, report_path: str, error: str) -> Alert:
    """A raw version failed its suite: the run's own incident, with the first failed checks and the report."""
    return alert(origin, kind="validation_failed", severity="critical",
                 summary=f"raw_images v{raw_version} failed validation: {len(failures)} check(s)",
                 error=error, details={"report": report_path, "failures": failures[:10]})


def drift(origin: Origin, finding: DriftFinding, *, table: str, version: int, blocking: bool) -> Alert:
    """Drift against the champion: critical and the run's own incident when it blocks training, else a warning
    keyed to the data and champion (so the task's failure callback does not page twice for a block)."""
    return alert(
        origin, kind="drift", severity="critical" if blocking else "warning",
        summary=("training blocked: " if blocking else "")
        + f"data drift against champion v{finding.champion_version}: {finding.reason}",
        error=finding.reason,
        details={"report": finding.report_path, "html": finding.html_path, "tests": finding.tests,
                 "severity": finding.severity},
        dedup_key=None if blocking else (
            f"{origin.env}:drift:{table}:v{version}:champion-v{finding.champion_version}"),
    )


def gate_failed(origin: Origin, gate: Mapping[str, Any]) -> Alert:
    """A candidate that did not pass the gate (``GateResult.to_dict()``): a warning, once per candidate."""
    return alert(
        origin, kind="gate_failed", severity="warning", summary=gate_failure_message(gate),
        error=f"gate {gate['decision']}", details={"gate_report": gate["report_path"], "decision": gate["decision"]},
        dedup_key=f"{origin.env}:gate:{gate['model_name']}:v{gate['candidate_version']}",
    )


def gate_failure_message(gate: Mapping[str, Any]) -> str:
    """Why the champion stays: the candidate, the decision and the failed checks."""
    return (f"{gate['model_name']} v{gate['candidate_version']}: gate {gate['decision']}, champion stays "
            f"v{gate['champion_version']}: " + "; ".join(r for r in gate["reasons"] if r.startswith("FAILED")))


def approval_pending(origin: Origin, *, subject: str, required_actions: str, timeout_hours: float) -> Alert:
    """A run waits for a person: a warning per run, with the link to the Required Actions page."""
    return alert(
        origin, kind="approval_pending", severity="warning", summary=f"approval needed in {origin.env}: {subject}",
        details={"required_actions": required_actions, "timeout_hours": timeout_hours},
        dedup_key=f"{origin.env}:approval:{origin.dag_id}:{origin.run_id}",
    )


def _span(minutes: float) -> str:
    return f"{minutes * 60:.3g} s" if minutes < 1 else f"{minutes:.3g} min" if minutes < 120 else f"{minutes / 60:.3g} h"
