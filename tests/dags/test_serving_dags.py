"""cd4ml_score and cd4ml_monitor under `airflow dags test`: a real champion, real files, a planted drop.

The scoring DAG quarantines a corrupt file and scores the rest once (a second run adds nothing);
the monitoring DAG loads the feedback labels, finds the live accuracy dropped (half of the digits
upside down), alerts, and emits exactly one retrain-request Asset event into Airflow's own
metadata database.
"""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from tests.dags.conftest import edited_conf, run_airflow
from tests.factories.digits import split_rows

pytestmark = pytest.mark.airflow
DATE = "2026-11-21"


def _dag_test(dag_id: str, env: dict) -> str:
    proc = run_airflow(["dags", "test", dag_id, DATE], env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{dag_id} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _asset_events(airflow_home: str, name: str) -> int:
    with sqlite3.connect(Path(airflow_home) / "airflow.db") as db:
        return db.execute("SELECT count(*) FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ?",
                          (name,)).fetchone()[0]


def test_a_new_environment_skips_scoring_and_monitoring_with_the_reason(private_env, tmp_path) -> None:  # noqa: F811
    """A fresh install's daily runs: no inbox, no champion. They skip, saying why; nothing fails or pages."""
    env = {**private_env, "CD4ML_HOME": str(tmp_path / "fresh")}
    out = _dag_test("cd4ml_score", env)
    assert "nothing to score" in out and "does not exist" in out
    out = _dag_test("cd4ml_monitor", env)
    assert "has no champion" in out
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        states = dict(db.execute("SELECT task_id, state FROM task_instance WHERE dag_id IN ('cd4ml_score', 'cd4ml_monitor')"))
    assert states["score"] == "skipped" and states["monitor"] == "skipped" and states["load_feedback"] == "success"


def test_score_then_monitor_a_planted_drop_emits_one_retrain_request(private_env, tmp_path) -> None:  # noqa: F811
    from tests.factories.champion import champion_home

    home = tmp_path / "served"
    settings, model = champion_home(str(home))
    conf = edited_conf(tmp_path / "conf", {"monitoring": {"retrain_on_breach": True}})
    env = {**private_env, "CD4ML_HOME": str(home), "CD4ML_CONF_DIR": str(conf)}

    inbox = Path(settings.storage.scoring_uri)
    inbox.mkdir(parents=True)
    truth = {}
    for i, row in enumerate(split_rows("test")[:150]):
        img = Image.open(io.BytesIO(row["image"]))
        path = inbox / f"digit_{i:03d}.png"
        (img.rotate(180) if i % 2 else img).save(path)
        truth[str(path)] = row["label"]
    (inbox / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")

    out = _dag_test("cd4ml_score", env)
    assert f"scored 150 new image(s) with {model.name} v{model.version}" in out
    assert "1 quarantined: {'corrupt_image': 1}" in out
    assert "scored 0 new image(s)" in _dag_test("cd4ml_score", env)  # the next run adds nothing

    feedback = Path(settings.storage.feedback_uri)
    feedback.mkdir(parents=True)
    with (feedback / "labels.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["path", "label"])
        writer.writerows([*truth.items(), [str(inbox / "never-scored.png"), "1"]])
    out = _dag_test("cd4ml_monitor", env)
    assert "feedback: 150 label(s) stored, 0 unchanged, rejected {'unknown_image': 1}" in out
    assert "breached: ['accuracy'" in out
    assert "retraining requested" in out
    assert _asset_events(env["AIRFLOW_HOME"], "cd4ml_sit_retrain_request") == 1
    exported = list(Path(settings.storage.landing_uri).glob("*/feedback-*.png"))
    assert len(exported) == 150
    dashboards = list((home / "sit" / "reports" / "monitoring").rglob("index.html"))
    assert any("BREACHED" in p.read_text() for p in dashboards)
