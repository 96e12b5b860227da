"""The alert ledger: an append-only Delta table of every alert delivered and every incident resolved.

It answers the two questions delivery needs, atomically across processes (a task's callback,
the DAG's callback and the triggerer's deadline callback may all fire for one run):

- was this dedup key already delivered and not resolved? Then it is not sent again
  (``claim`` appends the trigger row against the snapshot it read, with no rebase: of two
  racing claims exactly one commits, the other re-reads and sees the key taken);
- which incidents did a DAG leave open? A later successful run resolves them (``close``,
  with the same compare-and-append, so two successes never resolve one incident twice).

``cd4ml alerts`` prints the open ones for on-call.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from tasks.alerting.alert import Alert
from tasks.data import lake
from tasks.settings import Settings

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("env", pa.string()),
        ("dedup_key", pa.string()),
        ("action", pa.string()),  # trigger | resolve
        ("kind", pa.string()),
        ("severity", pa.string()),
        ("dag_id", pa.string()),
        ("run_id", pa.string()),  # trigger: the run that raised it; resolve: the run that resolved it
        ("channels", pa.string()),  # JSON list: where the trigger was routed (resolve goes there too)
        ("at", pa.string()),  # ISO-8601 UTC
        ("alert", pa.string()),  # JSON of the Alert (trigger rows)
    ]
)


@dataclass(frozen=True)
class Incident:
    dedup_key: str
    kind: str
    severity: str
    dag_id: str
    run_id: str
    channels: tuple[str, ...]
    at: str
    alert: Alert
    seq: int


def _table_uri(settings: Settings) -> str:
    return settings.table_uri("alert_ledger")


def _open(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """dedup_key -> its trigger row, for keys whose last row is a trigger."""
    state: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["action"] == "trigger":
            state[row["dedup_key"]] = row
        else:
            state.pop(row["dedup_key"], None)
    return state


def _append(uri: str, table: Any, rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    full = {f.name: None for f in SCHEMA} | row | {
        "seq": (rows[-1]["seq"] + 1) if rows else 1, "at": datetime.now(UTC).isoformat(timespec="seconds")}
    batch = pa.RecordBatch.from_pylist([full], schema=SCHEMA)
    lake.append_stream(uri, pa.RecordBatchReader.from_batches(SCHEMA, [batch]),
                       {"action": row["action"], "dedup_key": row["dedup_key"]}, table)


def claim(settings: Settings, alert: Alert, channels: tuple[str, ...]) -> bool:
    """Record the alert as delivered; False when its key is already open (then nothing is written)."""
    uri = _table_uri(settings)

    def attempt(_: int) -> bool:
        rows, table = lake.ledger_rows(uri)
        if alert.dedup_key in _open(rows):
            return False
        _append(uri, table, rows, {
            "env": alert.env, "dedup_key": alert.dedup_key, "action": "trigger", "kind": alert.kind,
            "severity": alert.severity, "dag_id": alert.dag_id, "run_id": alert.run_id,
            "channels": json.dumps(list(channels)), "alert": json.dumps(asdict(alert), default=str)})
        return True

    return lake.retry_on_conflict(attempt, f"append to {uri}", attempts=12)


def close(settings: Settings, dedup_key: str, run_id: str) -> bool:
    """Mark an open incident resolved by ``run_id``; False if it was not open (already resolved)."""
    uri = _table_uri(settings)

    def attempt(_: int) -> bool:
        rows, table = lake.ledger_rows(uri)
        trigger = _open(rows).get(dedup_key)
        if trigger is None:
            return False
        _append(uri, table, rows, {
            "env": trigger["env"], "dedup_key": dedup_key, "action": "resolve", "kind": trigger["kind"],
            "severity": trigger["severity"], "dag_id": trigger["dag_id"], "run_id": run_id,
            "channels": trigger["channels"]})
        return True

    return lake.retry_on_conflict(attempt, f"append to {uri}", attempts=12)


def _incident(row: dict[str, Any]) -> Incident:
    known = {f.name for f in fields(Alert)}
    alert = Alert(**{k: v for k, v in json.loads(row["alert"]).items() if k in known})
    return Incident(dedup_key=row["dedup_key"], kind=row["kind"], severity=row["severity"], dag_id=row["dag_id"],
                    run_id=row["run_id"], channels=tuple(json.loads(row["channels"])), at=row["at"], alert=alert,
                    seq=row["seq"])


def open_incidents(settings: Settings, dag_id: str | None = None, kinds: frozenset[str] | None = None) -> list[Incident]:
    """Alerts delivered and not resolved, oldest first (optionally of one DAG and some kinds)."""
    rows, _ = lake.ledger_rows(_table_uri(settings))
    found = [_incident(r) for r in _open(rows).values()
             if (dag_id is None or r["dag_id"] == dag_id) and (kinds is None or r["kind"] in kinds)]
    return sorted(found, key=lambda i: i.seq)


def format_incidents(incidents: list[Incident]) -> str:
    if not incidents:
        return "no open alerts"
    lines = [f"{'at':<26} {'severity':<9} {'kind':<18} {'dag':<16} dedup key / summary"]
    for i in incidents:
        lines.append(f"{i.at:<26} {i.severity:<9} {i.kind:<18} {i.dag_id or '-':<16} {i.dedup_key}")
        lines.append(f"{'':<26} {i.alert.summary}")
    return "\n".join(lines)
