"""cd4ml_accept_class under `airflow dags test`: the row names the user Airflow recorded; a hostile label fails the run."""

from __future__ import annotations

import json

import pytest

from tests.dags.conftest import run_airflow

pytestmark = pytest.mark.airflow


def _dag_test(env: dict, labels: list[str]):
    return run_airflow(["dags", "test", "cd4ml_accept_class", "2026-11-21", "-c", json.dumps({"labels": labels})], env)


def test_accept_class_dag_records_the_runs_user_and_refuses_a_hostile_label(private_env, monkeypatch):
    env = {**private_env, "CD4ML_DATASET": "photos"}
    bad = _dag_test(env, ["okapi", "zebra\x1b]8;;http://evil\x07"])
    assert bad.returncode != 0
    assert "label 2: a label must not hold control" in bad.stdout + bad.stderr
    assert "evil" not in bad.stdout + bad.stderr

    good = _dag_test(env, ["zebra"])
    assert good.returncode == 0, (good.stdout + good.stderr)[-4000:]
    for key in ("CD4ML_HOME", "CD4ML_DATASET", "CD4ML_ENV"):
        monkeypatch.setenv(key, env[key])
    from tasks.data import classes, lake
    from tasks.settings import load_settings

    uri = load_settings().table_uri(classes.CLASSES_TABLE)
    rows = lake.read(uri, lake.current_version(uri)).to_pylist()
    # nothing of the bad run was written; `airflow dags test` records its own user name as the trigger
    assert [(r["label"], r["added_by"], r["actor"]) for r in rows] == [("zebra", "accepted", "dag_test")]
