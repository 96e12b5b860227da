"""Whole DAGs under `airflow dags test` in a temporary AIRFLOW_HOME, on real digit images."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dags.conftest import run_airflow

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


@pytest.fixture(scope="module")
def airflow_template(airflow_env, tmp_path_factory) -> Path:
    """A migrated, never-used Airflow DB. Each test runs on its own copy, because Asset URIs
    follow CD4ML_HOME and two homes must never register the same Asset name in one DB."""
    home = tmp_path_factory.mktemp("airflow-template")
    proc = run_airflow(["db", "migrate"], {**airflow_env, "AIRFLOW_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home / "airflow.db"


@pytest.fixture
def private_env(airflow_env, airflow_template, tmp_path) -> dict:
    """Own CD4ML_HOME and own copy of the migrated Airflow DB."""
    airflow_home = tmp_path / "airflow"
    airflow_home.mkdir()
    shutil.copy(airflow_template, airflow_home / "airflow.db")
    return {**airflow_env, "CD4ML_HOME": str(tmp_path / "cd4ml"), "AIRFLOW_HOME": str(airflow_home)}


def test_pipeline_end_to_end_and_idempotent(private_env):
    env = private_env
    _cd4ml(["sample-data", "--with-bad-files"], env)
    _dag_test("cd4ml_ingest", env, conf={"dataset_version_name": "digits-1"})
    _dag_test("cd4ml_curate", env)
    out = _dag_test("cd4ml_train", env)
    assert "drift: skipped" in out  # first run: no champion to compare against

    first = _status(env)
    tables = first["tables"]
    assert tables["raw_images"]["rows"] == 1797 and tables["rejects"]["rows"] == 2
    assert tables["raw_images"]["names"] == {"digits-1": tables["raw_images"]["version"]}
    assert 0 < tables["curated_images"]["rows"] <= 1797
    champions = [m for m in first["model_versions"] if "champion" in m["aliases"]]
    assert len(champions) == 1
    assert str(champions[0]["curated_version"]) == str(tables["curated_images"]["version"])

    # The whole chain again: no new rows, no new table versions, no duplicate model version.
    # This time training picks its data by the name the first ingest gave the raw version.
    _dag_test("cd4ml_ingest", env)
    _dag_test("cd4ml_curate", env)
    out = _dag_test("cd4ml_train", env, conf={"dataset_version": "digits-1"})
    assert "drift: no_drift" in out  # now there is a champion, trained on the same data
    second = _status(env)
    for name, table in second["tables"].items():
        assert (table["version"], table["rows"]) == (tables[name]["version"], tables[name]["rows"]), name
    assert len(second["model_versions"]) == len(first["model_versions"])

    summary = _cd4ml(["summary"], env)
    assert "holds alias 'champion'" in summary


def test_empty_landing_ends_the_run_with_a_message_and_no_version(private_env, tmp_path):
    env = private_env
    (tmp_path / "empty").mkdir()
    out = _dag_test("cd4ml_ingest", env, conf={"source_uri": str(tmp_path / "empty")})
    assert "holds no files: nothing to ingest, no new version" in out
    assert _status(env)["tables"]["raw_images"]["version"] is None


def test_failed_validation_fails_the_task_and_alerts_on_call(private_env, tmp_path):
    env = private_env
    landing = tmp_path / "landing"
    _cd4ml(["sample-data", "--landing", str(landing), "--limit", "30", "--with-bad-files"], env)
    out = _dag_test("cd4ml_ingest", env, conf={"source_uri": str(landing)}, expect_rc=1)
    assert "validation of" in out and "min_images_per_class(label=" in out  # one line per failed expectation
    decoder = json.JSONDecoder()
    alerts = [decoder.raw_decode(line[line.index('{"'):])[0] for line in out.splitlines() if "CD4ML_ALERT" in line]
    # The task's callback and the DAG run's callback both fire, name the task, and share a key.
    assert [a["source"] for a in alerts] == ["dag:cd4ml_ingest/task:validate"] * 2, out[-4000:]
    assert {a["severity"] for a in alerts} == {"critical"}
    assert "ValidationFailedError" in alerts[0]["details"]["error"] or "validation of" in alerts[0]["details"]["error"]
    assert len({a["dedup_key"] for a in alerts}) == 1  # one incident for on-call
    assert "Callback failed" not in out
    assert _status(env)["tables"]["raw_images"]["version"] == 0  # ingested, but never published


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
