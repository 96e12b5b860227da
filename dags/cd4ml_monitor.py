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

Task bodies: `plugins/cd4ml_airflow/steps/monitor.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.steps.monitor import load_feedback, monitor, request_retrain, retrain_gate


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
    result = monitor(load_feedback())
    retrain_gate(result) >> request_retrain(result)


cd4ml_monitor()
