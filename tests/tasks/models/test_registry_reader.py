"""Scoring and serving read the registry as an account MLflow lets read only: against a real basic-auth server.

The server is MLflow's own (``mlflow server --app-name basic-auth``, the ini ``cd4ml up`` writes in
scale-out) on a free 127.0.0.1 port with a SQLite store in tmp. The admin registers a model version
with its manifest and makes it champion; the reader account, created by the code ``cd4ml up`` runs,
resolves the champion and downloads and checks its files through the scoring path, and every write
it tries (a new version, an alias, a tag, a delete) is refused by the server with HTTP 403.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.models import identity
from tasks.ops.registry_accounts import RegistryAccountError, _call, ensure_reader
from tests.factories.mlflow_server import ADMIN, basic_auth_server

pytestmark = pytest.mark.server
READER = "cd4ml-reader"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A basic-auth MLflow server; yields its URI and the two accounts' passwords (generated, never literals)."""
    with basic_auth_server(tmp_path_factory.mktemp("mlflow-auth"), timeout_s=45) as server:
        yield {**server, "reader_password": secrets.token_urlsafe(16)}


def _signs_in(uri: str, account: tuple[str, str]) -> bool:
    """One read as ``account`` (the accounts module's own request): True when the server lets it in, False on its 401."""
    status, _ = _call(uri, account, "GET", "/api/2.0/mlflow/registered-models/search")
    assert status in (200, 401), status
    return status == 200


def _registered_champion(settings, client, tmp_path: Path) -> tuple[str, str]:
    """As the admin: a run with model files, version 1 of this environment's model with its manifest, champion."""
    from tasks.models.integrity import record_manifest

    files = tmp_path / "model"
    (files / "runtime").mkdir(parents=True)
    (files / "weights.bin").write_bytes(os.urandom(4096))
    (files / "runtime" / "__init__.py").write_text("VERSION = 1\n")
    run = client.create_run(client.create_experiment("reader-test"))
    client.log_artifacts(run.info.run_id, str(files), "model")
    client.set_terminated(run.info.run_id)
    name = settings.registry.model_name
    client.create_registered_model(name)
    version = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    record_manifest(settings, client, version)
    client.set_registered_model_alias(name, settings.registry.champion_alias, version.version)
    return name, run.info.run_id


def test_the_reader_resolves_and_downloads_the_champion_and_every_write_is_refused(
        mlflow_server, settings, monkeypatch, tmp_path) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.models.champion import serving_model
    from tasks.models.integrity import verify
    from tasks.models.registry import mlflow_client

    uri, admin = mlflow_server["uri"], (ADMIN, mlflow_server["admin_password"])
    reader = (READER, mlflow_server["reader_password"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(identity.USERNAME_VARIABLE, ADMIN)
    monkeypatch.setenv(identity.PASSWORD_VARIABLE, admin[1])
    assert ensure_reader(uri, admin, reader) == "created"
    assert ensure_reader(uri, admin, reader) == "updated"  # the next `cd4ml up`: same account, password set again
    # The server remembers a verified password (auth_cache_ttl_seconds), but a password set through the API takes
    # effect at once: the old one is refused on the next request, not after the cache's 30 s.
    rotated = (READER, f"rotated-{reader[1]}")
    assert _signs_in(uri, reader) and _signs_in(uri, reader)  # verified, then from the cache
    assert ensure_reader(uri, admin, rotated) == "updated"
    assert not _signs_in(uri, reader) and _signs_in(uri, rotated)
    assert ensure_reader(uri, admin, reader) == "updated"
    assert not _signs_in(uri, rotated) and _signs_in(uri, reader)
    with pytest.raises(RegistryAccountError):
        ensure_reader(uri, admin, (ADMIN, "x"))  # never the admin under the reader's name
    # the project's client: it also points MLflow's process-wide URIs here (an earlier test may have set others)
    name, run_id = _registered_champion(settings, mlflow_client(settings), tmp_path)

    monkeypatch.setenv(identity.READER_USERNAME_VARIABLE, reader[0])
    monkeypatch.setenv(identity.READER_PASSWORD_VARIABLE, reader[1])
    with identity.as_reader() as configured:
        assert configured and os.environ[identity.USERNAME_VARIABLE] == READER
        model = serving_model(settings)  # scoring's and serving's lookup of the champion
        assert (model.name, model.version) == (name, 1)
        assert verify(settings, model.uri).files >= 2  # downloaded and checked against the manifest
        client = MlflowClient(uri, uri)
        writes = {
            "create a model version": lambda: client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id),
            "set an alias": lambda: client.set_registered_model_alias(name, "champion", "1"),
            "delete an alias": lambda: client.delete_registered_model_alias(name, "champion"),
            "set a version tag": lambda: client.set_model_version_tag(name, "1", "cd4ml.manifest", "{}"),
            "set a model tag": lambda: client.set_registered_model_tag(name, "owner", "reader"),
            "delete a version": lambda: client.delete_model_version(name, "1"),
            "delete the model": lambda: client.delete_registered_model(name),
        }
        for what, write in writes.items():
            with pytest.raises(MlflowException) as refused:
                write()
            assert refused.value.get_http_status_code() == 403, what
    assert os.environ[identity.USERNAME_VARIABLE] == ADMIN  # the process's own account is back afterwards
    admin_client = MlflowClient(uri, uri)
    version = admin_client.get_model_version(name, "1")
    assert admin_client.get_registered_model(name).aliases == {"champion": "1"}
    assert "owner" not in admin_client.get_registered_model(name).tags and len(version.tags) == 2  # manifest tags only
    assert [v.version for v in admin_client.search_model_versions(f"name='{name}'")] == ["1"]


def test_only_both_reader_variables_sign_in_and_the_server_gets_no_other_account(settings, monkeypatch) -> None:
    from tasks.serving.serve import server_env

    base = {identity.USERNAME_VARIABLE: ADMIN, identity.PASSWORD_VARIABLE: "writer-secret"}
    assert server_env(settings, base=dict(base))[identity.PASSWORD_VARIABLE] == "writer-secret"  # no reader: as before
    env = server_env(settings, base={**base, identity.READER_USERNAME_VARIABLE: READER,
                                     identity.READER_PASSWORD_VARIABLE: "reader-secret"})
    assert (env[identity.USERNAME_VARIABLE], env[identity.PASSWORD_VARIABLE]) == (READER, "reader-secret")
    assert "writer-secret" not in env.values()
    monkeypatch.setenv(identity.READER_USERNAME_VARIABLE, READER)
    monkeypatch.delenv(identity.READER_PASSWORD_VARIABLE, raising=False)
    with pytest.raises(identity.ReaderCredentialsError), identity.as_reader():
        pass
