"""Whole DAGs under `airflow dags test` in a temporary AIRFLOW_HOME, on real digit images."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dags.conftest import alert_lines, run_airflow

pytestmark = pytest.mark.airflow
DATE = "2026-11-21"


def _cd4ml(args: list[str], env: dict) -> str:
    cli = Path(sys.executable).parent / "cd4ml"
    proc = subprocess.run([str(cli), *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _dag_test(dag_id: str, env: dict, conf: dict | None = None, expect_rc: int = 0) -> str:
    args = ["dags", "test", dag_id, DATE] + (["-c", json.dumps(conf)] if conf else [])
    proc = run_airflow(args, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect_rc, f"{dag_id} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _status(env: dict) -> dict:
    return json.loads(_cd4ml(["status", "--env", "sit"], env))["environments"]["sit"]


def test_pipeline_end_to_end_and_idempotent(private_env):
    env = private_env
    _cd4ml(["sample-data", "--with-bad-files"], env)
    _dag_test("cd4ml_ingest", env, conf={"dataset_version_name": "digits-1"})
    out = _dag_test("cd4ml_curate", env)
    page = re.search(r"curation page: (\S+index\.html)", out)  # the task log links the curation's own page
    assert page and Path(page.group(1)).is_file(), out[-2000:]
    out = _dag_test("cd4ml_train", env)
    assert "drift: skipped" in out  # first run: no champion to compare against

    first = _status(env)
    tables = first["tables"]
    assert tables["raw_images"]["rows"] == 1797 and tables["rejects"]["rows"] == 2
    assert tables["raw_images"]["names"] == {"digits-1": tables["raw_images"]["version"]}
    assert 0.99 * 1797 <= tables["curated_images"]["rows"] <= 1797  # distinct digits are kept, not deduplicated away
    champions = [m for m in first["model_versions"] if "champion" in m["aliases"]]
    assert len(champions) == 1
    assert str(champions[0]["curated_version"]) == str(tables["curated_images"]["version"])

    # The whole chain again: no new rows, no new table versions, no duplicate model version.
    # This time training picks its data by the name the first ingest gave the raw version.
    _dag_test("cd4ml_ingest", env)
    _dag_test("cd4ml_curate", env)
    out = _dag_test("cd4ml_train", env, conf={"dataset_version": "digits-1"})
    assert "drift: skipped (0 new image(s) since the champion's training data" in out  # same data: nothing to test
    second = _status(env)
    for name, table in second["tables"].items():
        assert (table["version"], table["rows"]) == (tables[name]["version"], tables[name]["rows"]), name
    assert len(second["model_versions"]) == len(first["model_versions"])

    summary = _cd4ml(["summary"], env)
    assert "holds alias 'champion'" in summary

    # A manual run with a version that does not exist and a misspelt override stops in its first task,
    # naming both, before the drift check, tuning or training run.
    out = _dag_test("cd4ml_train", env, conf={"curated_version": 99, "training_overrides": {"epoch": 3}},
                    expect_rc=1)
    last = tables["curated_images"]["version"]
    assert f"curated_version=99: curated_images has versions 0..{last}" in out
    assert "training_overrides: invalid training overrides {'epoch': 3}" in out
    assert "drift:" not in out and "MLflow run:" not in out
    assert "up_for_retry" not in out  # nothing downstream fails in turn and waits out its retries


def test_an_empty_landing_fails_the_run_at_once_with_a_message_and_no_version(private_env, tmp_path):
    env = private_env
    (tmp_path / "empty").mkdir()
    out = _dag_test("cd4ml_ingest", env, conf={"source_uri": str(tmp_path / "empty")}, expect_rc=1)
    assert "holds no files: nothing to ingest, no new version" in out
    assert "up_for_retry" not in out  # a data error: a retry cannot help
    assert _status(env)["tables"]["raw_images"]["version"] is None


def test_a_failed_run_pages_once_in_prod_only_logs_in_sit_and_a_success_resolves(private_env, tmp_path, peers):
    """Validation fails on purpose (30 images a class): prod gets exactly one PagerDuty trigger, one
    Slack post and one email (the validate task's alert; the task- and DAG-level failure callbacks of
    the same run are de-duplicated), sit only the log line. A later good run resolves the incident."""
    from tests.peers import SECRETS, connection_env

    slack, pd, smtp = peers
    conns = connection_env(slack, pd, smtp.port)
    small = tmp_path / "small"
    _cd4ml(["sample-data", "--landing", str(small), "--limit", "30", "--with-bad-files"], private_env)
    outputs = []
    for env_name in ("sit", "prod"):
        env = {**private_env, **conns, "CD4ML_ENV": env_name, "CD4ML_HOME": str(tmp_path / env_name)}
        out = _dag_test("cd4ml_ingest", env, conf={"source_uri": str(small)}, expect_rc=1)
        outputs.append(out)
        assert "min_images_per_class(label=" in out  # one line per failed expectation
        [alert] = alert_lines(out)  # one alert line: the callbacks found the run's incident open
        assert (alert["kind"], alert["severity"], alert["env"]) == ("validation_failed", "critical", env_name)
        assert alert["task_id"] == "validate" and alert["error"].startswith("ValidationFailedError")
        assert alert["versions"]["raw_version"] == 0 and alert["details"]["report"].endswith(".json")
        assert out.count("already delivered and not resolved") == 2, out[-4000:]
        assert "Callback failed" not in out
        if env_name == "sit":
            assert (slack.posts, pd.posts, smtp.messages) == ([], [], [])  # sit: the log line only

    [trigger] = pd.pd_events()
    assert trigger.body["event_action"] == "trigger" and trigger.body["payload"]["class"] == "validation_failed"
    assert trigger.body["dedup_key"].startswith("prod:cd4ml_ingest:")
    [post] = slack.slack_posts()
    assert "validation_failed" in post.body["text"] and "/dags/cd4ml_ingest/runs/" in post.body["text"]
    [mail] = smtp.messages
    assert "validation_failed" in mail["Subject"]

    # The data owner fixes the delivery; the next run of the same DAG in prod succeeds and resolves.
    good = tmp_path / "good"
    _cd4ml(["sample-data", "--landing", str(good)], private_env)
    env = {**private_env, **conns, "CD4ML_ENV": "prod", "CD4ML_HOME": str(tmp_path / "prod")}
    outputs.append(_dag_test("cd4ml_ingest", env, conf={"source_uri": str(good)}))
    assert [e.body["event_action"] for e in pd.pd_events()] == ["trigger", "resolve"]
    assert pd.pd_events()[1].body["dedup_key"] == trigger.body["dedup_key"]
    assert len(slack.slack_posts()) == 2 and slack.slack_posts()[1].body["text"].startswith("*RESOLVED [prod]")
    assert len(smtp.messages) == 1

    # No planted secret in anything the runs printed or wrote (task logs, reports, tables, ledger).
    written = [p.read_bytes() for root in (tmp_path / "sit", tmp_path / "prod", Path(private_env["AIRFLOW_HOME"]))
               for p in root.rglob("*") if p.is_file()]
    for secret in SECRETS:
        assert not any(secret in out for out in outputs), secret
        assert not any(secret.encode() in blob for blob in written), secret


def test_tuning_runs_trials_as_mapped_tasks_and_trains_the_best(private_env, tmp_path):
    """tune=true: an Optuna study, trials as mapped tasks (nested MLflow runs), the best trial trains."""
    from tasks.settings import REPO_ROOT

    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("base.yaml", "uat.yaml", "prod.yaml"):
        (conf / name).write_text((REPO_ROOT / "conf" / name).read_text())
    (conf / "sit.yaml").write_text(
        (REPO_ROOT / "conf" / "sit.yaml").read_text()
        + "\ntraining: {epochs: 4, patience: 2}\ntuning: {n_trials: 3, epochs_per_trial: 2, pruner: median}\n"
    )
    env = {**private_env, "CD4ML_CONF_DIR": str(conf)}
    _cd4ml(["sample-data"], env)
    _dag_test("cd4ml_ingest", env)
    _dag_test("cd4ml_curate", env)
    out = _dag_test("cd4ml_train", env, conf={"tune": True, "model": "small_cnn"})
    trials = [line for line in out.splitlines() if line.startswith("trial ")]
    assert len(trials) == 3 and all(("COMPLETE" in t or "PRUNED" in t) for t in trials), trials
    assert "best trial of sit-v0-" in out
    champions = [m for m in _status(env)["model_versions"] if "champion" in m["aliases"]]
    assert len(champions) == 1

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/cd4ml/mlflow.db")
    run = client.get_run(champions[0]["run_id"])
    study = run.data.tags["cd4ml.optuna_study"]
    assert study.startswith("sit-v0-")
    children = client.search_runs([run.info.experiment_id], filter_string="tags.mlflow.parentRunId != ''")
    assert len(children) == 3  # one nested run per trial


def test_colour_photos_chain_discovers_classes_and_colour_beats_grey(private_env):
    """The colour sample (tiles of packaged photos, classes discovered from the folders) through
    ingest -> curate -> train; then the same model on grey input, gated against the colour champion."""
    env = {**private_env, "CD4ML_DATASET": "photos"}
    _cd4ml(["sample-data", "--dataset", "photos", "--with-bad-files"], env)
    out = _dag_test("cd4ml_ingest", env)
    assert "2 rejected" in out  # a text file and a 1-pixel-high panorama (too_small)
    classes = json.loads(_cd4ml(["classes"], env))
    assert classes["discover"] and classes["classes"] == ["astronaut", "china", "coffee", "flower", "ihc", "motorcycle", "rocket"]
    _dag_test("cd4ml_curate", env)
    _dag_test("cd4ml_train", env)
    _dag_test("cd4ml_train", env, conf={"training_overrides": {"channels": 1}})

    reports = Path(env["CD4ML_HOME"]) / "sit" / "reports" / "gate"
    colour = json.loads((reports / "photos-classifier-sit-v1-vs-none-curated_images-v0.json").read_text())
    grey = json.loads((reports / "photos-classifier-sit-v2-vs-1-curated_images-v0.json").read_text())
    assert colour["passed"] and not grey["passed"]
    assert colour["candidate_value"] >= grey["candidate_value"] + 0.10, (colour["candidate_value"], grey["candidate_value"])
    assert any(r.startswith("FAILED mcnemar") for r in grey["reasons"])  # significantly worse, on the same images
    champions = [m for m in _status(env)["model_versions"] if "champion" in m["aliases"]]
    assert [m["version"] for m in champions] == ["1"] or [str(m["version"]) for m in champions] == ["1"]

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{env['CD4ML_HOME']}/mlflow.db")
    spec = json.loads(client.get_run(champions[0]["run_id"]).data.params["preprocess"])
    assert spec["channels"] == 3 and spec["size"] == 32 and len(spec["mean"]) == 3  # auto: the tiles are RGB
