"""cd4ml_reconcile and cd4ml_promote under `airflow dags test`, uat importing from sit's own registry.

sit is another CD4ML_HOME with its own MLflow store and a real champion (tests/factories/champion.py);
uat's settings name that store as `release.upstream_registry.tracking_uri`. The reconcile finds the
champion without a gated import and triggers cd4ml_promote with its version (the run's conf); that
run imports, gates on uat's own data and promotes, its ledger rows naming the source; the reconcile
then has nothing to do.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.dags.conftest import PLUGINS, REPO, edited_conf, run_airflow

pytestmark = pytest.mark.airflow


def test_the_reconcile_triggers_the_import_of_an_unimported_upstream_champion_once(private_env, tmp_path, monkeypatch):
    from tests.factories.champion import champion_home
    from tests.factories.digits import write_curated_digits

    sit, model = champion_home(str(tmp_path / "sit-deployment"))
    conf = edited_conf(tmp_path / "conf", {}, {"uat.yaml": {"release": {
        "pattern": "deploy_model", "upstream": "sit", "upstream_registry": {"tracking_uri": sit.tracking_uri}}}})
    # PYTHONPATH: this checkout's code in the airflow processes, whatever checkout the venv was installed from
    env = {**private_env, "CD4ML_ENV": "uat", "CD4ML_CONF_DIR": str(conf), "PYTHONPATH": f"{REPO}:{PLUGINS}"}
    for key in ("CD4ML_HOME", "CD4ML_ENV", "CD4ML_CONF_DIR"):
        monkeypatch.setenv(key, env[key])
    from tasks.release import audit
    from tasks.settings import load_settings

    uat = load_settings()
    write_curated_digits(uat.curated_table, raw_version=2)

    first = run_airflow(["dags", "test", "cd4ml_reconcile"], env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert f"upstream champion v{model.version} has no gated import here" in first.stdout + first.stderr
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        triggered = db.execute("select run_type, conf from dag_run where dag_id = 'cd4ml_promote'").fetchall()
    assert [(kind, json.loads(conf)) for kind, conf in triggered] == [("operator_triggered",
                                                                       {"source_version": model.version})]

    # what the triggered run does (no scheduler here): the same conf under `airflow dags test`
    promote = run_airflow(["dags", "test", "cd4ml_promote", "-c", triggered[0][1]], env)
    assert promote.returncode == 0, (promote.stdout + promote.stderr)[-4000:]
    rows = audit.read(uat)
    assert [r.action for r in rows] == ["challenger", "promote"]
    assert all(f"imported from sit {model.name} v{model.version} ({sit.tracking_uri})" in r.reason for r in rows)

    again = run_airflow(["dags", "test", "cd4ml_reconcile"], env)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
