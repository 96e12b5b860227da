"""`cd4ml topology`'s plan, without starting anything: three homes, the hop's release keys, nothing shared.

The running topology (three scale-out stacks, a model walked from sit to prod) is tests/stack/test_topology.py.
"""

from __future__ import annotations

import json
import stat

import pytest

from tasks.ops import topology
from tasks.settings import load_settings


@pytest.fixture
def planned(tmp_path, monkeypatch):
    monkeypatch.setenv("CD4ML_HOME", str(tmp_path / "cd4ml"))
    spec = topology.read_spec()
    members = topology.members(spec)
    for member in members:
        topology.write_conf(spec, member, topology.resolve_conf_dir())
    return spec, {m.env: m for m in members}


def test_defaults_give_each_environment_its_own_home_ports_databases_and_broker(planned, tmp_path) -> None:
    spec, members = planned
    assert [m.home for m in members.values()] == [tmp_path / "cd4ml" / "topology" / e for e in ("sit", "uat", "prod")]
    assert [(m.spec.port, m.spec.mlflow_port) for m in members.values()] == [(8080, 5000), (8081, 5001), (8082, 5002)]
    assert len({m.spec.pg_prefix for m in members.values()}) == len({m.spec.redis_db for m in members.values()}) == 3


def test_uat_and_prod_import_from_their_upstream_and_sit_and_uat_announce(planned) -> None:
    spec, members = planned
    sit, uat, prod = (load_settings(e, home=members[e].home, conf_dir=members[e].conf_dir) for e in ("sit", "uat", "prod"))
    assert (sit.release.pattern, sit.release.publish.channel, sit.release.upstream_event) == (
        "deploy_code", "cd4ml-sit-to-uat", None)
    assert (uat.release.pattern, uat.release.upstream, uat.release.upstream_registry.tracking_uri) == (
        "deploy_model", "sit", "http://127.0.0.1:5000")
    assert (uat.release.upstream_event.channel, uat.release.publish.channel) == ("cd4ml-sit-to-uat", "cd4ml-uat-to-prod")
    assert (prod.release.upstream, prod.release.upstream_registry.tracking_uri, prod.release.publish) == (
        "uat", "http://127.0.0.1:5001", None)
    # prod keeps what its own file says (a person approves), the hop's keys are merged in, not substituted
    assert prod.release.approval == "required" and "role:Approver" in prod.release.approvers
    assert prod.release.airflow_api_url == "http://localhost:8082"


def test_a_stack_gets_its_upstreams_reader_account_and_nothing_else(planned, monkeypatch) -> None:
    spec, members = planned
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "the-shell-s-own")
    monkeypatch.setenv("CD4ML_PG_HOST", "127.0.0.1")
    sit_env = topology.stack_env(spec, members["sit"], None)
    uat_env = topology.stack_env(spec, members["uat"], members["sit"])
    secrets_file = members["sit"].secrets_file
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600  # generated once, as `cd4ml up` would
    reader = json.loads(uat_env["AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY"])
    assert reader["login"] == "cd4ml-reader" and f"CD4ML_MLFLOW_READER_PASSWORD={reader['password']}" in secrets_file.read_text()
    assert "AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY" not in sit_env
    assert "MLFLOW_TRACKING_PASSWORD" not in uat_env and uat_env["CD4ML_PG_HOST"] == "127.0.0.1"
    assert (uat_env["CD4ML_ENV"], uat_env["CD4ML_PG_PREFIX"], uat_env["CD4ML_REDIS_DB"]) == ("uat", "cd4ml_uat", "2")
    assert json.loads(uat_env["AIRFLOW_CONN_CD4ML_QUEUE"])["port"] == 6379


def test_a_file_overrides_what_it_names_and_shared_values_are_refused(tmp_path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text("channel_prefix: t1\nuat: {port: 9081}\n")
    spec = topology.read_spec(path)
    assert (spec.uat.port, spec.uat.mlflow_port, spec.channel_prefix) == (9081, 5001, "t1")
    path.write_text("prod: {redis_db: 2}\n")
    with pytest.raises(topology.TopologyError, match="share a redis_db"):
        topology.read_spec(path)
    path.write_text("sit: {pg_prefix: 'x; DROP'}\n")
    with pytest.raises(topology.TopologyError, match="sit.pg_prefix"):
        topology.read_spec(path)


def test_a_command_runs_as_one_deployment_with_its_own_registry_account(planned, tmp_path) -> None:
    spec, members = planned
    env = topology.command_env(spec, "prod")
    assert (env["CD4ML_ENV"], env["CD4ML_CONF_DIR"], env["MLFLOW_TRACKING_URI"]) == (
        "prod", str(members["prod"].conf_dir), "http://127.0.0.1:5002")
    prod_secrets = (members["prod"].secrets_file).read_text()
    assert f"MLFLOW_TRACKING_PASSWORD={env['MLFLOW_TRACKING_PASSWORD']}" in prod_secrets  # prod's own writer
    reader = json.loads(env["AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY"])["password"]
    assert f"CD4ML_MLFLOW_READER_PASSWORD={reader}" in members["uat"].secrets_file.read_text()  # uat's reader only
    assert reader != topology.reader_password(members["sit"])


def test_an_operators_airflow_option_reaches_every_stack_but_no_shared_key(planned, monkeypatch) -> None:
    spec, members = planned
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL", "300")
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "one-key-for-all")
    monkeypatch.setenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY", "http://someone:else@host")
    env = topology.stack_env(spec, members["sit"], None)
    assert env["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] == "300"
    assert "AIRFLOW__CORE__FERNET_KEY" not in env and "AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY" not in env
