"""
### cd4ml_monitor: feedback labels + predictions -> live metrics, dashboard, explanations, alerts

1. **load_feedback**: true labels that arrived later (`*.csv` / `*.jsonl` in `storage.feedback_uri`,
   or the files of Param `feedback_files`) are joined to the predictions; a row naming an unknown
   image or an unknown class is rejected with its reason into `feedback_rejects`.
2. **monitor**: the champion's predictions of the last `monitoring.window_days` days against its own
   test split: live accuracy, recall per class, calibration (ECE), predicted-label distribution,
   confidence distribution; each rule needs an effect beyond its limit and a significant test.
   Results go to `monitoring_metrics`, PNG plots and an HTML dashboard (reports folder and an MLflow
   run), with Integrated Gradients overlays of the misclassified and low-confidence images. A
   breach is one `model_degraded` alert per model version (routed per environment); a healthy
   window resolves it. No champion yet: the run skips with the reason.
3. **retrain_gate -> request_retrain**: where `monitoring.retrain_on_breach` is set, a breach has
   copied the window's labelled images into the landing zone and emits the `retrain_request`
   Asset event: `cd4ml_ingest` runs on it, and curate and train follow through their Assets.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import RETRAIN_REQUEST
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs


@dag(
    schedule=SETTINGS.monitoring.schedule,
    params={
        "feedback_files": Param(
            None, type=["null", "array"], items={"type": "string"},
            description="Feedback files (CSV or JSONL with image and label) to load; empty = every *.csv and "
            "*.jsonl under the environment's feedback_uri.",
        ),
    },
    **dag_kwargs("cd4ml_monitor", ["serving", "monitoring"], __doc__),
)
def cd4ml_monitor():
    @task
    def load_feedback(**context) -> dict:
        """Join the feedback files' labels to the predictions; reject unknown images and classes."""
        from tasks.serving.feedback import load_feedback as load
        from tasks.settings import load_settings

        settings = load_settings()
        check_run_params(context, settings)
        with fail_fast_on_data_errors():
            result = load(settings, context["params"]["feedback_files"], run_id=context["run_id"],
                          logical_date=logical_date_of(context))
        print(f"feedback: {result.accepted} label(s) stored, {result.unchanged} unchanged, "
              f"rejected {result.rejected_by_reason or 'none'} (see {result.rejects_table})")
        return result.to_dict()

    @task
    def monitor(feedback: dict, **context) -> dict:
        """Live metrics against the champion's test split; dashboard, explanations, alert."""
        from airflow.sdk.exceptions import AirflowSkipException

        from tasks.models.champion import NoChampionError
        from tasks.monitoring.monitor import monitor as run_monitor
        from tasks.settings import load_settings

        with fail_fast_on_data_errors():
            try:
                result = run_monitor(load_settings(), run_id=context["run_id"], logical_date=logical_date_of(context))
            except NoChampionError as exc:  # a new environment: nothing serves, so nothing to monitor
                raise AirflowSkipException(str(exc)) from exc
        print(f"monitoring {result.model_name} v{result.model_version}: {result.predictions} predictions, "
              f"{result.labelled} labelled; breached: {result.breached or 'none'}; dashboard: {result.dashboard}")
        return result.to_dict()

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

    result = monitor(load_feedback())
    retrain_gate(result) >> request_retrain(result)


cd4ml_monitor()
