"""Import from an upstream that is a real MLflow server with accounts (``mlflow server --app-name basic-auth``).

The server runs on a free 127.0.0.1 port with its own SQLite store and artifact folder; its admin
registers a small model version with lineage and manifest and makes it champion, and creates an
ordinary account, which the app's ``default_permission = READ`` lets read and nothing else. The
downstream is a SQLite store in tmp. Shown: the import works as that read-only account (so it needs
no write upstream) and leaves the upstream as it was; every write the account tries is HTTP 403; a
wrong password, and no account at all, are ``UpstreamCredentialsError`` with nothing imported, even
when this process's own MLflow account would be accepted upstream (it is never sent there).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import urllib.request
from collections.abc import Iterator

import pytest

from tests.factories.mlflow_server import ADMIN, basic_auth_server
from tests.tasks.release.test_model_import import downstream_of

READER = "cd4ml-reader"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A basic-auth MLflow server: its URI and the generated passwords of its admin and of the reader."""
    with basic_auth_server(tmp_path_factory.mktemp("upstream-server")) as running:
        reader_password = secrets.token_urlsafe(16)
        _create_user(running["uri"], (ADMIN, running["admin_password"]), READER, reader_password)
        yield {"uri": running["uri"], "admin": running["admin_password"], "reader": reader_password,
               "artifacts": running["artifacts"]}


def _create_user(uri: str, admin: tuple[str, str], name: str, password: str) -> None:
    token = base64.b64encode(f"{admin[0]}:{admin[1]}".encode()).decode()
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/users/create",
                                     json.dumps({"username": name, "password": password}).encode(),
                                     {"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.fixture(scope="module")
def sit_champion(server: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """As the admin: version 1 of sit's model (small files, lineage, manifest), champion; returns (name, run id)."""
    from mlflow import MlflowClient

    from tasks.models.integrity import record_manifest
    from tasks.settings import load_settings

    files = tmp_path_factory.mktemp("model")
    (files / "runtime").mkdir()
    (files / "weights.bin").write_bytes(os.urandom(4096))
    (files / "runtime" / "__init__.py").write_text("VERSION = 1\n")
    sit = load_settings("sit", home=str(tmp_path_factory.mktemp("sit-home")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
        mp.setenv("MLFLOW_TRACKING_PASSWORD", server["admin"])
        mp.setenv("MLFLOW_TRACKING_URI", server["uri"])
        client = MlflowClient(server["uri"], server["uri"])
        run = client.create_run(client.create_experiment("cd4ml-sit"))
        client.log_artifacts(run.info.run_id, str(files), "model")
        client.set_terminated(run.info.run_id)
        name = sit.registry.model_name
        client.create_registered_model(name)
        version = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id, tags={
            "cd4ml.env": "sit", "cd4ml.curated_table": "s3://sit-lake/curated_images", "cd4ml.curated_version": "4",
            "cd4ml.gate.decision": "pass"})
        import mlflow

        mlflow.set_registry_uri(server["uri"])  # MLflow resolves models:/ through the process-wide registry URI
        record_manifest(sit.model_copy(update={"env": "sit"}), client, version)
        client.set_registered_model_alias(name, "champion", version.version)
    return name, run.info.run_id


def _upstream_state(server: dict[str, str], name: str) -> tuple[object, ...]:
    from mlflow import MlflowClient

    client = MlflowClient(server["uri"], server["uri"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
        mp.setenv("MLFLOW_TRACKING_PASSWORD", server["admin"])
        versions = client.search_model_versions(f"name = '{name}'")
        return (client.get_registered_model(name).aliases, sorted((v.version, tuple(sorted(v.tags.items())))
                                                                  for v in versions))


def test_the_read_only_account_imports_and_can_write_nothing_upstream(server, sit_champion, cd4ml_home,
                                                                      monkeypatch) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.models.integrity import verify
    from tasks.release.lineage import format_lineage, lineage
    from tasks.release.model_import import import_model, reading, upstream_of

    name, run_id = sit_champion
    before = _upstream_state(server, name)
    uat = downstream_of(cd4ml_home / "uat", server["uri"])
    monkeypatch.setenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY",
                       json.dumps({"conn_type": "http", "login": READER, "password": server["reader"]}))
    imported = import_model(uat)
    assert (imported.version, imported.source_version, imported.source_registry) == (1, 1, server["uri"])
    assert import_model(uat).reused
    assert verify(uat, f"models:/{uat.registry.model_name}/1").files == 2
    tags = MlflowClient(uat.tracking_uri, uat.tracking_uri).get_model_version(uat.registry.model_name, "1").tags
    assert tags["cd4ml.import.source_run_id"] == run_id and "reader" not in json.dumps(tags)
    assert _upstream_state(server, name) == before

    # lineage from uat: the hop into sit's server is read with uat's upstream Connection, and without it is named
    conf = cd4ml_home / "conf"
    conf.mkdir()
    for env in ("base", "sit", "prod"):
        (conf / f"{env}.yaml").write_text("")
    (conf / "uat.yaml").write_text(json.dumps({"release": {"pattern": "deploy_model", "upstream": "sit",
                                                           "upstream_registry": {"tracking_uri": server["uri"]}}}))
    monkeypatch.setenv("CD4ML_CONF_DIR", str(conf))
    info = lineage(f"models:/{uat.registry.model_name}/1", home=uat.home)
    assert info["copied_from"]["run"]["run_id"] == run_id and info["copied_from"]["aliases"] == ["champion"]
    monkeypatch.delenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY")
    info = lineage(f"models:/{uat.registry.model_name}/1", home=uat.home)
    assert "HTTP 401" in info["copied_from"]["unreachable"] and info["copied_from"]["model_uri"] == f"models:/{name}/1"
    assert f"models:/{name}/1 (sit): CANNOT REACH this hop" in format_lineage(info)
    # what the unreachable hop trained on is still told, as the imported version's own tags record it
    recorded = info["recorded_data"]
    assert recorded["table"] and recorded["version"] not in (None, "")
    assert f"trained on (as this version's tags record it): {recorded['table']} v{recorded['version']}" in format_lineage(info)
    monkeypatch.setenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY",
                       json.dumps({"conn_type": "http", "login": READER, "password": server["reader"]}))

    with reading(upstream_of(uat)) as client:  # the account the import reads with
        writes = {
            "create a model version": lambda: client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id),
            "move the champion": lambda: client.set_registered_model_alias(name, "champion", "1"),
            "tag the version": lambda: client.set_model_version_tag(name, "1", "cd4ml.manifest", "{}"),
            "delete the version": lambda: client.delete_model_version(name, "1"),
        }
        for what, write in writes.items():
            with pytest.raises(MlflowException) as refused:
                write()
            assert refused.value.get_http_status_code() == 403, what
    assert _upstream_state(server, name) == before


def test_refused_or_missing_credentials_import_nothing_and_this_process_account_is_never_sent(
        server, sit_champion, cd4ml_home, monkeypatch) -> None:
    from mlflow import MlflowClient

    from tasks.release.model_import import UpstreamCredentialsError, import_model

    uat = downstream_of(cd4ml_home / "uat", server["uri"])
    with pytest.raises(UpstreamCredentialsError, match="HTTP 401") as refused:
        import_model(uat, credentials=(READER, "not-the-password"))
    assert "not-the-password" not in str(refused.value) and refused.value.__cause__ is None
    # this process's own account (here one the upstream would accept) stays at home: no Connection, no credentials
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server["admin"])
    monkeypatch.delenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY", raising=False)
    with pytest.raises(UpstreamCredentialsError, match="refused no account"):
        import_model(uat)
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == server["admin"]  # put back afterwards
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    assert MlflowClient(uat.tracking_uri, uat.tracking_uri).search_model_versions(
        f"name = '{uat.registry.model_name}'") == []
