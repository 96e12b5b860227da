"""The drift report as a page a person reads: p-values per test, both samples' embeddings, class counts."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any


def write_html(path: Path, result: Any, extra: dict[str, Any]) -> Path:
    """``path`` (.html) plus three PNG plots beside it; returns the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.with_suffix("")
    pngs = {}

    fig, ax = plt.subplots(figsize=(6, 3))
    names = [t["name"] for t in result.tests] + [f"whole: {t['name']}" for t in result.whole.get("tests", [])]
    values = [t["p_value"] for t in result.tests] + [t["p_value"] for t in result.whole.get("tests", [])]
    ax.barh(names, [max(v, 1e-12) for v in values], color=["tab:red" if v < result.tests[0]["threshold"]
                                                            else "tab:blue" for v in values])
    ax.axvline(result.tests[0]["threshold"], color="k", ls="--", label="level per test")
    ax.set_xscale("log")
    ax.set_xlabel("p-value (Bonferroni-adjusted for the softmax KS)")
    ax.legend(loc="lower right", fontsize=7)
    pngs["p-values per test"] = _save(fig, Path(f"{stem}_pvalues.png"))

    fig, ax = plt.subplots(figsize=(5, 4))
    ref = np.asarray(extra["plots"]["reference"])
    new = np.asarray(extra["plots"]["new"])
    if ref.size and new.size and ref.shape[1] >= 2:
        ax.scatter(ref[:, 0], ref[:, 1], s=4, alpha=0.4, label=f"champion's training data ({len(ref)})")
        ax.scatter(new[:, 0], new[:, 1], s=4, alpha=0.6, label=f"new images ({len(new)})")
        ax.legend(fontsize=7)
    ax.set_title(f"{result.feature_method} embedding, first two principal components", fontsize=8)
    pngs["embedding projection"] = _save(fig, Path(f"{stem}_projection.png"))

    fig, ax = plt.subplots(figsize=(6, 3))
    reference = extra["label_counts"]["reference"]
    counts = extra["label_counts"]["new"]
    classes = sorted(set(reference) | set(counts))
    total = max(1, sum(counts.values()))
    x = np.arange(len(classes))
    ax.bar(x - 0.2, [reference.get(c, 0.0) for c in classes], 0.4, label="champion's training data")
    ax.bar(x + 0.2, [counts.get(c, 0) / total for c in classes], 0.4, label="new images")
    ax.set_xticks(x, classes)
    ax.set_ylabel("share of images")
    ax.legend(fontsize=7)
    pngs["class counts"] = _save(fig, Path(f"{stem}_classes.png"))
    plt.close("all")

    rows = "".join(
        f"<tr><td>{html.escape(t['name'])}</td><td>{t['p_value']:.4g}</td><td>{t['threshold']:.4g}</td>"
        f"<td>{'DRIFT' if t['drift'] else 'ok'}</td><td>{t['statistic']:.4g}</td></tr>" for t in result.tests)
    severity = "".join(f"<li>{html.escape(k)}: {v}</li>" for k, v in result.severity.items())
    figures = "".join(f"<h3>{html.escape(title)}</h3><img src='{png.name}'>" for title, png in pngs.items())
    path.write_text(
        f"<html><head><meta charset='utf-8'><title>drift {html.escape(result.status)}</title></head><body>"
        f"<h2>Drift: {html.escape(result.status)}</h2><p>{html.escape(result.reason)}</p>"
        f"<p>policy: {html.escape(result.policy)}; features: {html.escape(str(result.feature_method))}</p>"
        f"<table border='1'><tr><th>test</th><th>p-value</th><th>level</th><th>result</th><th>statistic</th></tr>"
        f"{rows}</table><h3>Severity</h3><ul>{severity}</ul>{figures}</body></html>")
    return path


def _save(fig, target: Path) -> Path:
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    return target
