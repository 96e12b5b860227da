"""Import across registries: two real MLflow stores that share nothing (own SQLite, own artifact root, own lake).

``upstream``: a sit home whose champion is a real model trained on the real digits
(tests/factories/champion.py). Each test's uat downstream is another home whose
``release.upstream_registry.tracking_uri`` names sit's store. Bad upstream versions (a file changed
after registration, no manifest, no lineage) are registered by hand in the upstream next to the champion.
The read-only account and a refused password are tested against a real ``mlflow server --app-name
basic-auth`` in tests/tasks/release/test_model_import_server.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories.digits import write_curated_digits
from tests.peers import free_port


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from tests.factories.champion import champion_home

    return champion_home(str(tmp_path_factory.mktemp("import-upstream")))


def downstream_of(home: Path, uri: str, **registry: Any) -> Any:
    from tasks.settings import load_settings

    uat = load_settings("uat", home=str(home))
    upstream_registry = uat.release.upstream_registry.model_copy(update={"tracking_uri": uri, **registry})
    release = uat.release.model_copy(update={"pattern": "deploy_model", "upstream": "sit",
                                             "upstream_registry": upstream_registry})
    gate = uat.gate.model_copy(update={"smoke_test": False})
    return uat.model_copy(update={"release": release, "gate": gate})


@pytest.fixture
def uat(upstream: tuple[Any, Any], cd4ml_home: Path) -> Any:
    sit, _ = upstream
    return downstream_of(cd4ml_home / "uat-deployment", sit.tracking_uri)


def _versions(settings: Any, name: str | None = None) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    return client.search_model_versions(f"name = '{name or settings.registry.model_name}'")


def _snapshot(settings: Any) -> list[tuple[str, dict[str, str], tuple[str, ...]]]:
    """Every upstream version with its tags and aliases: what an import must leave as it was."""
    from mlflow import MlflowClient

    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    aliases = tuple(sorted(client.get_registered_model(settings.registry.model_name).aliases.items()))
    return sorted((v.version, dict(v.tags), aliases) for v in _versions(settings))


def _hand_registered(sit: Any, model: Any, tags: dict[str, str], manifest: bool) -> tuple[int, Path]:
    """A new upstream version with the champion's files in a run of its own; returns (version, its files on disk)."""
    import mlflow

    from tasks.models.integrity import CLIENT_WRITTEN, record_manifest
    from tasks.models.registry import mlflow_client

    client = mlflow_client(sit)  # MLflow resolves models:/ through the process-wide registry URI
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=model.uri, tracking_uri=sit.tracking_uri,
                                                      registry_uri=sit.tracking_uri))
    (folder / CLIENT_WRITTEN).unlink(missing_ok=True)
    experiment = client.get_experiment_by_name(sit.tracking.experiment).experiment_id
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(folder), "model")
    client.set_terminated(run.info.run_id)
    version = client.create_model_version(sit.registry.model_name, f"runs:/{run.info.run_id}/model",
                                          run_id=run.info.run_id, tags=tags)
    if manifest:
        record_manifest(sit, client, client.get_model_version(version.name, version.version))
    return int(version.version), Path(run.info.artifact_uri.removeprefix("file://")) / "model"


def _lineage_tags(sit: Any, model: Any) -> dict[str, str]:
    from mlflow import MlflowClient

    tags = MlflowClient(sit.tracking_uri, sit.tracking_uri).get_model_version(model.name, str(model.version)).tags
    return {k: v for k, v in tags.items() if k in ("cd4ml.curated_table", "cd4ml.curated_version", "cd4ml.raw_version",
                                                   "cd4ml.env", "cd4ml.gate.decision")}  # and sit's gate pass


def test_the_upstream_champion_is_imported_verified_tagged_once_and_gated_downstream(upstream, uat) -> None:
    from mlflow import MlflowClient

    from tasks.models.integrity import recorded_manifest, verify
    from tasks.release import audit
    from tasks.release.evaluate import evaluate
    from tasks.release.lineage import format_lineage, lineage
    from tasks.release.model_import import import_model, pending_import
    from tasks.release.release import mark_challenger, promote

    sit, model = upstream
    before = _snapshot(sit)
    assert pending_import(uat) == model.version  # the reconcile's question: nothing imported yet
    imported = import_model(uat)
    assert (imported.version, imported.source_env, imported.source_version, imported.reused) == (1, "sit", model.version,
                                                                                                  False)
    assert import_model(uat).to_dict() == {**imported.to_dict(), "reused": True}  # the same event twice: one version
    assert [int(v.version) for v in _versions(uat)] == [1]
    assert _snapshot(sit) == before  # nothing written upstream

    down = MlflowClient(uat.tracking_uri, uat.tracking_uri)
    version = down.get_model_version(uat.registry.model_name, "1")
    source = MlflowClient(sit.tracking_uri, sit.tracking_uri).get_model_version(model.name, str(model.version))
    tags = version.tags
    assert recorded_manifest(version) == recorded_manifest(source)  # every file, hashed again here
    assert verify(uat, f"models:/{uat.registry.model_name}/1").files == len(recorded_manifest(source))
    assert tags["cd4ml.import.source_registry"] == sit.tracking_uri and tags["cd4ml.import.source_env"] == "sit"
    assert (tags["cd4ml.import.source_model"], tags["cd4ml.import.source_version"]) == (model.name, str(model.version))
    assert tags["cd4ml.import.source_run_id"] == source.run_id
    assert json.loads(tags["cd4ml.import.source_gate"])["decision"] == "pass"
    assert json.loads(tags["cd4ml.import.source_release"])["action"] == "promote"
    assert tags["cd4ml.curated_version"] == source.tags["cd4ml.curated_version"] and tags["cd4ml.env"] == "uat"
    assert version.run_id != source.run_id and down.get_run(version.run_id).info.status == "FINISHED"

    info = lineage(f"models:/{uat.registry.model_name}/1", home=uat.home)  # the hop into sit's own registry
    assert info["copied_from"]["registry"] == sit.tracking_uri and info["copied_from"]["aliases"] == ["champion"]
    assert info["copied_from"]["run"]["run_id"] == source.run_id and info["copied_from"]["data"]["raw"]["version"] == 1
    assert [r["action"] for r in info["copied_from"]["releases"]][-1] == "promote"  # sit's ledger rows, as tagged there
    assert f"copied from registry {sit.tracking_uri}:" in format_lineage(info)

    curated = write_curated_digits(uat.curated_table, raw_version=2)  # uat's own data
    assert pending_import(uat) == model.version  # imported, not yet gated: a lost run is picked up again
    gate = evaluate(uat, 1, uat.curated_table, curated)
    assert gate.passed, gate.reasons
    assert pending_import(uat) is None
    mark_challenger(uat, 1, gate, run_id="import-test")
    promote(uat, 1, gate, run_id="import-test", actor="tests")
    rows = audit.read(uat)
    assert rows[-1].action == "promote" and f"sit {model.name} v{model.version}" in rows[-1].reason


def test_a_file_changed_upstream_after_registration_is_refused_naming_it_with_one_alert(upstream, uat) -> None:
    from tasks.alerting.incidents import open_incidents
    from tasks.models.integrity import ModelIntegrityError
    from tasks.release.model_import import import_model

    sit, model = upstream
    version, files = _hand_registered(sit, model, _lineage_tags(sit, model), manifest=True)
    (files / "MLmodel").write_text((files / "MLmodel").read_text() + "\n# changed after registration\n")
    for _ in range(2):
        with pytest.raises(ModelIntegrityError) as refused:
            import_model(uat, source_version=version)
        assert refused.value.problems == [("changed", "MLmodel")] and "'MLmodel'" in str(refused.value)
    assert _versions(uat) == []
    alerts = [i for i in open_incidents(uat) if i.kind == "model_tampered"]
    assert len(alerts) == 1 and alerts[0].dedup_key == f"uat:model_tampered:{model.name}:v{version}"


def test_an_upstream_version_without_manifest_lineage_or_gate_pass_is_a_clear_error_importing_nothing(upstream, uat) -> None:
    from tasks.alerting.incidents import open_incidents
    from tasks.release.model_import import UnverifiableSourceError, import_model

    sit, model = upstream
    no_manifest, _ = _hand_registered(sit, model, _lineage_tags(sit, model), manifest=False)
    no_lineage, _ = _hand_registered(sit, model, {}, manifest=True)
    # registered with lineage and manifest, but sit's gate never passed it (failed, or never ran): whoever names
    # it (a Param, a forged announcement), it does not travel on
    failed = {**_lineage_tags(sit, model), "cd4ml.gate.decision": "fail"}
    never_gated = {k: v for k, v in failed.items() if k != "cd4ml.gate.decision"}
    ungated = [_hand_registered(sit, model, tags, manifest=True)[0] for tags in (failed, never_gated)]
    for _ in range(2):  # the event, then the reconcile: one alert per upstream version
        with pytest.raises(UnverifiableSourceError, match="no valid integrity manifest"):
            import_model(uat, source_version=no_manifest)
        with pytest.raises(UnverifiableSourceError, match="no lineage tags"):
            import_model(uat, source_version=no_lineage)
        for version in ungated:
            with pytest.raises(UnverifiableSourceError, match="has not passed its own environment's gate"):
                import_model(uat, source_version=version)
    assert _versions(uat) == []
    alerts = {i.dedup_key: i for i in open_incidents(uat) if i.kind == "source_unverifiable"}
    key = f"uat:source_unverifiable:sit:{model.name}:v"
    assert sorted(alerts) == sorted(f"{key}{v}" for v in (no_manifest, no_lineage, *ungated))
    assert "no valid integrity manifest" in alerts[f"{key}{no_manifest}"].alert.error
    assert "no lineage tags" in alerts[f"{key}{no_lineage}"].alert.error
    assert all(a.severity == "critical" and a.alert.versions["model_name"] == model.name for a in alerts.values())



def test_an_upstream_without_champion_or_unreachable_is_a_clear_error_importing_nothing(cd4ml_home, upstream) -> None:
    from mlflow import MlflowClient

    from tasks.release.model_import import UpstreamNoChampionError, UpstreamUnreachableError, import_model

    empty = f"sqlite:///{cd4ml_home / 'empty-sit' / 'mlflow.db'}"
    (cd4ml_home / "empty-sit").mkdir(parents=True)
    MlflowClient(empty, empty).search_experiments()  # a store that exists and holds no model
    uat = downstream_of(cd4ml_home / "uat", empty)
    with pytest.raises(UpstreamNoChampionError, match="upstream sit has no champion"):
        import_model(uat)

    missing = cd4ml_home / "nowhere" / "mlflow.db"
    with pytest.raises(UpstreamUnreachableError, match="has no store there"):
        import_model(downstream_of(cd4ml_home / "uat", f"sqlite:///{missing}"))
    assert not missing.exists()  # not created by asking

    closed = downstream_of(cd4ml_home / "uat", f"http://127.0.0.1:{free_port()}", attempts=2, timeout_s=2)
    started = time.monotonic()
    with pytest.raises(UpstreamUnreachableError, match="did not answer in 2 tries") as refused:
        import_model(closed)
    assert time.monotonic() - started < 20  # bounded: no MLflow default of 7 retries with backoff
    assert refused.value.__cause__ is None and refused.value.__context__ is not None
    assert _versions(uat) == []


def test_an_upstream_endpoint_outside_the_allowed_schemes_or_with_credentials_is_refused(cd4ml_home, tmp_path) -> None:
    import yaml

    from tasks.release.model_import import UpstreamRegistryError, import_model, upstream_of
    from tasks.settings import SettingsError, UpstreamRegistrySettings, load_settings

    with pytest.raises(ValueError, match="'file' is not in allowed_schemes"):
        UpstreamRegistrySettings(tracking_uri="file:///etc")
    with pytest.raises(ValueError, match="must not carry credentials"):
        UpstreamRegistrySettings(tracking_uri="https://reader:secret@mlflow.sit.example")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "base.yaml").write_text("")
    (conf / "sit.yaml").write_text("")
    (conf / "uat.yaml").write_text(yaml.safe_dump({"release": {
        "pattern": "deploy_model", "upstream": "sit",
        "upstream_registry": {"tracking_uri": "https://reader:secret@mlflow.sit.example"}}}))
    with pytest.raises(SettingsError) as refused:
        load_settings("uat", conf_dir=conf)
    assert "secret" not in str(refused.value)
    # settings built in code skip the loader: the import checks again before contacting anything
    uat = downstream_of(cd4ml_home / "uat", "https://mlflow.sit.example")
    uat = uat.model_copy(update={"release": uat.release.model_copy(update={
        "upstream_registry": uat.release.upstream_registry.model_copy(update={"tracking_uri": "ftp://mlflow.sit.example"})})})
    with pytest.raises(UpstreamRegistryError, match="'ftp'"):
        import_model(uat)
    assert upstream_of(downstream_of(cd4ml_home / "uat", "https://h.example")).public_uri == "https://h.example"


def test_the_connection_gives_the_account_in_airflows_uri_or_json_form_and_never_echoes_it() -> None:
    from tasks.release.model_import import UpstreamCredentialsError, connection_credentials, public_uri

    env = {"AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY": "http://cd4ml-reader:p%40ss@mlflow.sit.example:5000"}
    assert connection_credentials("cd4ml_upstream_registry", env) == ("cd4ml-reader", "p@ss")
    env = {"AIRFLOW_CONN_UP": json.dumps({"conn_type": "http", "login": "r", "password": "pw"})}
    assert connection_credentials("up", env) == ("r", "pw")
    assert connection_credentials("up", {}) is None
    with pytest.raises(UpstreamCredentialsError) as refused:
        connection_credentials("up", {"AIRFLOW_CONN_UP": "http://only-a-login@host"})
    assert "only-a-login" not in str(refused.value)
    assert public_uri("https://u:p@mlflow.example:8443/base?token=x#f") == "https://mlflow.example:8443/base"
    assert public_uri("sqlite:////srv/mlflow.db?mode=ro") == "sqlite:////srv/mlflow.db"


def test_cd4ml_import_model_imports_from_the_command_line_and_says_what_is_pending(
        upstream, cd4ml_home, tmp_path, monkeypatch, capsys) -> None:
    import yaml

    from tasks.cli import main

    sit, model = upstream
    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("base", "sit", "prod"):
        (conf / f"{name}.yaml").write_text("")
    uat_conf = {"release": {"pattern": "deploy_model", "upstream": "sit", "upstream_registry": {"tracking_uri": sit.tracking_uri}}}
    (conf / "uat.yaml").write_text(yaml.safe_dump(uat_conf))
    monkeypatch.setenv("CD4ML_CONF_DIR", str(conf))
    assert main(["import-model", "--env", "uat", "--check"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": model.version}
    assert main(["import-model", "--env", "uat"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["version"], out["source_env"], out["source_version"], out["reused"]) == (1, "sit", model.version, False)
    assert main(["import-model", "--env", "uat", "--source-version", "99"]) == 1
    assert "has no version 99" in capsys.readouterr().err


def _import_racing(settings: Any, barrier: Any, results: Any) -> None:
    """One of two racers, in a spawned process: it looks for an earlier import, waits for the other to have
    looked too (so neither can see the other's version: the race, every run), then imports for real."""
    from tasks.release import model_import

    look = model_import._existing

    def look_then_wait(*args: Any, **kwargs: Any) -> Any:
        found = look(*args, **kwargs)
        barrier.wait(timeout=120)
        return found

    model_import._existing = look_then_wait
    try:
        results.put(model_import.import_model(settings).to_dict())
    except Exception as exc:  # the parent asserts on it; a child's traceback alone would be lost
        results.put({"error": f"{type(exc).__name__}: {exc}"})


@pytest.fixture(params=["sqlite", "postgresql"])
def racing_uat(request: pytest.FixtureRequest, uat: Any) -> Iterator[Any]:
    """uat on its SQLite store, or on a throwaway database of this machine's PostgreSQL (as deployments run it)."""
    if request.param == "sqlite":
        yield uat
        return
    import psycopg2

    name = f"cd4ml_import_race_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=3)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        uri = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
        yield uat.model_copy(update={"tracking": uat.tracking.model_copy(update={"uri": uri})})
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_two_imports_of_one_source_at_once_converge_on_one_version(upstream, racing_uat) -> None:
    import multiprocessing

    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    from tasks.release.model_import import import_model

    sit, model = upstream
    uat = racing_uat
    client = MlflowClient(uat.tracking_uri, uat.tracking_uri)
    client.search_experiments()  # the deployment's store exists before any import (its tables are made once)
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    racers = [spawn.Process(target=_import_racing, args=(uat, barrier, results)) for _ in range(2)]
    for racer in racers:
        racer.start()
    answers = [results.get(timeout=300) for _ in racers]
    for racer in racers:
        racer.join(timeout=60)
    assert all("error" not in answer for answer in answers), answers
    assert {a["version"] for a in answers} == {1} and sorted(a["reused"] for a in answers) == [False, True]
    assert {a["source_version"] for a in answers} == {model.version}
    assert [int(v.version) for v in _versions(uat)] == [1]  # the higher one was deleted by the racer that made it
    experiment = client.get_experiment_by_name(uat.tracking.experiment).experiment_id
    deleted = client.search_runs([experiment], run_view_type=ViewType.DELETED_ONLY)
    assert len(deleted) == 1 and deleted[0].info.run_id != client.get_model_version(uat.registry.model_name, "1").run_id
    assert import_model(uat).reused and [int(v.version) for v in _versions(uat)] == [1]  # and later imports reuse it


def test_a_registration_refused_because_a_rival_took_its_number_registers_again_and_any_other_refusal_is_raised(
        tmp_path: Path) -> None:
    """PostgreSQL refuses the later of two registrations given the same number at commit: a real (SQLite) registry
    where the first attempt lets a rival register, then is refused as that commit would be."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.release.model_import import _create_version

    class RacedClient(MlflowClient):
        rivals, refuse = 1, False

        def create_model_version(self, name, source, **kwargs):
            if self.refuse:
                raise MlflowException("refused, and no rival registered")
            if self.rivals:
                self.rivals -= 1
                super().create_model_version(name, source, **kwargs)  # the rival's registration commits first
                raise MlflowException("the commit was refused")
            return super().create_model_version(name, source, **kwargs)

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = RacedClient(uri, uri)
    client.create_registered_model("m")
    run = client.create_run(client.create_experiment("e", artifact_location=str(tmp_path / "a")))
    made = _create_version(client, "m", f"runs:/{run.info.run_id}/model", run.info.run_id, {"k": "v"})
    assert made.version in (2, "2") and made.tags == {"k": "v"}

    client.refuse = True
    with pytest.raises(MlflowException):
        _create_version(client, "m", f"runs:/{run.info.run_id}/model", run.info.run_id, {})
    assert len(client.search_model_versions("name = 'm'")) == 2
