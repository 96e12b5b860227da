"""The monitoring dashboard: one HTML page per model version and window, with its plots beside it.

Plots (PNG, matplotlib's Agg backend): a reliability diagram (live vs the champion's test
split), predicted-label shares, confidence distributions and per-class recall. The page lists
every rule with its live value, the test split's value, the limit, the evidence (p-value) and
the verdict, and links the explanation overlays of the window.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tasks.monitoring.live_metrics import Metric, Reference, expected_calibration_error


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _verdict(m: Metric) -> str:
    if m.breached:
        return "<b style='color:#b00'>BREACHED</b>"
    return "ok" if m.judged else "not judged (too little data)"


def _plots(out: Path, metrics: list[Metric], ref: Reference, predicted: Sequence[str], confidence: Sequence[float],
           truth: Sequence[str | None]) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pngs: dict[str, Path] = {}
    labelled = [i for i, t in enumerate(truth) if t is not None]
    live_conf = [confidence[i] for i in labelled]
    live_hit = [truth[i] == predicted[i] for i in labelled]

    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    for name, conf, hit in (("champion's test split", ref.confidence, [t == p for t, p in zip(ref.truth, ref.predicted)]),
                            ("live (labelled)", live_conf, live_hit)):
        _, bins = expected_calibration_error(conf, hit)
        if bins:
            ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], "o-", label=f"{name} ({len(conf)})")
    ax.set_xlabel("mean confidence in bin")
    ax.set_ylabel("accuracy in bin")
    ax.legend(fontsize=7)
    pngs["Reliability diagram"] = _save(fig, out / "reliability.png")

    fig, ax = plt.subplots(figsize=(6, 3))
    classes = sorted(set(ref.classes) | set(predicted))
    x = np.arange(len(classes))
    live, built = Counter(predicted), Counter(ref.population)
    ax.bar(x - 0.2, [built[c] / max(len(ref.population), 1) for c in classes], 0.4,
           label="predictions on its training data")
    ax.bar(x + 0.2, [live[c] / max(len(predicted), 1) for c in classes], 0.4, label="live predictions")
    ax.set_xticks(x, classes, rotation=45 if len(classes) > 12 else 0, fontsize=7)
    ax.set_ylabel("share")
    ax.legend(fontsize=7)
    pngs["Predicted labels"] = _save(fig, out / "labels.png")

    fig, ax = plt.subplots(figsize=(6, 3))
    edges = np.linspace(0, 1, 21)
    ax.hist(ref.confidence, bins=edges, density=True, alpha=0.5, label="test split")
    if len(confidence):
        ax.hist(confidence, bins=edges, density=True, alpha=0.5, label="live")
    ax.set_xlabel("confidence of the predicted label")
    ax.legend(fontsize=7)
    pngs["Confidence"] = _save(fig, out / "confidence.png")

    recalls = [m for m in metrics if m.name.startswith("recall:")]
    fig, ax = plt.subplots(figsize=(6, 3))
    if recalls:
        x = np.arange(len(recalls))
        ax.bar(x - 0.2, [m.reference or 0.0 for m in recalls], 0.4, label="test split")
        ax.bar(x + 0.2, [m.value or 0.0 for m in recalls], 0.4, label="live",
               color=["tab:red" if m.breached else "tab:orange" for m in recalls])
        ax.set_xticks(x, [m.name.split(":", 1)[1] for m in recalls], fontsize=7)
    ax.set_ylabel("recall")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    pngs["Recall per class"] = _save(fig, out / "recall.png")
    plt.close("all")
    return pngs


def _save(fig: Any, target: Path) -> Path:
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    return target


def write_dashboard(out: Path, settings: Any, model: Any, metrics: list[Metric], ref: Reference,
                    predicted: Sequence[str], confidence: Sequence[float], truth: Sequence[str | None],
                    start: datetime, end: datetime, breached: list[Metric], shifted: list[Metric],
                    explanations_index: Path) -> tuple[list[Path], Path]:
    """``out/index.html`` and its PNG plots; returns (plots, page)."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = _plots(out, metrics, ref, predicted, confidence, truth)
    rows = "".join(
        f"<tr><td>{html.escape(m.name)}</td><td>{_fmt(m.value)}</td><td>{_fmt(m.reference)}</td><td>{_fmt(m.limit)}</td>"
        f"<td>{m.n}</td><td>{_fmt(m.p_value)}</td><td>{_verdict(m)}</td><td>{html.escape(m.detail)}</td></tr>"
        for m in metrics)
    names = ", ".join(m.name for m in breached)
    status = (f"<p style='color:#b00'><b>Degraded: {html.escape(names)}</b> (alerted once per model version)</p>"
              if breached else "<p style='color:#070'><b>The champion holds: no rule that degrades it is breached.</b></p>")
    if shifted:
        status += ("<p style='color:#a60'><b>Shifted: " + html.escape(", ".join(m.name for m in shifted))
                   + "</b>: the inputs moved, and the labelled accuracy shows it does not hurt (reported, not alerted)</p>")
    link = (f"<p><a href='{explanations_index.relative_to(out).as_posix()}'>Explanations of the misclassified and "
            "low-confidence predictions</a></p>" if explanations_index.exists() else
            "<p>No misclassified or low-confidence prediction to explain in this window.</p>")
    figures = "".join(f"<h3>{html.escape(title)}</h3><img src='{png.name}' alt='{html.escape(title)}'>"
                      for title, png in pngs.items())
    page = out / "index.html"
    page.write_text(
        f"<html><head><meta charset='utf-8'><title>cd4ml monitoring {html.escape(model.name)} v{model.version}</title>"
        f"</head><body><h2>{html.escape(settings.env)}: {html.escape(model.name)} v{model.version}</h2>"
        f"<p>window {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC; rules need the effect beyond the limit and "
        f"p &lt; {settings.monitoring.rule_alpha}</p>{status}"
        "<table border='1' cellpadding='3'><tr><th>rule</th><th>live</th><th>test split</th><th>limit</th><th>n</th>"
        f"<th>p-value</th><th>verdict</th><th>detail</th></tr>{rows}</table>{link}{figures}</body></html>")
    return list(pngs.values()), page
