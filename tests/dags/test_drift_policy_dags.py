"""Drift policy through real `airflow dags test cd4ml_train` runs in prod: block stops, warn trains.

One prod world: a champion trained (in this process, few epochs) on 700 shuffled real digits, then
a raw version that adds 400 inverted digits (a harmful shift: the champion gets most of them
wrong) and a curated version of it that kept only 5 of them (curation dropped the rest, as
outliers, say): the check judges the batch as ingested, so curation cannot hide it. Under `drift.policy: block` the run stops at drift_check with the reason, exactly one
incident reaches on-call (one PagerDuty trigger, one Slack post, one email) and no model version
is registered; under `warn` the same version raises a warning and a candidate is trained and
registered. Release approval is switched off in this prod conf so that the warn run ends
without a person (the approval has its own tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.dags.conftest import alert_lines, edited_conf, run_airflow
from tests.factories.digits import curated_table, raw_table

pytestmark = pytest.mark.airflow
DATE = "2026-11-21"
FAST = {"training": {"epochs": 4, "patience": 2}, "gate": {"smoke_test": False}}


def _conf(target: Path, policy: str) -> Path:
    return edited_conf(target, FAST, {"prod.yaml": {"drift": {"policy": policy}, "release": {"approval": "none"}}})


@pytest.fixture(scope="module")
def prod_world(tmp_path_factory) -> dict:
    """A prod champion on 700 shuffled digits, and a curated version adding 400 inverted ones."""
    from tasks.data import lake
    from tasks.data.sample_data import digits_arrays
    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.settings import load_settings
    from tasks.training.train import train

    root = tmp_path_factory.mktemp("drift-policy")
    confs = {p: _conf(root / f"conf-{p}", p) for p in ("block", "warn")}
    home = root / "cd4ml"
    settings = load_settings("prod", home=home, conf_dir=confs["block"])
    images, labels = digits_arrays()
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    base = curated_table(images[:700], labels[:700], ["train"] * 500 + ["val"] * 100 + ["test"] * 100)
    base_raw = raw_table(images[:700], labels[:700])
    uri = settings.curated_table
    raw = lake.overwrite(settings.raw_table, base_raw, metadata={"run_id": "test-ingest"})
    ref = lake.overwrite(uri, base, metadata={"run_id": "test-ref", "raw_version": raw})
    trained = train(settings, uri, ref, run_id="prod-champion", logical_date=DATE)
    version = register_candidate(settings, trained.mlflow_run_id)
    mlflow_client(settings).set_registered_model_alias(settings.registry.model_name, "champion", str(version))
    batch = 255 - images[700:1100], labels[700:1100]
    raw = lake.overwrite(settings.raw_table, pa.concat_tables([base_raw, raw_table(*batch)]),
                         metadata={"run_id": "test-ingest-inverted"})
    kept = curated_table(batch[0][:5], batch[1][:5], ["train"] * 5)  # curation dropped 395 of the 400
    drifted = lake.overwrite(uri, pa.concat_tables([base, kept]), metadata={"run_id": "test-inverted", "raw_version": raw})
    return {"home": home, "confs": confs, "settings": settings, "drifted": drifted, "champion": version}


def _versions(world: dict) -> list[int]:
    from tasks.models.registry import mlflow_client

    settings = world["settings"]
    found = mlflow_client(settings).search_model_versions(f"name = '{settings.registry.model_name}'")
    return sorted(int(v.version) for v in found)


def _train(env: dict, world: dict, policy: str) -> tuple[int, str]:
    run_env = {**env, "CD4ML_ENV": "prod", "CD4ML_HOME": str(world["home"]), "CD4ML_CONF_DIR": str(world["confs"][policy])}
    conf = {"curated_version": world["drifted"]}
    proc = run_airflow(["dags", "test", "cd4ml_train", DATE, "-c", json.dumps(conf)], run_env, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def test_block_stops_a_prod_run_with_one_alert_and_warn_trains(private_env, prod_world, peers) -> None:  # noqa: F811
    from tests.peers import connection_env

    slack, pd, smtp = peers
    env = {**private_env, **connection_env(slack, pd, smtp.port)}

    rc, out = _train(env, prod_world, "block")
    assert rc == 1, out[-6000:]
    assert "training blocked by drift policy in prod" in out and "harmful: accuracy drop" in out, out[-6000:]
    assert "400 new images of raw v1 (as ingested)" in out, out[-6000:]  # the batch as it arrived, not curation's 5
    [alert] = alert_lines(out)  # the run's one incident: the failing task's callbacks found it open
    assert (alert["kind"], alert["severity"], alert["env"]) == ("drift", "critical", "prod")
    assert alert["summary"].startswith("training blocked: data drift against champion")
    [trigger] = pd.pd_events()
    assert trigger.body["event_action"] == "trigger" and trigger.body["payload"]["class"] == "drift"
    assert len(slack.slack_posts()) == 1 and len(smtp.messages) == 1
    assert _versions(prod_world) == [prod_world["champion"]]  # nothing was trained or registered

    rc, out = _train(env, prod_world, "warn")
    drift_alerts = [a for a in alert_lines(out) if a["kind"] == "drift"]
    assert [(a["severity"], a["summary"].startswith("data drift against champion")) for a in drift_alerts] == [
        ("warning", True)], out[-6000:]
    assert len(_versions(prod_world)) == 2, out[-6000:]  # a candidate was trained on the drifted data and registered
    assert len(pd.pd_events()) == 1  # a warning does not page
