"""The prod approval: Airflow's HITL ``ApprovalOperator`` that records a "no" where it is given.

On Approve the operator returns the response (XCom: chosen option, who, when, the reason field)
and ``promote`` moves the champion with it. On Reject, and on a timeout (the scheduler applies
the default, Reject, with no responder), the stock operator only skips ``promote`` and pushes no
XCom, so the decision would be lost: this subclass first writes it to the release ledger through
``tasks.release.release.record_decision`` (who, why, rejected or timeout), which also alerts on-call.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator


def responder(event: dict[str, Any]) -> str | None:
    user = event.get("responded_by_user")
    if isinstance(user, dict):
        return user.get("id") or user.get("name")
    return user or None


class ReleaseApprovalOperator(ApprovalOperator):
    """ApprovalOperator whose Reject / timeout is recorded in the release audit before downstream is skipped."""

    def __init__(self, *, gate_task_id: str = "evaluate_gate", **kwargs) -> None:
        super().__init__(**kwargs)
        self.gate_task_id = gate_task_id

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        chosen = event.get("chosen_options") or []
        if "error" not in event and chosen and chosen[0] == self.REJECT:
            self._record(context, event)
        return super().execute_complete(context=context, event=event)

    def _record(self, context, event: dict[str, Any]) -> None:
        from tasks.release.release import REJECTED, TIMEOUT, record_decision
        from tasks.settings import load_settings

        gate = context["ti"].xcom_pull(task_ids=self.gate_task_id)
        by = responder(event)
        decision = TIMEOUT if event.get("timedout") or not by else REJECTED
        reason = ((event.get("params_input") or {}).get("reason") or "").strip() or (
            "no answer within release.approval_timeout_hours" if decision == TIMEOUT else "rejected without a reason")
        result = record_decision(load_settings(), gate["candidate_version"], decision, actor=by or "timeout",
                                 reason=reason, gate_report=gate["report_path"], run_id=context["run_id"])
        self.log.info("%s", result.message)
