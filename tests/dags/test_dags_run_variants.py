"""Whole DAGs under `airflow dags test`: hyper-parameter tuning, and the colour photos chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dags.runs import cd4ml as _cd4ml
from tests.dags.runs import dag_test as _dag_test
from tests.dags.runs import status as _status

pytestmark = pytest.mark.airflow


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
