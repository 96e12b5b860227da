"""The promotion gate: candidate vs. champion on the same test split, through the serving path.

Both models are loaded as MLflow pyfuncs and fed the test split's raw image bytes, exactly as a
serving request would. The gate passes when the candidate reaches ``settings.gate.min_value``
and, if there is a champion, is at most ``settings.gate.max_regression`` worse than it.

The outcome is logged to the candidate's run (``test_accuracy``, ``test_macro_f1``,
``gate_passed`` ...) and written as ``<reports>/gate/<candidate_run_id>.json``. Nothing in the
report depends on the wall clock, so re-evaluating the same inputs rewrites the same file.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import mlflow
import pandas as pd
from mlflow import MlflowClient
from sklearn.metrics import accuracy_score, f1_score

from tasks.errors import DataError
from tasks.registry import (
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    TAG_MODEL_URI,
    champion_model_version,
    mlflow_client,
)
from tasks.reports import write_json
from tasks.settings import Settings
from tasks.train import load_split_rows

log = logging.getLogger(__name__)

METRICS = ("accuracy", "macro_f1")


class NoTestDataError(DataError, ValueError):
    """The curated version has no test rows: there is nothing to gate on."""


@dataclass(frozen=True)
class GateResult:
    passed: bool
    metric: str
    candidate_value: float
    champion_version: int | None
    champion_value: float | None
    threshold: float
    reasons: list[str]
    report_path: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(y_true: list[str], y_pred: list[str]) -> dict[str, float]:
    """Accuracy and macro F1 (over the labels present in truth or prediction)."""
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
    }


def _predict_labels(model_uri: str, images: list[bytes]) -> list[str]:
    model = mlflow.pyfunc.load_model(model_uri)
    out = model.predict(pd.DataFrame({"image": images}))
    return [str(label) for label in out["label"].tolist()]


def _candidate_model_uri(client: MlflowClient, run_id: str) -> tuple[str, dict[str, str]]:
    run = client.get_run(run_id)
    if run.info.status != "FINISHED":
        raise ValueError(f"candidate run {run_id} is {run.info.status}, not FINISHED")
    uri = run.data.tags.get(TAG_MODEL_URI)
    if not uri:
        raise ValueError(f"candidate run {run_id} has no {TAG_MODEL_URI} tag: it logged no model")
    return uri, run.data.tags


def _log_to_run(client: MlflowClient, run_id: str, metrics: dict[str, float], tags: dict[str, str]) -> None:
    """Log gate metrics and tags to the candidate run, skipping values it already holds."""
    data = client.get_run(run_id).data
    for key, value in metrics.items():
        if data.metrics.get(key) != value:
            client.log_metric(run_id, key, value)
    for key, value in tags.items():
        if data.tags.get(key) != value:
            client.set_tag(run_id, key, value)


def evaluate(settings: Settings, candidate_run_id: str, curated_table: str, curated_version: int) -> GateResult:
    """Score the candidate (and the champion, if any) on the test split and apply the gate."""
    gate = settings.gate
    metric = gate.metric
    curated_version = int(curated_version)
    client = mlflow_client(settings)
    candidate_uri, candidate_tags = _candidate_model_uri(client, candidate_run_id)

    rows = load_split_rows(curated_table, curated_version, ("test",))
    if rows.num_rows == 0:
        raise NoTestDataError(f"{curated_table}@v{curated_version} has no test rows: cannot gate run {candidate_run_id}")
    images = rows["image"].to_pylist()
    truth = [str(label) for label in rows["label"].to_pylist()]

    candidate_scores = score(truth, _predict_labels(candidate_uri, images))
    candidate_value = candidate_scores[metric]

    champion = champion_model_version(settings, client)
    champion_version = int(champion.version) if champion is not None else None
    champion_scores: dict[str, float] | None = None
    champion_uri = None
    if champion is not None:
        champion_uri = f"models:/{settings.registry.model_name}/{champion.version}"
        champion_scores = score(truth, _predict_labels(champion_uri, images))
    champion_value = champion_scores[metric] if champion_scores is not None else None

    reasons: list[str] = []
    passed = True
    if candidate_value >= gate.min_value:
        reasons.append(f"test {metric} {candidate_value:.4f} meets the floor min_value {gate.min_value:.4f}.")
    else:
        passed = False
        reasons.append(f"test {metric} {candidate_value:.4f} is below the floor min_value {gate.min_value:.4f}.")
    threshold = gate.min_value
    if champion_value is None:
        reasons.append("There is no champion to compare with; only the floor applies.")
    else:
        floor = champion_value - gate.max_regression
        threshold = max(threshold, floor)
        if candidate_value >= floor:
            reasons.append(
                f"test {metric} {candidate_value:.4f} is within max_regression {gate.max_regression:.4f} of "
                f"champion version {champion_version} ({champion_value:.4f}); needed >= {floor:.4f}."
            )
        else:
            passed = False
            reasons.append(
                f"test {metric} {candidate_value:.4f} regresses more than max_regression {gate.max_regression:.4f} "
                f"from champion version {champion_version} ({champion_value:.4f}); needed >= {floor:.4f}."
            )

    report_path = settings.reports_path / "gate" / f"{candidate_run_id}.json"
    report = {
        "env": settings.env,
        "passed": passed,
        "metric": metric,
        "threshold": threshold,
        "min_value": gate.min_value,
        "max_regression": gate.max_regression,
        "reasons": reasons,
        "candidate": {
            "run_id": candidate_run_id,
            "model_uri": candidate_uri,
            "trained_on": {
                "curated_table": candidate_tags.get(TAG_CURATED_TABLE),
                "curated_version": candidate_tags.get(TAG_CURATED_VERSION),
            },
            "scores": candidate_scores,
        },
        "champion": None
        if champion is None
        else {
            "registered_model": settings.registry.model_name,
            "alias": settings.registry.champion_alias,
            "version": champion_version,
            "run_id": champion.run_id,
            "model_uri": champion_uri,
            "scores": champion_scores,
        },
        "test_data": {
            "curated_table": curated_table,
            "curated_version": curated_version,
            "split": "test",
            "rows": rows.num_rows,
        },
    }
    write_json(report_path, report)

    metrics = {f"test_{name}": value for name, value in candidate_scores.items()}
    metrics["gate_passed"] = 1.0 if passed else 0.0
    metrics["gate_threshold"] = float(threshold)
    if champion_scores is not None:
        metrics.update({f"champion_test_{name}": value for name, value in champion_scores.items()})
    _log_to_run(
        client,
        candidate_run_id,
        metrics,
        {
            "cd4ml.gate.passed": str(passed).lower(),
            "cd4ml.gate.champion_version": str(champion_version),
            "cd4ml.gate.test_table": curated_table,
            "cd4ml.gate.test_version": str(curated_version),
        },
    )
    client.log_artifact(candidate_run_id, str(report_path), artifact_path="gate")

    result = GateResult(
        passed=passed,
        metric=metric,
        candidate_value=candidate_value,
        champion_version=champion_version,
        champion_value=champion_value,
        threshold=float(threshold),
        reasons=reasons,
        report_path=str(report_path),
    )
    log.info("gate %s for run %s: %s", "PASSED" if passed else "FAILED", candidate_run_id, " ".join(reasons))
    return result
