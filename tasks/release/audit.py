"""The release ledger: an append-only ``release_audit`` Delta table, one row per alias change or decision.

The ledger is also the lock. ``commit`` reads the table at one snapshot, lets the caller decide
the next row from the rows it saw (for example "champion is 3, move it to 4"), and commits that
row against the same snapshot with no automatic rebase. If another release committed in between,
Delta refuses ours, and the caller decides again from the new rows: so two promotions racing for
one environment cannot both win, and every row's ``from_version`` is what really held the alias.
The MLflow alias is set after the row commits; a crash in between is repaired by the next
release of that environment (``tasks.release.release`` reconciles the alias to the ledger first).

Rows are never updated or deleted. ``request_id`` makes a retried request a no-op: the same
Airflow run asking for the same change finds its row and commits nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from tasks.data import lake
from tasks.settings import Settings

log = logging.getLogger(__name__)

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("env", pa.string()),
        ("model_name", pa.string()),
        ("action", pa.string()),  # challenger | promote | rollback | reject | timeout
        ("alias", pa.string()),  # the alias that moved ("" for a decision that moved nothing)
        ("from_version", pa.int64()),
        ("to_version", pa.int64()),
        ("actor", pa.string()),
        ("at", pa.string()),  # ISO-8601 UTC: when the change was recorded
        ("reason", pa.string()),
        ("gate_report", pa.string()),
        ("approval", pa.string()),  # JSON: decision, by, at, reason (prod) or {} (no approval needed)
        ("airflow_run_id", pa.string()),
        ("request_id", pa.string()),
    ]
)


@dataclass(frozen=True)
class AuditRow:
    env: str
    model_name: str
    action: str
    alias: str
    from_version: int | None
    to_version: int | None
    actor: str
    reason: str = ""
    gate_report: str = ""
    approval: dict[str, Any] = field(default_factory=dict)
    airflow_run_id: str = ""
    request_id: str = ""
    seq: int = 0
    at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_arrow(self) -> dict[str, Any]:
        return {**asdict(self), "approval": json.dumps(self.approval, sort_keys=True, default=str)}

    @classmethod
    def from_arrow(cls, row: dict[str, Any]) -> AuditRow:
        return cls(**{**row, "approval": json.loads(row["approval"] or "{}")})


def read(settings: Settings) -> list[AuditRow]:
    """Every row of this environment's ledger, oldest first."""
    rows, _ = _snapshot(settings.audit_table)
    return rows


def _snapshot(uri: str) -> tuple[list[AuditRow], Any]:
    rows, table = lake.ledger_rows(uri)
    return [AuditRow.from_arrow(r) for r in rows], table


def alias_holder(rows: list[AuditRow], alias: str, cleared_by: tuple[tuple[str, str], ...] = ()) -> tuple[bool, int | None]:
    """(the ledger knows this alias, the version holding it now), replaying the rows in order.

    ``cleared_by`` lists (action, field) pairs that take the alias away from the version they
    name, e.g. ("promote", "to_version"): a challenger that became champion is no longer challenger.
    """
    known, holder = False, None
    for row in rows:
        if row.alias == alias:
            known, holder = True, row.to_version
        elif holder is not None and any(row.action == action and getattr(row, field) == holder
                                        for action, field in cleared_by):
            holder = None
    return known, holder


def commit(settings: Settings, decide: Callable[[list[AuditRow]], AuditRow | None]) -> tuple[AuditRow | None, bool]:
    """Append the row ``decide`` returns for the rows it sees, atomically against that snapshot.

    ``decide`` may raise (the request is stale or invalid) or return None (nothing to change).
    Returns (row, committed_now): an existing row with the same ``request_id`` is returned as
    (row, False), so a retried request changes nothing.
    """
    uri = settings.audit_table

    def attempt(_: int) -> tuple[AuditRow | None, bool]:
        rows, table = _snapshot(uri)
        row = decide(rows)
        if row is None:
            return None, False
        if row.request_id:
            for existing in rows:
                if existing.request_id == row.request_id and existing.model_name == row.model_name:
                    return existing, False
        row = replace(row, seq=(rows[-1].seq + 1) if rows else 1,
                      at=row.at or datetime.now(UTC).isoformat(timespec="seconds"))
        batch = pa.RecordBatch.from_pylist([row.to_arrow()], schema=SCHEMA)
        lake.append_stream(uri, pa.RecordBatchReader.from_batches(SCHEMA, [batch]),
                           {"action": row.action, "seq": row.seq, "run_id": row.airflow_run_id}, table)
        log.info("release_audit #%d (%s): %s %s %s -> %s by %s", row.seq, row.env, row.action, row.alias,
                 row.from_version, row.to_version, row.actor)
        return row, True

    return lake.retry_on_conflict(attempt, f"append to {uri}", attempts=12)


def format_rows(rows: list[AuditRow]) -> str:
    """A table for people (``cd4ml audit``)."""
    if not rows:
        return "no release audit rows yet"
    header = f"{'seq':>4}  {'at':<25} {'action':<10} {'alias':<10} {'from':>4} -> {'to':<4} {'actor':<16} reason / approval / run"
    lines = [header, "-" * len(header)]
    for r in rows:
        approval = f" approval={r.approval.get('decision')} by {r.approval.get('by')}" if r.approval else ""
        lines.append(
            f"{r.seq:>4}  {r.at:<25} {r.action:<10} {r.alias or '-':<10} {_v(r.from_version):>4} -> {_v(r.to_version):<4} "
            f"{r.actor:<16} {r.reason}{approval} run={r.airflow_run_id or '-'}"
            + (f" gate={r.gate_report}" if r.gate_report else "")
        )
    return "\n".join(lines)


def _v(version: int | None) -> str:
    return "-" if version is None else f"v{version}"
