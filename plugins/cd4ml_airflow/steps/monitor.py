"""cd4ml_monitor's tasks: feedback labels in, the champion's live metrics, and a retrain request on a breach."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.assets import RETRAIN_REQUEST
from cd4ml_airflow.context import logical_date_of
from cd4ml_airflow.steps.shape import skip_on, step


@task
@step(checks_params=True, says=lambda r: (
    f"feedback: {r.accepted} label(s) stored, {r.unchanged} unchanged, "
    f"rejected {r.rejected_by_reason or 'none'} (see {r.rejects_table})"))
def load_feedback(settings, context):
    """Join the feedback files' labels to the predictions; reject unknown images and classes."""
    from tasks.serving.feedback import load_feedback as load

    return load(settings, context["params"]["feedback_files"], run_id=context["run_id"],
                logical_date=logical_date_of(context))


@task
@step(says=lambda r: (
    f"monitoring {r.model_name} v{r.model_version}: {r.predictions} predictions, "
    f"{r.labelled} labelled; breached: {r.breached or 'none'}; dashboard: {r.dashboard}"))
def monitor(settings, context, feedback: dict):
    """Live metrics against the champion's test split; dashboard, explanations, alert."""
    from tasks.monitoring.monitor import monitor as run_monitor
    from tasks.release.release import NoChampionError

    with skip_on(NoChampionError):  # a new environment: nothing serves, so nothing to monitor
        return run_monitor(settings, run_id=context["run_id"], logical_date=logical_date_of(context))


@task.short_circuit
def retrain_gate(result: dict) -> bool:
    """Go on to the retrain request only when a breach asked for one (monitoring.retrain_on_breach)."""
    print("retraining requested: the labelled window is in the landing zone" if result["retrain_requested"]
          else "no retraining: " + ("nothing breached" if not result["breached"] else "retrain_on_breach is off"))
    return bool(result["retrain_requested"])


@task(outlets=[RETRAIN_REQUEST])
def request_retrain(result: dict, *, outlet_events=None) -> dict:
    """Emit the retrain-request Asset event (cd4ml_ingest runs on it)."""
    outlet_events[RETRAIN_REQUEST].extra = {
        "model_name": result["model_name"], "model_version": result["model_version"],
        "breached": result["breached"], "exported": result["exported"], "dashboard": result["dashboard"],
    }
    return {"requested": True, "exported": result["exported"]}
