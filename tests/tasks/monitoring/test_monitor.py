"""Feedback and monitoring with a real champion: a healthy window, then a planted accuracy drop.

The drop is real, not a mock: half of the second batch's digits are turned upside down (the
champion never saw such images), their true labels come back as feedback, the live accuracy
falls, one model_degraded incident opens (a second run does not alert again), the retrain
request is raised, and a healthy window afterwards resolves the incident.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.factories.digits import split_rows
from tests.factories.monitoring import feedback_csv, write_batch


@pytest.fixture(scope="module")
def monitored(champion, tmp_path_factory: pytest.TempPathFactory):
    settings, model = champion
    root = tmp_path_factory.mktemp("monitor")
    settings = settings.model_copy(update={
        "storage": settings.storage.model_copy(update={"lake_uri": str(root / "lake"),
                                                       "landing_uri": str(root / "landing"),
                                                       "reports_dir": str(root / "reports"),
                                                       "feedback_uri": str(root / "feedback")}),
        "monitoring": settings.monitoring.model_copy(update={"window_days": 1, "retrain_on_breach": True,
                                                             "max_explanations": 6}),
    })
    return settings, model, root


def test_feedback_joins_labels_and_rejects_unknown_images_and_classes(monitored) -> None:
    from tasks.data import lake
    from tasks.serving.feedback import FeedbackError, load_feedback
    from tasks.serving.score import score

    settings, _, root = monitored
    rows = split_rows("test")
    truth = write_batch(root / "day1", rows[:150])
    score(settings, str(root / "day1"), run_id="score-day1", logical_date="2026-11-10")
    csv_path = feedback_csv(root / "feedback" / "day1.csv", truth, extra=[(str(root / "nowhere.png"), "3"),
                                                               (next(iter(truth)), "cat")])
    jsonl = root / "feedback" / "more.jsonl"
    first, label = next(iter(truth.items()))
    jsonl.write_text(json.dumps({"image": first, "label": label}) + '\n[1, 2]\n{"label": "4"}\n')
    result = load_feedback(settings, [str(csv_path), str(jsonl)], run_id="fb1", logical_date="2026-11-10")
    assert result.accepted == 150 and result.rows == 155
    assert result.rejected_by_reason == {"bad_row": 2, "unknown_class": 1, "unknown_image": 1}
    rejects = {(r["reason_code"], r["line"]) for r in
               lake.scan(lake.open_table(result.rejects_table)).to_pylist()}
    assert ("unknown_image", 152) in rejects and ("unknown_class", 153) in rejects
    again = load_feedback(settings, [str(csv_path), str(jsonl)], run_id="fb2", logical_date="2026-11-10")
    assert again.accepted == 0 and again.unchanged == 150  # a re-run writes nothing
    assert lake.scan(lake.open_table(result.feedback_table)).num_rows == 150
    assert lake.scan(lake.open_table(result.rejects_table)).num_rows == 4
    bad = root / "feedback" / "bad.csv"
    bad.write_text("file,truth\nx.png,3\n")
    with pytest.raises(FeedbackError, match="needs a header with 'label'"):
        load_feedback(settings, [str(bad)], run_id="fb3", logical_date="2026-11-10")


def test_a_planted_accuracy_drop_breaches_alerts_once_and_a_healthy_window_resolves(monitored) -> None:
    from tasks.alerting.incidents import open_incidents
    from tasks.data import lake
    from tasks.monitoring.monitor import monitor
    from tasks.serving.feedback import load_feedback
    from tasks.serving.score import score

    settings, model, root = monitored
    if not lake.exists(settings.table_uri("feedback")):
        test_feedback_joins_labels_and_rejects_unknown_images_and_classes(monitored)
    healthy = monitor(settings, run_id="mon-day1", logical_date="2026-11-10")
    metrics = {m["name"]: m for m in healthy.metrics}
    assert healthy.labelled == 150 and metrics["accuracy"]["judged"], metrics["accuracy"]
    assert healthy.breached == [] and not healthy.alerted and not healthy.retrain_requested
    assert metrics["accuracy"]["value"] > 0.8

    rows = split_rows("test")
    truth = write_batch(root / "day3", rows[100:250], flip_every=2)  # half of the digits upside down
    score(settings, str(root / "day3"), run_id="score-day3", logical_date="2026-11-12")
    load_feedback(settings, [str(feedback_csv(root / "feedback" / "day3.csv", truth))], run_id="fb-day3",
                  logical_date="2026-11-12")
    dropped = monitor(settings, run_id="mon-day3", logical_date="2026-11-12")
    metrics = {m["name"]: m for m in dropped.metrics}
    assert dropped.labelled == 150
    assert metrics["accuracy"]["value"] < healthy_accuracy(healthy) - 0.2
    assert "accuracy" in dropped.breached and dropped.alerted and dropped.retrain_requested
    landing = Path(settings.storage.landing_uri)
    exported = sorted(landing.glob("*/feedback-*.png"))
    assert dropped.exported == len(exported) == 150  # the labelled window is new training data, under its true label
    assert all(p.parent.name == truth_by_key(settings)[p.name[9:33]] for p in exported)
    degraded = [i for i in open_incidents(settings, kinds=frozenset({"model_degraded"}))]
    assert len(degraded) == 1 and f"v{model.version}" in degraded[0].dedup_key

    repeat = monitor(settings, run_id="mon-day3-retry", logical_date="2026-11-12")  # a retry or the next day
    assert "accuracy" in repeat.breached and not repeat.alerted  # the incident is open: no second alert
    assert repeat.exported == 0 and len(list(landing.glob("*/feedback-*.png"))) == 150
    assert len(open_incidents(settings, kinds=frozenset({"model_degraded"}))) == 1
    table = lake.scan(lake.open_table(dropped.metrics_table))
    keys = table.column("metric_key").to_pylist()
    assert len(keys) == len(set(keys))  # re-runs replace their rows

    page = Path(dropped.dashboard).read_text()
    assert "BREACHED" in page and "accuracy" in page
    for png in dropped.plots:
        assert Image.open(png).format == "PNG"
    assert dropped.explanations, "misclassified images get explanation overlays"
    for overlay in dropped.explanations:
        with Image.open(overlay) as img:
            assert img.format == "PNG"
    report = json.loads((Path(dropped.dashboard).parent / "metrics.json").read_text())
    assert report["model"]["version"] == model.version

    recovered = monitor(settings, run_id="mon-day10", logical_date="2026-11-10")  # the healthy window again
    assert recovered.breached == [] and recovered.resolved
    assert open_incidents(settings, kinds=frozenset({"model_degraded"})) == []


def healthy_accuracy(result) -> float:
    return next(m["value"] for m in result.metrics if m["name"] == "accuracy")


def truth_by_key(settings) -> dict[str, str]:
    from tasks.serving.feedback import labelled

    return {key[:24]: label for key, label in labelled(settings).items()}
