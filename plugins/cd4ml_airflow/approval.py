"""The prod approval: Airflow's HITL ``ApprovalOperator`` whose every answer is a row of the release ledger.

Only the API server records an answer, and only from a user Airflow's auth manager lets answer
(``assigned_users`` = ``release.approvers``; ``cd4ml_airflow.auth`` resolves ``role:`` entries).
The operator writes each answer to the ledger through ``tasks.release.release.record_decision``:
Approve as ``approved`` (who, when, the approvers Airflow checked them against), which is what
``promote`` requires; Reject and a timeout (the scheduler applies the default, Reject, with no
responder) as ``rejected`` / ``timeout``, alerted, before the stock operator skips ``promote``. A
task state set by hand runs none of this, so it records no decision and ``promote`` refuses.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator


def responder(event: dict[str, Any]) -> str | None:
    """The answering user's name (under FAB the id is a row number nobody can put in settings)."""
    user = event.get("responded_by_user")
    if isinstance(user, dict):
        return user.get("name") or user.get("id")
    return user or None


class ReleaseApprovalOperator(ApprovalOperator):
    """ApprovalOperator whose Reject / timeout is recorded in the release audit before downstream is skipped."""

    def __init__(self, *, gate_task_id: str = "evaluate_gate", **kwargs) -> None:
        super().__init__(**kwargs)
        self.gate_task_id = gate_task_id

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        chosen = event.get("chosen_options") or []
        if "error" not in event and chosen and chosen[0] in (self.REJECT, self.APPROVE):
            self._record(context, event, approved=chosen[0] == self.APPROVE)
        return super().execute_complete(context=context, event=event)

    def _record(self, context, event: dict[str, Any], approved: bool) -> None:
        from tasks.release.release import APPROVED, REJECTED, TIMEOUT, record_decision
        from tasks.settings import load_settings

        gate = context["ti"].xcom_pull(task_ids=self.gate_task_id)
        by = responder(event)
        decision = APPROVED if approved else TIMEOUT if event.get("timedout") or not by else REJECTED
        reason = ((event.get("params_input") or {}).get("reason") or "").strip() or {
            TIMEOUT: "no answer within release.approval_timeout_hours", REJECTED: "rejected without a reason"}.get(
            decision, "")
        at = event.get("responded_at")
        extra = {"at": at.isoformat() if hasattr(at, "isoformat") else str(at), "airflow_task": self.task_id,
                 "assigned": [user["id"] for user in self.assigned_users or []]}
        result = record_decision(load_settings(), gate["candidate_version"], decision, actor=by or "timeout",
                                 reason=reason, gate_report=gate["report_path"], run_id=context["run_id"], extra=extra)
        self.log.info("%s", result.message)
