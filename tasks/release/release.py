"""Releases: how a model version gets, keeps and loses this environment's aliases.

* ``challenger``: set by ``mark_challenger`` on a candidate whose gate passed.
* ``champion``: moved only by ``promote`` and by ``rollback``. ``promote`` reads the gate from what
  the gate recorded (the version's ``cd4ml.gate.*`` tags and its report in this environment's
  reports folder), never from what the caller hands in, and where ``release.approval`` is
  ``required`` it needs an ``approved`` row of the ledger for that gate whose responder is an
  allowed approver: a task state set by hand writes no such row. ``rollback`` goes back only to
  a version that held ``champion`` in this environment's ledger; any other target is a promotion.
* The actor is always given by the caller from an authenticated identity (tasks/release/actors.py
  for the command line, the DAG run's triggering user inside Airflow); nothing here guesses one.

Every change is first a row of the ``release_audit`` ledger (tasks/release/audit.py), committed against
the snapshot the decision was made on, then the MLflow alias, then a tag on the model version.
So two promotions racing for one environment end with one champion and a ledger that says what
really happened; a crash between the row and the alias is repaired by ``reconcile`` at the start
of the next release. Nothing here touches data.

Two release patterns (``release.pattern``): ``deploy_code`` trains in every environment on its
own data (tasks/training/train.py, with a sample in sit); ``deploy_model`` copies the champion of
``release.upstream`` into this environment's registered model (tasks/release/model_import.py: from
the upstream's own registry, every file checked against its manifest, provenance tagged) and gates
the import here, no retraining.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.errors import DataError
from tasks.models.champion import NoChampionError
from tasks.models.registry import (
    TAG_IMPORT_ENV,
    TAG_IMPORT_MODEL,
    TAG_IMPORT_REGISTRY,
    TAG_IMPORT_VERSION,
    TAG_ROLLED_BACK,
    StaleGateError,
    alias_version,
    get_model_version,
    mlflow_client,
    set_version_tags,
    trained_on,
)
from tasks.release import audit
from tasks.release.audit import AuditRow
from tasks.settings import Settings

log = logging.getLogger(__name__)

TAG_LAST_RELEASE = "cd4ml.release.last"
TAG_GATE_REPORT, TAG_GATE_DECISION = "cd4ml.gate.report", "cd4ml.gate.decision"  # written by tasks/release/evaluate.py
APPROVED, REJECTED, TIMEOUT = "approved", "rejected", "timeout"
DECISIONS = (APPROVED, REJECTED, TIMEOUT)
ROLE_PREFIX = "role:"


class ReleaseError(DataError, RuntimeError):
    """A release request that cannot be carried out as asked; nothing was changed."""


class RolledBackError(ReleaseError):
    """The version was rolled back once: it is never promoted automatically again."""


class ApprovalRequiredError(ReleaseError):
    """This environment needs a recorded approval by an allowed approver before the champion moves."""


class GateNotRecordedError(ReleaseError):
    """The version has no readable gate report of this environment: it has not earned a promotion here."""


class NotAFormerChampionError(ReleaseError):
    """A rollback target that never held champion here: moving champion to it is a promotion (gate, approval)."""


@dataclass(frozen=True)
class ReleaseResult:
    env: str
    model_name: str
    action: str
    alias: str
    from_version: int | None
    to_version: int | None
    changed: bool
    audit_seq: int | None
    message: str
    audit_at: str = ""  # the ledger row's time (UTC, ISO 8601): what the champion announcement names

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _alert(settings: Settings, kind: str, summary: str, dedup_key: str, row: AuditRow) -> None:
    from tasks.alerting.alert import Alert
    from tasks.alerting.delivery import send

    send(Alert(summary=summary, severity="warning", source="release", env=settings.env, dedup_key=dedup_key,
               details=row.to_dict(), kind=kind, run_id=row.airflow_run_id, error=row.reason,
               versions={"model_name": row.model_name, "from_version": row.from_version,
                         "to_version": row.to_version}), settings)


# --------------------------------------------------------------------------- alias state


def reconcile(settings: Settings, client: MlflowClient, attempts: int = 10) -> None:
    """Make MLflow's aliases say what the ledger says now; repairs a crash between ledger row and alias.

    Every process that changes the ledger ends here too. Each round reads the ledger, then
    MLflow, and writes the ledger's value; it stops only when a fresh read of the ledger still
    agrees with MLflow. A process whose write was based on a ledger read that another release
    has since overtaken therefore corrects itself in its next round, and the other process
    verifies after its own write: whatever the interleaving, the aliases end as the ledger says.
    """
    name = settings.registry.model_name
    aliases = (settings.registry.champion_alias, settings.release.challenger_alias)
    for _ in range(attempts):
        rows = audit.read(settings)
        wanted = {alias: _ledger_holder(settings, rows, alias) for alias in aliases}
        wrote = False
        for alias, (known, version) in wanted.items():
            current = alias_version(client, name, alias)
            if not known or current == version:
                continue
            log.info("%s@%s is %s in MLflow and %s in the release ledger: setting the ledger's", name, alias, current,
                     version)
            _set_alias(client, name, alias, version)
            wrote = True
        if not wrote:
            return
    raise ReleaseError(f"{name}: aliases did not settle on the release ledger after {attempts} rounds")


def _set_alias(client: MlflowClient, name: str, alias: str, version: int | None, attempts: int = 3) -> None:
    """Make ``name@alias`` point at ``version`` (None: no alias).

    Two processes may apply the same ledger row at once (the releaser and another one reconciling);
    MLflow's SQL store then refuses the second insert of the alias row. What counts is the end
    state, so a refused write that left the alias where it should be is success.
    """
    for attempt in range(1, attempts + 1):
        try:
            if version is None:
                client.delete_registered_model_alias(name, alias)
            else:
                client.set_registered_model_alias(name, alias, str(version))
            return
        except MlflowException as exc:
            if version is None and exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return
            if alias_version(client, name, alias) == version:
                return
            if attempt == attempts:
                raise
            log.warning("setting %s@%s to %s failed (%s); retrying", name, alias, version, exc)


def _mine(settings: Settings, rows: list[AuditRow]) -> list[AuditRow]:
    return [r for r in rows if r.model_name == settings.registry.model_name]


# The challenger loses its alias when it becomes champion, or when it is the version rolled back.
CHALLENGER_CLEARED_BY = (("promote", "to_version"), ("rollback", "from_version"))


def _ledger_holder(settings: Settings, rows: list[AuditRow], alias: str) -> tuple[bool, int | None]:
    cleared = CHALLENGER_CLEARED_BY if alias == settings.release.challenger_alias else ()
    return audit.alias_holder(_mine(settings, rows), alias, cleared)


def holder(settings: Settings, client: MlflowClient, rows: list[AuditRow], alias: str) -> int | None:
    """Who holds ``alias``: the ledger when it knows the alias, else MLflow (models from before the ledger)."""
    known, version = _ledger_holder(settings, rows, alias)
    return version if known else alias_version(client, settings.registry.model_name, alias)


def _tag_release(client: MlflowClient, settings: Settings, row: AuditRow) -> None:
    summary = json.dumps({k: v for k, v in row.to_dict().items() if k not in ("model_name",)}, sort_keys=True,
                         default=str)
    for version in {row.to_version, row.from_version} - {None}:
        client.set_model_version_tag(settings.registry.model_name, str(version), f"cd4ml.release.{row.seq}", summary)
    if row.to_version is not None:
        client.set_model_version_tag(settings.registry.model_name, str(row.to_version), TAG_LAST_RELEASE, summary)


def _result(settings: Settings, row: AuditRow | None, committed: bool, action: str, alias: str, message: str,
            current: int | None = None) -> ReleaseResult:
    if row is None:
        return ReleaseResult(settings.env, settings.registry.model_name, action, alias, current, current, False, None,
                             message)
    return ReleaseResult(settings.env, settings.registry.model_name, row.action, row.alias, row.from_version,
                         row.to_version, committed, row.seq, message, row.at)


def imported_from(version: ModelVersion) -> str:
    """The ledger's note of where an imported version came from (source environment, model, version, registry)."""
    tags = version.tags or {}
    if not tags.get(TAG_IMPORT_VERSION):
        return ""
    return (f"; imported from {tags.get(TAG_IMPORT_ENV)} {tags.get(TAG_IMPORT_MODEL)} v{tags[TAG_IMPORT_VERSION]} "
            f"({tags.get(TAG_IMPORT_REGISTRY)})")


def _gate_of(gate: Any) -> Mapping[str, Any]:
    gate = gate.to_dict() if hasattr(gate, "to_dict") else gate
    if not isinstance(gate, Mapping) or "decision" not in gate or "candidate_version" not in gate:
        raise ReleaseError(f"not a gate result: {gate!r:.200}")
    return gate


def _check_promotable(version: ModelVersion, gate: Mapping[str, Any]) -> None:
    if (version.tags or {}).get(TAG_ROLLED_BACK):
        raise RolledBackError(
            f"{version.name} v{version.version} was rolled back ({version.tags[TAG_ROLLED_BACK]}): "
            "it is never promoted automatically again"
        )
    if int(gate["candidate_version"]) != int(version.version):
        raise ReleaseError(f"the gate result is for version {gate['candidate_version']}, not {version.version}")
    if gate["decision"] != "pass":
        raise ReleaseError(f"{version.name} v{version.version}: the gate decided {gate['decision']!r}, not pass")


# --------------------------------------------------------------------------- challenger and champion


def mark_challenger(settings: Settings, version: int, gate: Any, *, run_id: str = "", actor: str = "cd4ml-gate") -> ReleaseResult:
    """Give a candidate that passed the gate the ``challenger`` alias (idempotent)."""
    client = mlflow_client(settings)
    name, alias = settings.registry.model_name, settings.release.challenger_alias
    gate = _gate_of(gate)
    candidate = get_model_version(client, name, version)
    _check_promotable(candidate, gate)
    reconcile(settings, client)

    def decide(rows: list[AuditRow]) -> AuditRow | None:
        current = holder(settings, client, rows, alias)
        if int(version) in (current, holder(settings, client, rows, settings.registry.champion_alias)):
            return None  # already challenger, or already champion (a re-run of the release that made it so)
        return AuditRow(settings.env, name, "challenger", alias, current, int(version), actor,
                        reason=(f"gate passed against champion v{gate['champion_version']}"
                                if gate.get("champion_version") is not None else "gate passed; no champion yet")
                        + imported_from(candidate),
                        gate_report=str(gate.get("report_path", "")), airflow_run_id=run_id,
                        request_id=f"{run_id}:challenger:{version}" if run_id else "")

    row, committed = audit.commit(settings, decide)
    reconcile(settings, client)
    if row is not None and committed:
        _tag_release(client, settings, row)
    return _result(settings, row, committed, "challenger", alias,
                   f"{name}@{alias} = v{version}" if row else f"{name} v{version} already holds {alias} or champion",
                   int(version))


def recorded_gate(settings: Settings, version: ModelVersion) -> dict[str, Any]:
    """The gate this environment recorded for ``version``: the report its ``cd4ml.gate.report`` tag names.

    Only a report in this environment's gate folder, written for this model, version and
    environment, with the decision the tag says, counts; a dict handed to ``promote`` does not.
    """
    tags = version.tags or {}
    where = f"{version.name} v{version.version} in {settings.env}"
    path = tags.get(TAG_GATE_REPORT)
    if not path:
        raise GateNotRecordedError(f"{where} was never gated: promote it through the gate (cd4ml_promote, Param version)")
    folder = (settings.reports_path / "gate").resolve()
    report_file = Path(path).resolve()
    if report_file.parent != folder:
        raise GateNotRecordedError(f"{where}: its gate report {path} is not in this environment's gate folder {folder}")
    try:
        report = json.loads(report_file.read_text())
    except (OSError, ValueError) as exc:  # the message names the file, never its content
        raise GateNotRecordedError(f"{where}: its gate report {path} cannot be read ({type(exc).__name__})") from None
    expected = {"env": settings.env, "model_name": version.name, "candidate_version": int(version.version),
                "decision": tags.get(TAG_GATE_DECISION)}
    if not isinstance(report, dict) or any(report.get(k) != v for k, v in expected.items()):
        raise GateNotRecordedError(f"{where}: the gate report {path} is not this version's gate in this environment")
    return {**report, "report_path": str(path)}


def may_approve(approvers: Iterable[str], by: str | None, approval: Mapping[str, Any]) -> bool:
    """Whether a recorded decision's responder is an allowed approver (``release.approvers``).

    Empty ``approvers``: anyone Airflow let answer. A user name: that person. ``role:<Role>``
    entries cannot be resolved without Airflow: the approval operator records the list Airflow's
    auth manager checked the responder against (``assigned``; cd4ml_airflow.auth resolves the
    roles), and only the same list counts.
    """
    approvers = tuple(approvers)
    if not by:
        return False
    if not approvers or by in approvers:
        return True
    roles = any(a.startswith(ROLE_PREFIX) for a in approvers)
    return roles and tuple(approval.get("assigned") or ()) == approvers


def _approval_for(settings: Settings, rows: list[AuditRow], version: int, gate: Mapping[str, Any],
                  run_id: str) -> dict[str, Any]:
    """The recorded approval of this gate of ``version`` (in this run, when there is one), made after the
    champion last moved; else refused."""
    name, champion = settings.registry.model_name, settings.registry.champion_alias
    mine = _mine(settings, rows)
    moved = max((r.seq for r in mine if r.alias == champion), default=0)
    decisions = [r for r in mine if r.action in DECISIONS and r.to_version == int(version) and r.seq > moved
                 and r.gate_report == str(gate["report_path"]) and (not run_id or r.airflow_run_id == run_id)]
    where = f"{settings.env} needs an approval by an allowed approver before {name}@{champion} moves to v{version}"
    if not decisions:
        raise ApprovalRequiredError(f"{where} (release.approval: required); the ledger holds no decision for its gate "
                                    f"{gate['report_path']} (a task state set by hand is not a decision)")
    last = decisions[-1]
    if last.action != APPROVED:
        raise ApprovalRequiredError(f"{where}; the last decision was {last.action} by {last.actor} (audit #{last.seq})")
    if not may_approve(settings.release.approvers, last.approval.get("by"), last.approval):
        raise ApprovalRequiredError(f"{where}; audit #{last.seq} was answered by {last.approval.get('by')!r}, who is "
                                    f"not in release.approvers {list(settings.release.approvers)}")
    return {**last.approval, "audit_seq": last.seq}


def _refused(settings: Settings, version: int, actor: str, run_id: str, exc: Exception) -> None:
    """On-call hears of a promotion that was refused for want of a gate or an approval."""
    from tasks.alerting.alert import Alert
    from tasks.alerting.delivery import send

    name = settings.registry.model_name
    send(Alert(summary=f"{name} v{version} not promoted in {settings.env}: {exc}", severity="warning",
               source="release", env=settings.env, dedup_key=f"{settings.env}:release-refused:{name}:v{version}:{run_id}",
               details={"actor": actor, "error": type(exc).__name__}, kind="release_refused", run_id=run_id,
               error=type(exc).__name__, versions={"model_name": name, "to_version": version}), settings)


def promote(settings: Settings, version: int, gate: Any = None, *, actor: str, reason: str = "",
            run_id: str = "") -> ReleaseResult:
    """Move ``champion`` to ``version``: its recorded gate passed against the champion that still holds the alias.

    ``gate`` (optional) is what the caller believes the gate was; it must be the recorded one.
    Where ``release.approval`` is ``required`` the ledger must hold an ``approved`` decision for
    that gate by an allowed approver (``record_decision``), who is then the row's actor. A
    champion that moved since the gate compared against it makes this a ``StaleGateError`` (gate
    again); promoting the current champion is a no-op. A refusal for want of a gate or an
    approval is alerted.
    """
    if not actor:
        raise ReleaseError("a promotion needs the identity of who (or which run) asks for it")
    client = mlflow_client(settings)
    name, alias = settings.registry.model_name, settings.registry.champion_alias
    candidate = get_model_version(client, name, version)
    try:
        recorded = recorded_gate(settings, candidate)
    except GateNotRecordedError as exc:
        _refused(settings, int(version), actor, run_id, exc)
        raise
    if gate is not None and str(_gate_of(gate).get("report_path", "")) != recorded["report_path"]:
        raise StaleGateError(f"{name} v{version} was gated again since ({recorded['report_path']}): promote that gate")
    _check_promotable(candidate, recorded)
    reconcile(settings, client)
    compared = recorded.get("champion_version")

    def decide(rows: list[AuditRow]) -> AuditRow | None:
        current = holder(settings, client, rows, alias)
        if current == int(version):
            return None
        if current != (int(compared) if compared is not None else None):
            raise StaleGateError(
                f"the gate compared {name} v{version} with champion v{compared}, but {name}@{alias} is now "
                f"v{current}: gate again before promoting"
            )
        approval = _approval_for(settings, rows, int(version), recorded, run_id) if settings.release.approval == "required" else {}
        return AuditRow(settings.env, name, "promote", alias, current, int(version), approval.get("by") or actor,
                        reason=(reason or "gate passed" + (" and approved" if approval else "")) + imported_from(candidate),
                        gate_report=recorded["report_path"], approval=approval,
                        airflow_run_id=run_id, request_id=f"{run_id}:promote:{version}" if run_id else "")

    try:
        row, committed = audit.commit(settings, decide)
    except ApprovalRequiredError as exc:
        _refused(settings, int(version), actor, run_id, exc)
        raise
    reconcile(settings, client)  # champion -> version; the challenger that won loses that alias (ledger replay)
    if row is not None and committed:
        _tag_release(client, settings, row)
    message = f"{name}@{alias}: v{row.from_version} -> v{row.to_version}" if row else f"{name}@{alias} is already v{version}"
    return _result(settings, row, committed, "promote", alias, message, int(version))


def record_decision(settings: Settings, version: int, decision: str, *, actor: str, reason: str,
                    gate_report: str = "", run_id: str = "", extra: Mapping[str, Any] | None = None) -> ReleaseResult:
    """A person's answer to an approval (approved, rejected, or timeout): the ledger and the version say who and why.

    An ``approved`` row is what ``promote`` needs where approval is required; it moves nothing by
    itself. A rejection or a timeout is alerted: the champion stays. ``extra`` is kept with the
    decision (when it was answered, which approvers Airflow checked the responder against).
    """
    if decision not in DECISIONS:
        raise ReleaseError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    if decision == APPROVED and not actor:
        raise ApprovalRequiredError("an approval without a responder is no approval")
    client = mlflow_client(settings)
    name = settings.registry.model_name
    get_model_version(client, name, version)
    champion = holder(settings, client, audit.read(settings), settings.registry.champion_alias)
    approval = {**(extra or {}), "decision": decision, "by": actor, "reason": reason}
    row, committed = audit.commit(
        settings,
        lambda rows: AuditRow(settings.env, name, decision, "", champion, int(version),
                              actor, reason=reason, gate_report=gate_report, approval=approval,
                              airflow_run_id=run_id, request_id=f"{run_id}:{decision}:{version}" if run_id else ""),
    )
    if committed and row is not None:
        if decision != APPROVED:
            _alert(settings, f"approval_{decision}", f"{name} v{version} not promoted in {settings.env}: approval "
                   f"{decision} by {actor}: {reason}", f"{settings.env}:approval-{decision}:{name}:v{version}", row)
        client.set_model_version_tag(name, str(version), "cd4ml.approval", json.dumps(row.approval, sort_keys=True))
        client.set_model_version_tag(name, str(version), f"cd4ml.release.{row.seq}",
                                     json.dumps(row.to_dict(), sort_keys=True, default=str))
    outcome = "approved; promote moves it" if decision == APPROVED else "not promoted"
    return _result(settings, row, committed, decision, "",
                   f"{name} v{version} {outcome} ({decision} by {actor}: {reason}); champion stays v{champion}")


# --------------------------------------------------------------------------- rollback


def previous_champion(rows: list[AuditRow], current: int, alias: str, skip: set[int]) -> int | None:
    """The version that held ``alias`` before ``current`` took it, skipping rolled-back versions."""
    holders = [r for r in rows if r.alias == alias]
    seen = {current}
    for row in reversed(holders):
        if row.to_version in seen and row.from_version is not None and row.from_version not in skip | seen:
            return row.from_version
        if row.to_version in seen and row.from_version is not None:
            seen.add(row.from_version)
    return None


def rollback(settings: Settings, *, reason: str, actor: str, to_version: int | None = None,
             run_id: str = "") -> ReleaseResult:
    """Move ``champion`` back to the previous champion (or ``to_version``) in one step; data is untouched.

    ``to_version`` must have held ``champion`` in this environment before (the ledger says so):
    any other version has not earned it, and moving there is a promotion (``NotAFormerChampionError``).
    The demoted version is tagged ``cd4ml.rolled_back`` with the reason, so no automatic release
    ever promotes it again. Asking for the rollback that was just done is a no-op.
    """
    if not reason or not reason.strip():
        raise ReleaseError("a rollback needs a reason (it is recorded and sent to on-call)")
    if not actor:
        raise ReleaseError("a rollback needs the identity of who (or which run) asks for it")
    client = mlflow_client(settings)
    name, alias = settings.registry.model_name, settings.registry.champion_alias
    if to_version is not None:
        trained_on(get_model_version(client, name, to_version))  # a version nobody can trace is no place to roll back to
    reconcile(settings, client)
    rolled_back = {int(v.version) for v in client.search_model_versions(f"name = '{name}'")
                   if (v.tags or {}).get(TAG_ROLLED_BACK)}

    def decide(rows: list[AuditRow]) -> AuditRow | None:
        current = holder(settings, client, rows, alias)
        rows = _mine(settings, rows)
        last = rows[-1] if rows else None
        if last is not None and last.action == "rollback" and last.to_version == current and last.reason == reason.strip() \
                and to_version in (None, current):
            return None  # the same rollback again
        if current is None:
            raise NoChampionError(f"{settings.env} has no champion ({name}@{alias}): nothing to roll back")
        if to_version is not None:
            if int(to_version) == current:
                return None
            target_version = _former_champion(settings, rows, int(to_version))
        else:
            target_version = previous_champion(rows, current, alias, rolled_back)
            if target_version is None:
                raise NoChampionError(
                    f"{name}@{alias} is v{current} and the release ledger names no earlier champion to roll back to; "
                    "name one with --to VERSION"
                )
        return AuditRow(settings.env, name, "rollback", alias, current, target_version, actor, reason=reason.strip(),
                        airflow_run_id=run_id, request_id=f"{run_id}:rollback" if run_id else "")

    row, committed = audit.commit(settings, decide)
    if row is None:
        current = alias_version(client, name, alias)
        return _result(settings, None, False, "rollback", alias, f"{name}@{alias} is already v{current}: nothing to do",
                       current)
    demoted = get_model_version(client, name, row.from_version)
    set_version_tags(client, demoted, {TAG_ROLLED_BACK: f"{row.reason} (by {row.actor} at {row.at}, audit #{row.seq})"})
    reconcile(settings, client)
    if committed:
        _tag_release(client, settings, row)
        _alert(settings, "rollback", f"{name}@{alias} rolled back: v{row.from_version} -> v{row.to_version} by "
               f"{row.actor}: {row.reason}", f"{settings.env}:rollback:{name}:{row.seq}", row)
    return _result(settings, row, committed, "rollback", alias,
                   f"{name}@{alias}: v{row.from_version} -> v{row.to_version} (rolled back: {row.reason})")


def _former_champion(settings: Settings, rows: list[AuditRow], version: int) -> int:
    """``version`` when this environment's ledger shows it holding champion before; else the promotion path."""
    name, alias = settings.registry.model_name, settings.registry.champion_alias
    if any(r.alias == alias and r.to_version == version for r in rows):
        return version
    approval = " and a person's approval" if settings.release.approval == "required" else ""
    raise NotAFormerChampionError(
        f"{name} v{version} never held {alias} in {settings.env}: moving {alias} to it is a promotion, not a rollback; "
        f"it takes the promotion path (the gate{approval}): trigger cd4ml_promote with Param version={version} "
        f"or run `cd4ml promote --env {settings.env} --version {version}`"
    )


# --------------------------------------------------------------------------- deploy model


MAX_EVENT_CHARS = 4096  # a message-queue event's body, at most: the queue is written by another deployment
MAX_EVENT_BATCH = 10  # messages of one SQS batch read, at most (SQS hands out 10 at a time)


def upstream_version(event_extras: Iterable[Mapping[str, Any] | None]) -> int | None:
    """The upstream version the triggering Asset events name: the last event that names one wins, else None.

    deploy_model runs on the upstream's champion Asset, whose events carry what that environment
    published ({"model_name", "version", ...}), or on a message-queue Asset (AssetWatcher) whose
    event extra is {"from_trigger": true, "payload": {"data": "<the message: that JSON>", ...}} (Redis)
    or {"from_trigger": true, "payload": {"message_batch": [{"Body": "<that JSON>", ...}, ...]}} (SQS).
    A message that is too long, not JSON or names no version is ignored, never echoed: None leaves
    the choice to ``import_model`` (the upstream's champion now).
    """
    version = None
    for extra in event_extras:
        named = _named_version(extra or {})
        version = named if named is not None else version
    return version


def _named_version(extra: Mapping[str, Any]) -> int | None:
    payload = extra.get("payload") if extra.get("from_trigger") else None
    if not isinstance(payload, Mapping):
        return _version_in(extra)
    version = None
    for data in _payload_messages(payload):
        message = _message_of(data)
        named = _version_in(message) if message is not None else None
        version = named if named is not None else version
    return version


def _payload_messages(payload: Mapping[str, Any]) -> list[Any]:
    """The message texts a trigger's payload carries: Redis pub/sub's ``data``, or each SQS message's ``Body``."""
    batch = payload.get("message_batch")
    if isinstance(batch, list):
        return [m.get("Body") if isinstance(m, Mapping) else None for m in batch[:MAX_EVENT_BATCH]]
    return [payload.get("data")]


def _version_in(message: Mapping[str, Any]) -> int | None:
    value = message.get("version")
    if isinstance(value, str) and value.isdigit() and len(value) <= 9:
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _message_of(data: Any) -> Mapping[str, Any] | None:
    """A queue message's JSON object; None (logged with the reason only, never the content) for anything else."""
    if not isinstance(data, str) or len(data) > MAX_EVENT_CHARS:
        reason = f"longer than {MAX_EVENT_CHARS} characters" if isinstance(data, str) else "not text"
    else:
        try:
            message = json.loads(data)
        except ValueError:
            message, reason = None, "not JSON"
        else:
            reason = "not a JSON object"
        if isinstance(message, Mapping):
            return message
    log.warning("an upstream champion message was ignored: %s", reason)
    return None


__all__ = [
    "APPROVED", "DECISIONS", "REJECTED", "TIMEOUT", "ApprovalRequiredError", "GateNotRecordedError", "NoChampionError",
    "NotAFormerChampionError", "ReleaseError", "ReleaseResult", "RolledBackError",
    "mark_challenger", "may_approve", "previous_champion", "promote", "reconcile", "record_decision",
    "recorded_gate", "rollback", "upstream_version",
]
