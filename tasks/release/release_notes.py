"""What a person reads before approving a release: candidate vs champion, class by class, with its data.

``approval_body`` turns a gate result (and the report it wrote) into the markdown the Airflow
Required Actions page shows: the decision and every check, overall and per-class metrics with
deltas (class names, not indices), the paired comparison, the drift status of the data the
candidate was trained on, the data versions of both models and of the test set, and where the
reports are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.models.registry import (
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    TAG_DRIFT_REPORT,
    TAG_DRIFT_STATUS,
    TAG_RAW_VERSION,
    TAG_SAMPLE,
    get_model_version,
    mlflow_client,
)
from tasks.settings import Settings


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _delta(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f} pts"


def _data_line(tags: dict[str, str]) -> str:
    sample = f", sample `{tags[TAG_SAMPLE]}`" if tags.get(TAG_SAMPLE) else ""
    return (f"`{tags.get(TAG_CURATED_TABLE, '?')}` v{tags.get(TAG_CURATED_VERSION, '?')} "
            f"(raw v{tags.get(TAG_RAW_VERSION) or '?'}{sample})")


def approval_body(settings: Settings, gate: dict[str, Any]) -> str:
    report = json.loads(Path(gate["report_path"]).read_text()) if Path(gate["report_path"]).exists() else {}
    details = report.get("details", {})
    client = mlflow_client(settings)
    name = gate["model_name"]
    candidate = dict(get_model_version(client, name, gate["candidate_version"]).tags or {})
    champion = (dict(get_model_version(client, name, gate["champion_version"]).tags or {})
                if gate.get("champion_version") is not None else None)
    lines = [
        f"### {name} v{gate['candidate_version']} vs champion "
        f"{'v' + str(gate['champion_version']) if champion is not None else '(none yet)'} in **{settings.env}**",
        "",
        f"Automatic gate: **{gate['decision']}** on {gate['test_images']} test images of "
        f"`{gate['test_table']}` v{gate['test_version']} that neither model trained on.",
        "",
        "| check | result |",
        "|---|---|",
        *[f"| {c['name']} | {'ok' if c['passed'] else 'FAILED'}: {c['detail']} |" for c in gate["checks"]],
        "",
        "| metric | candidate | champion | delta |",
        "|---|---|---|---|",
    ]
    cand_scores, champ_scores = details.get("candidate_scores", {}), details.get("champion_scores", {})
    for metric in ("accuracy", "macro_f1"):
        c, p = cand_scores.get(metric), champ_scores.get(metric)
        lines.append(f"| {metric} | {_pct(c)} | {_pct(p)} | {_delta(c - p) if c is not None and p is not None else '-'} |")
    per_class = details.get("per_class", {})
    if per_class:
        lines += ["", "| class | test images | recall candidate | recall champion | delta |", "|---|---|---|---|---|"]
        for label, row in sorted(per_class.items(), key=lambda kv: kv[1].get("delta", 0.0)):
            lines.append(f"| {label} | {row['support']} | {_pct(row['candidate'])} | {_pct(row.get('champion'))} | "
                         f"{_delta(row.get('delta'))} |")
    paired = details.get("paired")
    if paired:
        low, high = paired["bootstrap_95"]
        lines += ["", f"Paired on the same images: only the champion right on {paired['only_champion_right']}, only the "
                      f"candidate right on {paired['only_candidate_right']}; McNemar one-sided p = "
                      f"{paired['p_value_candidate_worse']:.3g}; accuracy difference 95% interval "
                      f"[{_delta(low)}, {_delta(high)}]."]
    smoke = details.get("smoke", {})
    if smoke.get("latency_p95_ms") is not None:
        lines += ["", f"Serving: p95 {smoke['latency_p95_ms']:.1f} ms per image in a fresh process, "
                      f"{smoke['model_mb']:.2f} MB."]
    lines += [
        "",
        f"**Drift** of the candidate's training data against the champion's: "
        f"{candidate.get(TAG_DRIFT_STATUS, 'not checked')}"
        + (f" (report `{candidate[TAG_DRIFT_REPORT]}`)" if candidate.get(TAG_DRIFT_REPORT) else ""),
        "",
        f"**Data**: candidate trained on {_data_line(candidate)}"
        + (f"; champion on {_data_line(champion)}" if champion is not None else "")
        + (f"; copied from `{candidate['cd4ml.copied_from']}`" if candidate.get("cd4ml.copied_from") else ""),
        "",
        f"**Reports**: gate `{gate['report_path']}`; lineage: `cd4ml lineage models:/{name}/{gate['candidate_version']}`",
        "",
        "Approve moves `champion` now. Reject (or no answer within "
        f"{settings.release.approval_timeout_hours:g} h) keeps the champion; say why in *reason*.",
    ]
    return "\n".join(lines)
