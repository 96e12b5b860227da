"""Production monitoring of the champion: predictions meet the labels that came back.

``monitor(settings, run_id=..., logical_date=...)`` runs in named phases:

1. **champion**: the environment's champion, pinned (``NoChampionError`` before any work);
2. **reference**: the champion on its own test split (true and predicted labels, confidences),
   computed once per model version and kept next to the reports;
3. **window**: this model version's predictions from the scoring runs of the ``window_days`` up
   to the logical date, joined to the feedback labels (``tasks.serving.feedback``);
4. **rules**: live accuracy, per-class recall, calibration, predicted-label distribution and
   confidence distribution against the reference (``tasks.monitoring.live_metrics``); a shift that
   the labels show harmless is reported (``shifted``), not alerted;
5. **explanations**: Integrated Gradients overlays for the misclassified and the low-confidence
   images of the window (``tasks.serving.explain``);
6. **record**: the ``monitoring_metrics`` Delta table (one row per metric, keyed by model version,
   window end and metric: a re-run replaces, never duplicates), plots (PNG) and an HTML
   dashboard in the reports folder, the same files and metrics in one MLflow run per window;
7. **alert**: a breach is one ``model_degraded`` alert per model version (routed per environment;
   a repeated breach is not sent again while the incident is open); a window judged healthy
   again resolves it. With ``monitoring.retrain_on_breach`` a breach also copies the window's
   labelled images into the landing zone (``<label>/feedback-<key>``: the images the champion
   got wrong become training data) and ``retrain_requested`` tells the DAG to emit the
   retrain-request Asset event, on which ``cd4ml_ingest`` runs (curate and train follow).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.data import lake
from tasks.files import write_json
from tasks.models.champion import ServingModel, serving_model
from tasks.monitoring.live_metrics import Metric, Reference, alarms, evaluate_window
from tasks.settings import Settings

log = logging.getLogger(__name__)

METRICS_TABLE = "monitoring_metrics"
REFERENCE_LIMIT = 5000  # test images the reference is computed on (sha256 order: deterministic)
TAG_MONITOR_KEY = "cd4ml.monitor_key"
METRICS_SCHEMA = pa.schema([
    pa.field("metric_key", pa.string(), nullable=False),  # model:vN:window_end:metric
    pa.field("env", pa.string(), nullable=False),
    pa.field("model_name", pa.string(), nullable=False),
    pa.field("model_version", pa.int64(), nullable=False),
    pa.field("window_start", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("window_end", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("metric", pa.string(), nullable=False),
    pa.field("value", pa.float64(), nullable=True),
    pa.field("reference", pa.float64(), nullable=True),
    pa.field("limit", pa.float64(), nullable=True),
    pa.field("n", pa.int64(), nullable=False),
    pa.field("p_value", pa.float64(), nullable=True),
    pa.field("judged", pa.bool_(), nullable=False),
    pa.field("breached", pa.bool_(), nullable=False),
    pa.field("detail", pa.string(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
])


@dataclass(frozen=True)
class MonitorResult:
    env: str
    model_name: str
    model_version: int
    window_start: str
    window_end: str
    predictions: int
    labelled: int
    metrics: list[dict[str, Any]]
    breached: list[str]  # what degrades the champion: alerted (once per version), retrain on request
    shifted: list[str]  # label/confidence shifts the judged accuracy shows harmless: reported only
    dashboard: str
    plots: list[str]
    explanations: list[str]
    explanations_skipped: list[list[str]] = field(default_factory=list)
    metrics_table: str = ""
    mlflow_run_id: str = ""
    alerted: bool = False
    resolved: bool = False
    retrain_requested: bool = False
    exported: int = 0  # labelled images copied to the landing zone for the retrain

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Window:
    rows: list[dict[str, Any]]
    truth: list[str | None]

    @property
    def predicted(self) -> list[str]:
        return [r["label"] for r in self.rows]

    @property
    def confidence(self) -> list[float]:
        return [float(r["confidence"]) for r in self.rows]


def report_dir(settings: Settings, model: ServingModel, window_end: datetime) -> Path:
    return settings.reports_path / "monitoring" / model.name / f"v{model.version}" / window_end.strftime("%Y-%m-%d")


# --------------------------------------------------------------------------- 2. reference


def champion_reference(settings: Settings, model: ServingModel, predictor: Any) -> Reference:
    """The champion on its own test split, and its predicted labels on all its training data (cached per version)."""
    path = settings.reports_path / "monitoring" / model.name / f"v{model.version}" / "reference-v2.json"
    if path.exists():
        return _read_reference(path)
    from tasks.models.registry import get_model_version, mlflow_client, trained_on
    from tasks.training.data_cache import load_split_rows

    table, version = trained_on(get_model_version(mlflow_client(settings), model.name, model.version))
    classes = list(predictor.classes)

    def predicted(splits: tuple[str, ...]) -> tuple[list[str], list[str], list[float]]:
        rows = load_split_rows(table, version, splits, columns=("sha256", "image", "label", "split"))
        rows = rows.slice(0, REFERENCE_LIMIT)  # sha256 order: a deterministic sample of a large version
        if not rows.num_rows:
            return [], [], []
        probs = np.concatenate([predictor.predict_proba(rows.column("image").slice(i, 512).to_pylist())
                                for i in range(0, rows.num_rows, 512)])
        return ([str(x) for x in rows.column("label").to_pylist()], [classes[i] for i in probs.argmax(axis=1).tolist()],
                [round(float(c), 6) for c in probs.max(axis=1)])

    truth, test_predicted, confidence = predicted(("test",))
    reference = Reference(classes=classes, truth=truth, predicted=test_predicted, confidence=confidence,
                          population=predicted(("train", "val", "test"))[1])
    write_json(path, {**reference.to_dict(), "test_table": table, "test_version": version})
    return _read_reference(path)


def _read_reference(path: Path) -> Reference:
    return Reference(**{k: v for k, v in json.loads(path.read_text()).items() if k in Reference.__dataclass_fields__})


# --------------------------------------------------------------------------- 3. window


def window_rows(settings: Settings, model: ServingModel, start: datetime, end: datetime) -> _Window:
    from tasks.serving.feedback import labelled
    from tasks.serving.score import predictions_of

    rows = predictions_of(settings, model, since=start, until=end,
                          columns=["image_key", "source_uri", "label", "confidence"]).to_pylist()
    labels = labelled(settings)
    return _Window(rows, [labels.get(r["image_key"]) for r in rows])


# --------------------------------------------------------------------------- 5. explanations


def _selected(window: _Window, settings: Settings) -> list[int]:
    """Misclassified first (most confident mistakes first), then the least confident; one per image."""
    wrong = [i for i, (r, t) in enumerate(zip(window.rows, window.truth)) if t is not None and t != r["label"]]
    wrong.sort(key=lambda i: (-window.rows[i]["confidence"], window.rows[i]["image_key"]))
    unsure = [i for i, r in enumerate(window.rows) if r["confidence"] < settings.monitoring.low_confidence and i not in wrong]
    unsure.sort(key=lambda i: (window.rows[i]["confidence"], window.rows[i]["image_key"]))
    chosen, keys = [], set()
    for i in wrong + unsure:
        if window.rows[i]["image_key"] not in keys:
            keys.add(window.rows[i]["image_key"])
            chosen.append(i)
    return chosen[: settings.monitoring.max_explanations]


def explain_window(settings: Settings, window: _Window, predictor: Any, out: Path) -> tuple[list[str], list[list[str]]]:
    """Overlays for the selected images of the window; an image that cannot be read again is reported."""
    import fsspec

    from tasks.serving.explain import explain, write_index

    images, keys, labels, skipped = [], [], [], []
    for i in _selected(window, settings):
        row = window.rows[i]
        try:
            with fsspec.open(row["source_uri"], "rb") as fh:
                images.append(fh.read())
        except OSError as exc:
            skipped.append([row["image_key"], f"{row['source_uri']} cannot be read any more: {exc}"])
            continue
        keys.append(row["image_key"])
        labels.append(window.truth[i])
    result = explain(predictor, images, keys, out / "explanations", labels=labels)
    skipped += [list(s) for s in result.skipped]
    if result.explanations or skipped:
        write_index(result.explanations, out / "explanations", skipped=[tuple(s) for s in skipped],
                    title="Misclassified and low-confidence predictions")
    return [str(e.path) for e in result.explanations], skipped


# --------------------------------------------------------------------------- 6. record


def _metric_rows(settings: Settings, model: ServingModel, metrics: list[Metric], start: datetime, end: datetime,
                 run_id: str) -> pa.Table:
    day = end.strftime("%Y-%m-%d")
    return pa.Table.from_pylist([{
        "metric_key": f"{model.name}:v{model.version}:{day}:{m.name}", "env": settings.env,
        "model_name": model.name, "model_version": model.version, "window_start": start, "window_end": end,
        "metric": m.name, "value": m.value, "reference": m.reference, "limit": m.limit, "n": m.n,
        "p_value": m.p_value, "judged": m.judged, "breached": m.breached, "detail": m.detail, "run_id": run_id,
    } for m in metrics], schema=METRICS_SCHEMA)


def _log_to_mlflow(settings: Settings, model: ServingModel, metrics: list[Metric], out: Path, day: str,
                   run_id: str) -> str:
    """One MLflow run per model version and window (a re-run logs into the same run)."""
    from tasks.models.registry import ensure_experiment, mlflow_client

    client = mlflow_client(settings)
    experiment = ensure_experiment(settings, client)
    key = f"{model.name}:v{model.version}:{day}"
    found = client.search_runs([experiment], filter_string=f"tags.`{TAG_MONITOR_KEY}` = '{key}'", max_results=1)
    if found:
        mlflow_run = found[0].info.run_id
    else:
        mlflow_run = client.create_run(experiment, run_name=f"monitor {model.name} v{model.version} {day}", tags={
            TAG_MONITOR_KEY: key, "cd4ml.kind": "monitoring", "cd4ml.env": settings.env,
            "cd4ml.model_version": str(model.version), "cd4ml.airflow_run_id": run_id}).info.run_id
    for m in metrics:
        if m.value is not None and np.isfinite(m.value):
            client.log_metric(mlflow_run, f"live_{m.name.replace(':', '_')}", float(m.value))
    client.log_artifacts(mlflow_run, str(out), artifact_path="monitoring")
    client.set_terminated(mlflow_run)
    return mlflow_run


def export_labelled(settings: Settings, window: _Window) -> int:
    """The window's labelled images into the landing zone (``<label>/feedback-<key>``): new training data.

    Idempotent by name (the image key); ingest de-duplicates by content anyway. An image that
    cannot be read again is logged and left out.
    """
    import fsspec
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(settings.storage.landing_uri)
    written = 0
    for row, label in zip(window.rows, window.truth):
        if label is None:
            continue
        suffix = Path(row["source_uri"]).suffix.lower() or ".png"
        target = f"{root.rstrip('/')}/{label}/feedback-{row['image_key'][:24]}{suffix}"
        if fs.exists(target):
            continue
        try:
            with fsspec.open(row["source_uri"], "rb") as fh:
                data = fh.read()
        except OSError as exc:
            log.warning("feedback image %s cannot be read, not exported: %s", row["source_uri"], exc)
            continue
        fs.makedirs(f"{root.rstrip('/')}/{label}", exist_ok=True)
        with fs.open(target, "wb") as out:
            out.write(data)
        written += 1
    return written


# --------------------------------------------------------------------------- 7. alert


def _alert(settings: Settings, model: ServingModel, breached: list[Metric], dashboard: Path, run_id: str) -> tuple[bool, bool]:
    """(alerted, resolved): one model_degraded incident per model version, resolved when healthy again."""
    from tasks.alerting import delivery, incidents
    from tasks.alerting.alert import Alert

    dedup = f"{settings.env}:model_degraded:{model.name}:v{model.version}"
    if breached:
        names = ", ".join(m.name for m in breached)
        deliveries = delivery.send(Alert(
            summary=f"{model.name} v{model.version} degraded in {settings.env}: {names}",
            severity=settings.monitoring.severity, source="monitor", env=settings.env, dedup_key=dedup,
            kind="model_degraded", dag_id="cd4ml_monitor", run_id=run_id, error=breached[0].detail,
            details={"breached": [m.to_dict() for m in breached], "dashboard": str(dashboard)},
            versions={"model": f"{model.name} v{model.version}"}), settings)
        return not any(d.suppressed for d in deliveries), False
    resolved = False
    for incident in incidents.open_incidents(settings, kinds=frozenset({"model_degraded"})):
        if incident.dedup_key == dedup:
            resolved |= bool(delivery.resolve_incident(settings, incident, run_id, "monitor: every rule within limits"))
    return False, resolved


# --------------------------------------------------------------------------- the step


def monitor(settings: Settings, *, run_id: str, logical_date: str | datetime) -> MonitorResult:
    """Monitor the champion over the window ending at ``logical_date`` (module doc)."""
    from tasks.models.loading import load_predictor
    from tasks.monitoring.dashboard import write_dashboard

    model = serving_model(settings)  # 1
    end = datetime.fromisoformat(lake.normalise_logical_date(logical_date))
    start = end - timedelta(days=settings.monitoring.window_days)
    predictor = load_predictor(settings, model.uri)
    reference = champion_reference(settings, model, predictor)  # 2
    window = window_rows(settings, model, start, end)  # 3
    metrics = evaluate_window(window.predicted, window.confidence, window.truth, reference, settings.monitoring)  # 4
    breached, shifted = alarms(metrics, settings.monitoring)
    out = report_dir(settings, model, end)
    explanations, skipped = explain_window(settings, window, predictor, out)  # 5
    plots, dashboard = write_dashboard(out, settings, model, metrics, reference, window.predicted,  # 6
                                       window.confidence, window.truth, start, end, breached, shifted,
                                       explanations_index=(out / "explanations" / "index.html"))
    write_json(out / "metrics.json", {"env": settings.env, "model": model.to_dict(), "window_start": start,
                                      "window_end": end, "metrics": [m.to_dict() for m in metrics]})
    uri = settings.table_uri(METRICS_TABLE)
    table = _metric_rows(settings, model, metrics, start, end, run_id)
    lake.upsert_batches(uri, lambda: table.to_batches(), METRICS_SCHEMA, "metric_key",
                        {"run_id": run_id, "step": "monitor", "logical_date": end.isoformat()})
    mlflow_run = _log_to_mlflow(settings, model, metrics, out, end.strftime("%Y-%m-%d"), run_id)
    alerted, resolved = _alert(settings, model, breached, dashboard, run_id)  # 7
    retrain = bool(breached) and settings.monitoring.retrain_on_breach
    exported = export_labelled(settings, window) if retrain else 0
    result = MonitorResult(
        env=settings.env, model_name=model.name, model_version=model.version, window_start=start.isoformat(),
        window_end=end.isoformat(), predictions=len(window.rows), labelled=sum(t is not None for t in window.truth),
        metrics=[m.to_dict() for m in metrics], breached=[m.name for m in breached],
        shifted=[m.name for m in shifted], dashboard=str(dashboard),
        plots=[str(p) for p in plots], explanations=explanations, explanations_skipped=skipped, metrics_table=uri,
        mlflow_run_id=mlflow_run, alerted=alerted, resolved=resolved,
        retrain_requested=retrain, exported=exported,
    )
    log.info("monitoring %s v%s: %d predictions, %d labelled, breached: %s", model.name, model.version,
             result.predictions, result.labelled, result.breached or "none")
    return result
