"""The monitor's rules: live predictions (and the labels that came back) against the champion's test split.

Every rule compares the live window with the same quantity on the champion's own test split
(its reference, computed once per model version), so a rule fits any model and any data, and
every rule needs both a real effect (larger than its limit) and evidence (a test at
``monitoring.rule_alpha``): a small sample never fires on noise, a huge one never fires on a
change nobody would care about.

* ``accuracy``: live accuracy below test accuracy - ``max_live_accuracy_drop``, and a one-sided
  two-sample test of H0 "live >= test - max_live_accuracy_drop" (a z-test with the margin that
  counts the noise of both samples: a test split of 127 images is no exact truth); judged with
  at least ``min_feedback`` labelled predictions.
* ``recall:<class>``: the same per class, with ``max_class_recall_drop``, for classes with at
  least ``min_class_support`` labelled images.
* ``calibration_ece``: expected calibration error (10 equal-width confidence bins) above the
  test split's by more than ``max_ece_increase``, and the live accuracy inside the confident bins
  significantly below their mean confidence (binomial, pooled over the bins that are over-confident).
* ``label_shift``: total variation distance between the live predicted-label shares and the
  champion's predicted-label shares on all the data it was trained on (train, val and test: a
  small test split is not a faithful picture of the class mix, measured on the sit sample where
  127 test images held 2% ones) above ``max_label_shift``, and a two-sample chi-square
  (contingency) test below rule_alpha.
* ``confidence_shift``: two-sample Kolmogorov-Smirnov statistic of confidences above
  ``max_confidence_shift``, and its p-value below rule_alpha.

``alarms`` decides what degrades the champion (and alerts): every breached accuracy, recall or
calibration rule; the two shift rules only while the labels cannot tell whether the shift hurts
(accuracy not judged, or itself breached), unless ``alert_on_harmless_shift``. Measured on real
digits (bench/monitor_eval.py): a 10-degree rotation, noise or a brighter scanner move the
confidences in every window while the champion keeps its accuracy; paging for those is noise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tasks.settings import MonitoringSettings

ECE_BINS = 10


@dataclass(frozen=True)
class Metric:
    name: str
    value: float | None  # live
    reference: float | None  # the champion's test split
    limit: float | None  # the value beyond which the rule fires (with evidence)
    n: int  # observations behind the live value
    p_value: float | None
    judged: bool  # enough data to decide
    breached: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Reference:
    """The champion on its own test split (true labels, predicted labels, confidences), and its predicted
    labels on every split of the data it was trained on (``population``: the class mix it was built for)."""

    classes: list[str]
    truth: list[str]
    predicted: list[str]
    confidence: list[float]
    population: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def accuracy(self) -> float:
        return float(np.mean([t == p for t, p in zip(self.truth, self.predicted)])) if self.truth else float("nan")


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool]) -> tuple[float, list[dict]]:
    """ECE over ``ECE_BINS`` equal-width bins, and the bins (count, mean confidence, accuracy) for a plot."""
    conf, hit = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=bool)
    if conf.size == 0:
        return float("nan"), []
    edges = np.linspace(0.0, 1.0, ECE_BINS + 1)
    index = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, ECE_BINS - 1)
    bins, ece = [], 0.0
    for b in range(ECE_BINS):
        mask = index == b
        if not mask.any():
            continue
        mean_conf, acc = float(conf[mask].mean()), float(hit[mask].mean())
        ece += mask.sum() / conf.size * abs(mean_conf - acc)
        bins.append({"low": float(edges[b]), "high": float(edges[b + 1]), "count": int(mask.sum()),
                     "confidence": mean_conf, "accuracy": acc})
    return float(ece), bins


def _binom_below(successes: int, n: int, rate: float) -> float:
    """P(X <= successes) for X ~ Binomial(n, rate): small = significantly below ``rate``."""
    from scipy.stats import binom

    return float(binom.cdf(successes, n, min(max(rate, 0.0), 1.0)))


def _below_with_margin(hits: int, n: int, ref_hits: int, ref_n: int, margin: float) -> float:
    """One-sided p-value of H0 "live rate >= reference rate - margin", both rates estimated (z-test).

    Rates are shrunk by one pseudo-observation each way (Agresti-Caffo) so that 100% on either
    side still has a variance.
    """
    from scipy.stats import norm

    live, ref = (hits + 1) / (n + 2), (ref_hits + 1) / (ref_n + 2)
    se = np.sqrt(live * (1 - live) / (n + 2) + ref * (1 - ref) / (ref_n + 2))
    return float(norm.cdf((hits / n - (ref_hits / ref_n - margin)) / se))


def accuracy_rule(truth: Sequence[str], predicted: Sequence[str], ref: Reference, cfg: MonitoringSettings) -> Metric:
    n = len(truth)
    hits = sum(t == p for t, p in zip(truth, predicted))
    value = hits / n if n else None
    limit = ref.accuracy - cfg.max_live_accuracy_drop
    judged = n >= cfg.min_feedback and bool(ref.truth)
    ref_hits = sum(t == p for t, p in zip(ref.truth, ref.predicted))
    p = _below_with_margin(hits, n, ref_hits, len(ref.truth), cfg.max_live_accuracy_drop) if n and ref.truth else None
    breached = bool(judged and value is not None and value < limit and p is not None and p < cfg.rule_alpha)
    detail = (f"{hits}/{n} labelled predictions right ({value:.3f}); test accuracy {ref.accuracy:.3f}, limit {limit:.3f}"
              if n else "no feedback labels in the window")
    if n and not judged:
        detail += f" (fewer than min_feedback {cfg.min_feedback}: reported, not judged)"
    return Metric("accuracy", value, ref.accuracy, limit, n, p, judged, breached, detail)


def recall_rules(truth: Sequence[str], predicted: Sequence[str], ref: Reference, cfg: MonitoringSettings) -> list[Metric]:
    out = []
    for cls in ref.classes:
        ref_idx = [i for i, t in enumerate(ref.truth) if t == cls]
        live_idx = [i for i, t in enumerate(truth) if t == cls]
        if not ref_idx and not live_idx:
            continue
        ref_recall = float(np.mean([ref.predicted[i] == cls for i in ref_idx])) if ref_idx else None
        hits = sum(predicted[i] == cls for i in live_idx)
        n = len(live_idx)
        value = hits / n if n else None
        limit = ref_recall - cfg.max_class_recall_drop if ref_recall is not None else None
        judged = n >= cfg.min_class_support and limit is not None
        ref_hits = sum(ref.predicted[i] == cls for i in ref_idx)
        p = _below_with_margin(hits, n, ref_hits, len(ref_idx), cfg.max_class_recall_drop) if judged else None
        breached = bool(judged and value < limit and p < cfg.rule_alpha)
        detail = f"{hits}/{n} images of class {cls} recognised" + (
            f"; test recall {ref_recall:.3f}, limit {limit:.3f}" if ref_recall is not None else "; not in the test split")
        out.append(Metric(f"recall:{cls}", value, ref_recall, limit, n, p, judged, breached, detail))
    return out


def calibration_rule(confidence: Sequence[float], correct: Sequence[bool], ref: Reference,
                     cfg: MonitoringSettings) -> Metric:
    n = len(confidence)
    ece, bins = expected_calibration_error(confidence, correct)
    ref_ece, _ = expected_calibration_error(ref.confidence, [t == p for t, p in zip(ref.truth, ref.predicted)])
    limit = ref_ece + cfg.max_ece_increase
    over = [b for b in bins if b["confidence"] > b["accuracy"]]  # over-confident bins: the harmful direction
    hits = int(round(sum(b["accuracy"] * b["count"] for b in over)))
    count = sum(b["count"] for b in over)
    expected = sum(b["confidence"] * b["count"] for b in over) / count if count else 0.0
    p = _binom_below(hits, count, expected) if count else None
    judged = n >= cfg.min_feedback
    breached = bool(judged and ece > limit and p is not None and p < cfg.rule_alpha)
    detail = (f"ECE {ece:.3f} on {n} labelled predictions; test ECE {ref_ece:.3f}, limit {limit:.3f}" if n
              else "no feedback labels in the window")
    return Metric("calibration_ece", ece if n else None, ref_ece, limit, n, p, judged, breached, detail)


def label_shift_rule(predicted: Sequence[str], ref: Reference, cfg: MonitoringSettings) -> Metric:
    from scipy.stats import chi2_contingency

    n, m = len(predicted), len(ref.population)
    live, built = Counter(predicted), Counter(ref.population)
    classes = sorted(set(ref.classes) | set(live))
    if not n or not m:
        return Metric("label_shift", None, 0.0, cfg.max_label_shift, n, None, False, False,
                      "no predictions in the window" if not n else "no reference predictions")
    live_share = np.array([live[c] / n for c in classes])
    built_share = np.array([built[c] / m for c in classes])
    tvd = float(0.5 * np.abs(live_share - built_share).sum())
    seen = [c for c in classes if live[c] + built[c] > 0]
    p = float(chi2_contingency([[live[c] for c in seen], [built[c] for c in seen]]).pvalue) if len(seen) > 1 else 1.0
    judged = n >= cfg.min_predictions
    breached = bool(judged and tvd > cfg.max_label_shift and p < cfg.rule_alpha)
    top = sorted(classes, key=lambda c: -abs(live[c] / n - built[c] / m))[:3]
    detail = (f"total variation {tvd:.3f} over {n} predictions against {m} on the training data; most changed: "
              + ", ".join(f"{c} {live[c] / n:.2f} vs {built[c] / m:.2f}" for c in top))
    return Metric("label_shift", tvd, 0.0, cfg.max_label_shift, n, p, judged, breached, detail)


def confidence_shift_rule(confidence: Sequence[float], ref: Reference, cfg: MonitoringSettings) -> Metric:
    from scipy.stats import ks_2samp

    n = len(confidence)
    if not n or not ref.confidence:
        return Metric("confidence_shift", None, 0.0, cfg.max_confidence_shift, n, None, False, False,
                      "no predictions in the window")
    result = ks_2samp(confidence, ref.confidence)
    stat, p = float(result.statistic), float(result.pvalue)
    judged = n >= cfg.min_predictions
    breached = bool(judged and stat > cfg.max_confidence_shift and p < cfg.rule_alpha)
    detail = (f"KS {stat:.3f}; median confidence {np.median(confidence):.3f} live vs "
              f"{np.median(ref.confidence):.3f} on the test split")
    return Metric("confidence_shift", stat, 0.0, cfg.max_confidence_shift, n, p, judged, breached, detail)


SHIFT_RULES = ("label_shift", "confidence_shift")


def alarms(metrics: Sequence[Metric], cfg: MonitoringSettings) -> tuple[list[Metric], list[Metric]]:
    """(degraded, shifted): the breaches that degrade the champion, and shifts its judged accuracy shows harmless."""
    harm = [m for m in metrics if m.breached and m.name not in SHIFT_RULES]
    shifts = [m for m in metrics if m.breached and m.name in SHIFT_RULES]
    accuracy = next((m for m in metrics if m.name == "accuracy"), None)
    labels_clear_it = accuracy is not None and accuracy.judged and not harm
    if labels_clear_it and not cfg.alert_on_harmless_shift:
        return [], shifts
    return harm + shifts, []


def evaluate_window(predicted: Sequence[str], confidence: Sequence[float], truth: Sequence[str | None],
                    ref: Reference, cfg: MonitoringSettings) -> list[Metric]:
    """Every rule on one window: predicted labels and confidences of all predictions, truth where known."""
    labelled = [i for i, t in enumerate(truth) if t is not None]
    y = [str(truth[i]) for i in labelled]
    yhat = [predicted[i] for i in labelled]
    conf = [confidence[i] for i in labelled]
    volume = Metric("predictions", float(len(predicted)), float(len(ref.predicted)), None, len(predicted), None,
                    True, False, f"{len(predicted)} predictions, {len(labelled)} with a true label "
                                 f"({len(labelled) / max(len(predicted), 1):.0%})")
    return [
        volume,
        accuracy_rule(y, yhat, ref, cfg),
        *recall_rules(y, yhat, ref, cfg),
        calibration_rule(conf, [a == b for a, b in zip(y, yhat)], ref, cfg),
        label_shift_rule(predicted, ref, cfg),
        confidence_shift_rule(confidence, ref, cfg),
    ]
