"""The release tail every DAG that produces a candidate shares: gate -> challenger -> (approval) -> champion.

``release_flow(candidate, test_data)`` wires, after a task that returned ``{"version": N}`` for a
registered candidate of this environment's model and a task that returned the test data
``{"curated_table", "curated_version"}``:

    evaluate_gate -> mark_challenger -> [approval_request -> approve] -> promote -> finish

``approve`` is Airflow's HITL ``ApprovalOperator`` (the Required Actions page; see
``cd4ml_airflow.approval``), present only where ``release.approval`` is ``required`` (decided at
parse time from the settings, like every structural choice). A reject skips ``promote``; no answer
within ``release.approval_timeout_hours`` takes the default, Reject, with no responder; every answer
is recorded (who, why) in the release ledger by the operator itself (a no is also alerted); ``promote``
moves only on a recorded ``approved`` by an allowed approver. ``finish`` runs
whatever happened before it and prints what the run changed, read back from the ledger;
``inputs_failed`` fails the run when the candidate or the test data could not be produced, and
``release_failed`` when the gate or ``promote`` failed (a refused promotion fails its run). Logic
lives in ``tasks.release.release`` and ``tasks.release.evaluate``; this module only wires.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, task

from cd4ml_airflow.assets import CHAMPION_MODEL
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.notifier import ApprovalRequestNotifier, origin_of
from cd4ml_airflow.steps.shape import step

APPROVAL_REQUIRED = SETTINGS.release.approval == "required"


@task
@step(says=lambda gate: (f"gate {gate.decision} for v{gate.candidate_version} vs champion v{gate.champion_version}: "
                         + " | ".join(gate.reasons) + f"  report: {gate.report_path}"))
def evaluate_gate(settings, context, candidate: dict, test_data: dict):
    """The candidate against this environment's champion on the frozen test split (tasks/release/evaluate.py)."""
    from tasks.release.evaluate import evaluate

    return evaluate(settings, candidate["version"], test_data["curated_table"], test_data["curated_version"])


@task
@step(says=lambda result: result.message)
def mark_challenger(settings, context, gate: dict):
    """A passing candidate becomes `challenger`; otherwise on-call hears why and nothing downstream runs."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tasks.alerting import policy as alert_policy
    from tasks.alerting.delivery import send
    from tasks.release.release import mark_challenger as mark

    if not gate["passed"]:
        send(alert_policy.gate_failed(origin_of(context, settings, settings.env), gate), settings)
        raise AirflowSkipException(alert_policy.gate_failure_message(gate))
    return mark(settings, gate["candidate_version"], gate, run_id=context["run_id"])


@task
@step(fail_fast=False)
def approval_request(settings, context, gate: dict) -> dict:
    """Subject and markdown body of the approval: metrics with per-class deltas, drift, data, reports."""
    from tasks.release.release_notes import approval_body

    subject = (f"Promote {gate['model_name']} v{gate['candidate_version']} to champion in {settings.env}? "
               f"(now v{gate['champion_version']})")
    return {"subject": subject, "body": approval_body(settings, gate)}


def _champion_event(result) -> dict:
    return {"model_name": result.model_name, "version": result.to_version}


@task(outlets=[CHAMPION_MODEL])
@step(says=lambda result: result.message, publishes=(CHAMPION_MODEL, _champion_event))
def promote(settings, context, gate: dict, challenger: dict):
    """Move `champion` to the challenger; publish the champion Asset (and announce it on `release.publish`).

    The gate and, where approval is required, the decision are read from what was recorded (the
    version's gate tags, the ledger's `approved` row), never from this run's XCom: an `approve`
    task marked success by hand recorded nothing, so the promotion is refused and alerted."""
    from cd4ml_airflow.champion_queue import announce_champion
    from cd4ml_airflow.context import run_actor
    from tasks.release.release import promote as move

    result = move(settings, gate["candidate_version"], gate, run_id=context["run_id"], actor=run_actor(context))
    announce_champion(settings, result)  # the downstream deployment hears of it (release.publish); never fails the task
    return result


@task(trigger_rule="all_done")
@step(fail_fast=False)
def finish(settings, context, gate: dict) -> dict:
    """What this run did to the aliases, read back from the release ledger (the truth)."""
    from tasks.release import audit

    rows = [r.to_dict() for r in audit.read(settings)
            if r.airflow_run_id == context["run_id"] and r.model_name == settings.registry.model_name]
    for row in rows:
        print(f"release audit #{row['seq']}: {row['action']} {row['alias']} v{row['from_version']} -> "
              f"v{row['to_version']} by {row['actor']}: {row['reason']}")
    outcome = rows[-1]["action"] if rows else f"gate_{(gate or {}).get('decision', 'missing')}"
    if not rows:
        print(f"nothing released: {outcome}")
    return {"outcome": outcome, "audit": rows}


@task(trigger_rule="one_failed")
def inputs_failed() -> None:
    """Fails the run when the candidate or the test data could not be produced (a failed step, or one upstream of
    them, e.g. drift blocking training): ``finish`` runs whatever happens, and a run whose leaves all succeed
    would otherwise count as a success. Decisions after the gate (a rejected approval) are not failures."""
    from airflow.sdk.exceptions import AirflowFailException  # no retry: nothing to retry here

    raise AirflowFailException("a step before the release failed (its log says why): nothing was evaluated or released")


@task(trigger_rule="one_failed")
def release_failed() -> None:
    """Fails the run when the gate or ``promote`` failed: a promotion refused (no recorded gate, no recorded
    approval by an allowed approver) is a failed release, although ``finish`` after it succeeds. A skipped
    ``promote`` (a failed gate decision, a rejected or timed-out approval) is a decision, not a failure."""
    from airflow.sdk.exceptions import AirflowFailException  # no retry: the refusal is recorded and alerted

    raise AirflowFailException("the release did not complete: promote failed or was refused (its log and alert say why)")


def release_flow(candidate, test_data) -> None:
    """Wire the shared release tail after ``candidate`` ({"version"}) and ``test_data`` (table, version)."""
    [candidate, test_data] >> inputs_failed()
    gate = evaluate_gate(candidate, test_data)
    challenger = mark_challenger(gate)
    moved = promote(gate, challenger)
    if APPROVAL_REQUIRED:
        from cd4ml_airflow.approval import ReleaseApprovalOperator

        request = approval_request(gate)
        approvers = [{"id": user, "name": user} for user in SETTINGS.release.approvers] or None
        approve = ReleaseApprovalOperator(
            task_id="approve",
            subject="{{ ti.xcom_pull(task_ids='approval_request')['subject'] }}",
            body="{{ ti.xcom_pull(task_ids='approval_request')['body'] }}",
            defaults="Reject",  # no answer in time = rejected: prod never moves without a person
            params={"reason": Param("", type="string", description="Why (recorded in the release audit)")},
            response_timeout=timedelta(hours=SETTINGS.release.approval_timeout_hours),
            assigned_users=approvers,
            notifiers=[ApprovalRequestNotifier()],
        )
        challenger >> request >> approve >> moved
    moved >> [finish(gate), release_failed()]
