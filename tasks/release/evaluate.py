"""The automatic gate: a registered candidate against this environment's champion, decided so noise cannot fool it.

Rules, in the order the report lists them (settings: ``gate`` of the environment):

* **Frozen test set.** The test split of this environment's curated table at an explicit
  version, minus every image either model trained or validated on. What each saw is read from its
  own verified files (``seen_images.npy``, ``tasks.models.seen_images``), never from another
  deployment's lake; a version logged before that file existed falls back to the train and val
  splits of the table its lineage names when that table is reachable, and is otherwise a
  ``SeenImagesUnavailableError`` (no report: the removal is never skipped). Splits never move once
  recorded (tasks/curation/curate.py), so this removes nothing in deploy-code; in deploy-model the
  candidate was trained on another environment's data, and the overlap is removed and counted.
  A model version without lineage tags is a ``LineageError``: nobody can say what it was trained on.
* **Too small to decide.** Fewer than ``min_test_images`` images left: decision ``undecided``;
  nothing is promoted and the report says why.
* **Floor.** The candidate's ``metric`` reaches ``min_value``.
* **Not worse (paired).** Both models classify the same images. With b = images only the
  champion gets right and c = images only the candidate gets right, McNemar's exact test asks
  how likely b or more of the b + c discordant images go the champion's way if both models
  were equally good (binomial, p = 1/2, one-sided). ``p < alpha`` = significantly worse. A
  drop in accuracy beyond ``max_regression`` fails too, however small the test set (a
  non-inferiority margin). An equally good retrain differs from the champion only by noise,
  which the test punishes at rate at most ``alpha``; bench/README.md gives the measured
  false-reject rate over seeded retrains.
  A paired bootstrap 95% interval of the accuracy difference is reported alongside.
* **Per-class recall.** No class with at least ``min_class_support`` test images loses more
  than ``max_class_recall_drop`` recall against the champion where that loss is significant
  (the same exact one-sided test on that class's images only one model gets right, at
  ``alpha``): with 20 test images in a class, 3 images are 15 points, which equally good
  retrains trade by chance; the bench measured that rule alone rejecting equal retrains.
* **Verified files.** Each model's files are checked against the manifest recorded at
  registration before it is loaded (``tasks.models.integrity``); a mismatch stops the gate with
  a ``ModelIntegrityError`` naming the files (and one ``model_tampered`` alert), no report.
* **Smoke, latency, size.** The registered pyfunc, its verified copy, is loaded in a fresh
  Python process (no project code on its path), classifies real PNG and JPEG bytes re-encoded
  from test images, times ``latency_samples`` single-image predictions (p95 within
  ``max_latency_p95_ms``) and sums its artifacts (within ``max_model_mb``).
* **Never again automatically.** A version tagged ``cd4ml.rolled_back`` fails.

The report (``<reports>/gate/<model>-v<candidate>-vs-<champion>-<table>-v<test version>.json``)
names the model, the champion it was compared with and the test data; it is logged to the
candidate's MLflow run and its path tagged on the model version. Nothing in the decision
depends on the wall clock but the latency check: the same inputs give the same verdict on every other check.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from scipy.stats import binomtest
from sklearn.metrics import accuracy_score, f1_score

from tasks.data import lake
from tasks.errors import DataError
from tasks.files import write_json
from tasks.models import champion as champions
from tasks.models.integrity import UnverifiableModelError, verified_model
from tasks.models.registry import (
    TAG_ROLLED_BACK,
    LineageError,
    get_model_version,
    mlflow_client,
    set_version_tags,
    trained_on,
)
from tasks.models.seen_images import SeenImagesUnavailableError, seen_by
from tasks.settings import Settings
from tasks.training.data_cache import load_split_rows

log = logging.getLogger(__name__)

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
BOOTSTRAP_RESAMPLES = 2000


class NoTestDataError(DataError, ValueError):
    """The curated version has no test rows: there is nothing to gate on."""


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class GateResult:
    decision: str  # pass | fail | undecided
    model_name: str
    candidate_version: int
    champion_version: int | None
    metric: str
    candidate_value: float | None
    champion_value: float | None
    test_table: str
    test_version: int
    test_images: int
    checks: list[Check] = field(default_factory=list)
    report_path: str = ""

    @property
    def passed(self) -> bool:
        return self.decision == PASS

    @property
    def reasons(self) -> list[str]:
        return [f"{'ok' if c.passed else 'FAILED'} {c.name}: {c.detail}" for c in self.checks]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "reasons": self.reasons}


# --------------------------------------------------------------------------- statistics


def score(y_true: list[str], y_pred: list[str]) -> dict[str, float]:
    """Accuracy and macro F1 (over the labels present in truth or prediction)."""
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
    }


def per_class_recall(y_true: list[str], y_pred: list[str]) -> dict[str, dict[str, float]]:
    """Recall and support per true class, by class name."""
    truth, pred = np.asarray(y_true), np.asarray(y_pred)
    out = {}
    for name in sorted(set(y_true)):
        mask = truth == name
        out[name] = {"recall": float((pred[mask] == name).mean()), "support": int(mask.sum())}
    return out


def _p_worse(only_champion_right: int, only_candidate_right: int) -> float:
    """Exact one-sided test on the discordant images: how likely this many or more go the champion's way by chance."""
    n = only_champion_right + only_candidate_right
    return float(binomtest(only_champion_right, n, 0.5, alternative="greater").pvalue) if n else 1.0


def class_comparison(y_true: list[str], candidate: list[str], champion: list[str]) -> dict[str, dict[str, Any]]:
    """Per true class: recalls, delta, net images lost and the exact one-sided test on that class's discordant images."""
    truth = np.asarray(y_true)
    cand_ok = np.asarray(candidate) == truth
    champ_ok = np.asarray(champion) == truth
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(y_true)):
        mask = truth == name
        b = int((champ_ok & ~cand_ok & mask).sum())
        c = int((cand_ok & ~champ_ok & mask).sum())
        support = int(mask.sum())
        out[name] = {
            "support": support,
            "candidate": float(cand_ok[mask].mean()),
            "champion": float(champ_ok[mask].mean()),
            "delta": (c - b) / support,
            "net_losses": b - c,
            "p_value_candidate_worse": _p_worse(b, c),
        }
    return out


def paired_comparison(y_true: list[str], candidate: list[str], champion: list[str], seed: int = 0) -> dict[str, Any]:
    """McNemar exact (one-sided: is the candidate worse?) and a paired bootstrap interval of the difference."""
    truth = np.asarray(y_true)
    cand_ok = np.asarray(candidate) == truth
    champ_ok = np.asarray(champion) == truth
    b = int((champ_ok & ~cand_ok).sum())  # only the champion right
    c = int((cand_ok & ~champ_ok).sum())  # only the candidate right
    diff = cand_ok.astype(np.int8) - champ_ok.astype(np.int8)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(diff), size=(BOOTSTRAP_RESAMPLES, len(diff)))
    boot = diff[draws].mean(axis=1)
    return {
        "n": len(truth),
        "only_champion_right": b,
        "only_candidate_right": c,
        "accuracy_difference": float(diff.mean()),
        "p_value_candidate_worse": _p_worse(b, c),
        "bootstrap_95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
    }


# --------------------------------------------------------------------------- the test set


def frozen_test_set(test_table: str, test_version: int, seen: set[str]) -> tuple[pa.Table, int]:
    """The test split minus every image in ``seen`` (what the models trained or validated on); returns (rows, removed)."""
    rows = load_split_rows(test_table, test_version, ("test",))
    if rows.num_rows == 0:
        raise NoTestDataError(f"{test_table}@v{test_version} has no test rows: there is nothing to gate on")
    if not seen:
        return rows, 0
    keep = pc.invert(pc.is_in(rows["sha256"], value_set=pa.array(sorted(seen))))
    kept = rows.filter(keep)
    return kept, rows.num_rows - kept.num_rows


# --------------------------------------------------------------------------- the smoke test

_SMOKE = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import mlflow, pandas as pd
    request = json.loads(sys.stdin.read())
    local = mlflow.artifacts.download_artifacts(artifact_uri=request["model_uri"])
    size = sum(p.stat().st_size for p in Path(local).rglob("*") if p.is_file())
    model = mlflow.pyfunc.load_model(local)
    out = {"size_bytes": size, "predictions": {}}
    for kind, paths in request["images"].items():
        images = [Path(p).read_bytes() for p in paths]
        out["predictions"][kind] = [str(x) for x in model.predict(pd.DataFrame({"image": images}))["label"].tolist()]
    one = [Path(p).read_bytes() for p in request["images"]["png"]]
    model.predict(pd.DataFrame({"image": one[:1]}))  # warm-up
    times = []
    for i in range(request["samples"]):
        frame = pd.DataFrame({"image": [one[i % len(one)]]})
        start = time.perf_counter()
        model.predict(frame)
        times.append((time.perf_counter() - start) * 1000.0)
    out["latency_ms"] = times
    print("CD4ML_SMOKE " + json.dumps(out))
    """
)


def _encoded(images: list[bytes], fmt: str) -> list[bytes]:
    from PIL import Image

    out = []
    for data in images:
        with Image.open(io.BytesIO(data)) as img:
            buf = io.BytesIO()
            img.convert("RGB" if fmt == "JPEG" and img.mode not in ("L", "RGB") else img.mode).save(buf, format=fmt)
            out.append(buf.getvalue())
    return out


def smoke_test(settings: Settings, model_uri: str, images: list[bytes], classes: set[str],
               local: Path | None = None) -> dict[str, Any]:
    """Load ``model_uri`` (its verified copy, ``local`` when the caller holds one) in a fresh interpreter,
    classify PNG and JPEG bytes, time single predictions."""
    gate = settings.gate
    sample = images[: max(1, min(len(images), 16))]
    with contextlib.ExitStack() as stack:
        try:
            local = local if local is not None else stack.enter_context(verified_model(settings, model_uri))[0]
        except (MlflowException, UnverifiableModelError) as exc:  # not found or not downloaded: the check fails
            return {"ok": False, "error": f"cannot download {model_uri}: {str(exc).splitlines()[0][:300]}"}
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="cd4ml-smoke-"))
        paths: dict[str, list[str]] = {}
        for kind, fmt in (("png", "PNG"), ("jpeg", "JPEG")):
            paths[kind] = []
            for i, data in enumerate(_encoded(sample, fmt)):
                path = Path(tmp) / f"{i}.{kind}"
                path.write_bytes(data)
                paths[kind].append(str(path))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a consumer's process, not ours
        env["MLFLOW_TRACKING_URI"] = settings.tracking_uri
        env["MLFLOW_REGISTRY_URI"] = settings.tracking_uri
        request = {"model_uri": str(local), "images": paths, "samples": gate.latency_samples}
        try:
            done = subprocess.run(
                [sys.executable, "-c", _SMOKE], input=json.dumps(request), capture_output=True, text=True,
                cwd=tmp, env=env, timeout=gate.smoke_timeout_s,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"no answer within {gate.smoke_timeout_s} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("CD4ML_SMOKE ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "error": f"exit {done.returncode}: {tail[0][:500]}"}
    out = json.loads(lines[-1][len("CD4ML_SMOKE "):])
    unknown = sorted({p for preds in out["predictions"].values() for p in preds} - classes)
    answered = all(len(out["predictions"].get(k, [])) == len(sample) for k in ("png", "jpeg"))
    return {
        "ok": answered and not unknown,
        "error": None if answered and not unknown else f"unknown labels {unknown}" if unknown else "missing answers",
        "images_per_format": len(sample),
        "png_jpeg_agreement": float(np.mean([a == b for a, b in zip(out["predictions"]["png"], out["predictions"]["jpeg"])])),
        "latency_p50_ms": float(np.percentile(out["latency_ms"], 50)),
        "latency_p95_ms": float(np.percentile(out["latency_ms"], 95)),
        "model_mb": out["size_bytes"] / 1e6,
    }


# --------------------------------------------------------------------------- the gate


def _predict(local: Path, images: list[bytes]) -> list[str]:
    """Labels from the verified copy in ``local`` (loaded from there, never from the URI again)."""
    import mlflow

    model = mlflow.pyfunc.load_model(str(local))
    return [str(label) for label in model.predict(pd.DataFrame({"image": images}))["label"].tolist()]


def comparison_checks(settings: Settings, truth: list[str], cand: list[str], champ: list[str],
                       champion_version: int) -> tuple[list[Check], dict[str, Any]]:
    gate = settings.gate
    paired = paired_comparison(truth, cand, champ)
    diff = paired["accuracy_difference"]
    low, high = paired["bootstrap_95"]
    checks = [
        Check("non_inferiority", diff >= -gate.max_regression,
              f"accuracy difference {diff:+.4f} vs champion v{champion_version} (95% paired bootstrap "
              f"[{low:+.4f}, {high:+.4f}]); allowed >= {-gate.max_regression:+.4f}"),
        Check("mcnemar", paired["p_value_candidate_worse"] >= gate.alpha,
              f"only champion right {paired['only_champion_right']}, only candidate right "
              f"{paired['only_candidate_right']}: one-sided exact p = {paired['p_value_candidate_worse']:.4g} "
              f"({'<' if paired['p_value_candidate_worse'] < gate.alpha else '>='} alpha {gate.alpha})"),
    ]
    per_class = class_comparison(truth, cand, champ)
    drops = []
    for name, row in per_class.items():
        row["judged"] = row["support"] >= gate.min_class_support
        # Both: the drop is larger than the limit (in whole images, no float rounding) and it is not
        # noise (exact one-sided test on this class's images only one model gets right).
        too_large = row["net_losses"] > gate.max_class_recall_drop * row["support"] + 1e-9
        if row["judged"] and too_large and row["p_value_candidate_worse"] < gate.alpha:
            drops.append(f"{name} {row['delta']:+.3f} (p {row['p_value_candidate_worse']:.3g})")
    worst = min(per_class.items(), key=lambda kv: kv[1]["delta"])
    checks.append(Check(
        "class_recall", not drops,
        f"classes losing more than {gate.max_class_recall_drop:.3f} recall, significantly (alpha {gate.alpha}): "
        + ", ".join(drops) if drops
        else f"largest drop {worst[0]} {worst[1]['delta']:+.3f} (p {worst[1]['p_value_candidate_worse']:.3g}); "
             f"fails only beyond {gate.max_class_recall_drop:.3f} and significant at alpha {gate.alpha}",
    ))
    return checks, {"paired": paired, "per_class": per_class}


def _serving_checks(settings: Settings, model_uri: str, images: list[bytes], classes: set[str],
                    local: Path) -> tuple[list[Check], dict]:
    gate = settings.gate
    if not gate.smoke_test:
        return [], {"skipped": "gate.smoke_test is off"}
    smoke = smoke_test(settings, model_uri, images, classes, local)
    if not smoke["ok"]:
        return [Check("smoke", False, f"{model_uri} in a fresh process: {smoke['error']}")], smoke
    return [
        Check("smoke", True, f"{model_uri} loaded in a fresh process; {smoke['images_per_format']} PNG and JPEG each "
                             f"classified (formats agree on {smoke['png_jpeg_agreement']:.0%})"),
        Check("latency", smoke["latency_p95_ms"] <= gate.max_latency_p95_ms,
              f"p95 {smoke['latency_p95_ms']:.1f} ms per image (p50 {smoke['latency_p50_ms']:.1f}); "
              f"limit {gate.max_latency_p95_ms:.0f} ms"),
        Check("model_size", smoke["model_mb"] <= gate.max_model_mb,
              f"{smoke['model_mb']:.2f} MB; limit {gate.max_model_mb:.0f} MB"),
    ], smoke


def report_path(settings: Settings, candidate: int, champion: int | None, test_table: str, test_version: int) -> Path:
    name = f"{settings.registry.model_name}-v{candidate}-vs-{champion or 'none'}-{lake.table_name(test_table)}-v{test_version}.json"
    return settings.reports_path / "gate" / name


@dataclass
class _Judged:
    decision: str = UNDECIDED
    checks: list[Check] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    candidate_value: float | None = None
    champion_value: float | None = None


def _verified_copies(settings: Settings, stack: contextlib.ExitStack,
                     versions: list[ModelVersion]) -> dict[int, Path]:
    """Each version's files, checked against its manifest once, kept open for the whole gate (what it saw, its predictions, its smoke test)."""
    return {int(v.version): stack.enter_context(verified_model(settings, f"models:/{v.name}/{v.version}"))[0]
            for v in versions}


def _judge(settings: Settings, candidate: ModelVersion, champion: ModelVersion | None, copies: dict[int, Path],
           rows: pa.Table, removed: int) -> _Judged:
    """Every check on the frozen test rows, from the verified copies (module doc)."""
    gate = settings.gate
    images = rows["image"].to_pylist()
    truth = [str(x) for x in rows["label"].to_pylist()]
    out = _Judged(details={"test_images_removed_as_seen_in_training": removed})
    rolled_back = (candidate.tags or {}).get(TAG_ROLLED_BACK)
    out.checks.append(Check("not_rolled_back", not rolled_back,
                            f"rolled back before: {rolled_back}" if rolled_back else "never rolled back"))
    if len(truth) < gate.min_test_images:
        out.checks.append(Check("test_size", False, f"{len(truth)} test images (after removing {removed} seen in "
                                                    f"training) < min_test_images {gate.min_test_images}: no decision"))
    else:
        out.checks.append(Check("test_size", True, f"{len(truth)} test images ({removed} removed as seen in training)"))
        cand_pred = _predict(copies[int(candidate.version)], images)
        cand_scores = score(truth, cand_pred)
        out.candidate_value = cand_scores[gate.metric]
        out.details["candidate_scores"] = cand_scores
        out.checks.append(Check("floor", out.candidate_value >= gate.min_value,
                                f"test {gate.metric} {out.candidate_value:.4f}; floor {gate.min_value:.4f}"))
        if champion is not None:
            champ_pred = _predict(copies[int(champion.version)], images)
            champ_scores = score(truth, champ_pred)
            out.champion_value = champ_scores[gate.metric]
            out.details["champion_scores"] = champ_scores
            more, compared = comparison_checks(settings, truth, cand_pred, champ_pred, int(champion.version))
            out.checks += more
            out.details.update(compared)
        else:
            out.details["per_class"] = {k: {"candidate": v["recall"], "support": v["support"]}
                                        for k, v in per_class_recall(truth, cand_pred).items()}
        candidate_uri = f"models:/{candidate.name}/{candidate.version}"
        serving, out.details["smoke"] = _serving_checks(settings, candidate_uri, images, set(truth),
                                                        copies[int(candidate.version)])
        out.checks += serving
        out.decision = PASS if all(c.passed for c in out.checks) else FAIL
    if rolled_back:
        out.decision = FAIL  # decided even when the test set is too small to decide anything else
    return out


def evaluate(settings: Settings, candidate_version: int, test_table: str, test_version: int) -> GateResult:
    """Gate ``candidate_version`` of this environment's registered model against its champion.

    What each model saw comes from its own verified files (``tasks.models.seen_images``), so the
    gate reads no other deployment's lake; the same download is then predicted and smoke-tested.
    """
    gate = settings.gate
    client = mlflow_client(settings)
    name = settings.registry.model_name
    candidate = get_model_version(client, name, candidate_version)
    champion = champions.champion_version(settings, client)
    if champion is not None and int(champion.version) == int(candidate.version):
        champion = None  # re-gating the champion itself: nothing to compare with
    champion_version = int(champion.version) if champion is not None else None
    models = [candidate] + ([champion] if champion is not None else [])
    for version in models:
        trained_on(version)  # no lineage tags: nobody can say what it was trained on (LineageError)
    with contextlib.ExitStack() as stack:
        copies = _verified_copies(settings, stack, models)
        seen = set().union(*(seen_by(v, copies[int(v.version)]) for v in models))
        rows, removed = frozen_test_set(test_table, int(test_version), seen)
        judged = _judge(settings, candidate, champion, copies, rows, removed)

    path = report_path(settings, int(candidate.version), champion_version, test_table, int(test_version))
    result = GateResult(
        decision=judged.decision, model_name=name, candidate_version=int(candidate.version),
        champion_version=champion_version, metric=gate.metric, candidate_value=judged.candidate_value,
        champion_value=judged.champion_value, test_table=test_table, test_version=int(test_version),
        test_images=rows.num_rows, checks=judged.checks, report_path=str(path),
    )
    write_json(path, {"env": settings.env, **result.to_dict(), "details": judged.details,
                      "settings": gate.model_dump(mode="json"), "candidate_run_id": candidate.run_id,
                      "champion_run_id": champion.run_id if champion is not None else None})
    _record(client, candidate, result, path, settings.env)
    log.info("gate %s for %s v%s: %s", judged.decision.upper(), name, candidate.version, " | ".join(result.reasons))
    return result


def _record(client: MlflowClient, candidate: ModelVersion, result: GateResult, path: Path, env: str) -> None:
    """Gate metrics on the candidate's run, the report as its artifact, the outcome as version tags.

    Metric names carry the environment: in deploy-model one training run is gated in several.
    """
    tags = {
        "cd4ml.gate.decision": result.decision,
        "cd4ml.gate.passed": str(result.passed).lower(),
        "cd4ml.gate.champion_version": str(result.champion_version),
        "cd4ml.gate.test": f"{result.test_table}@v{result.test_version}",
        "cd4ml.gate.report": str(path),
    }
    set_version_tags(client, candidate, tags)
    if not candidate.run_id:
        return
    data = client.get_run(candidate.run_id).data
    metrics = {f"{env}_gate_passed": 1.0 if result.passed else 0.0, f"{env}_gate_test_images": float(result.test_images)}
    if result.candidate_value is not None:
        metrics[f"{env}_test_{result.metric}"] = result.candidate_value
    if result.champion_value is not None:
        metrics[f"{env}_champion_test_{result.metric}"] = result.champion_value
    for key, value in metrics.items():
        if data.metrics.get(key) != value:
            client.log_metric(candidate.run_id, key, value)
    client.log_artifact(candidate.run_id, str(path), artifact_path=f"gate/{env}")


__all__ = ["GateResult", "LineageError", "NoTestDataError", "SeenImagesUnavailableError", "evaluate", "paired_comparison", "per_class_recall",
           "score", "smoke_test", "trained_on"]
