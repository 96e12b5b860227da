"""Model integrity: a registered version's files are fingerprinted at registration and checked before every load.

The attack of issue 22, for real: one line appended to ``artifacts/runtime/__init__.py`` of a
registered, promoted version in the (file) artifact store. The gate, the scorer, the REST
server's start and the deploy-model copy must each refuse, naming that file; ``cd4ml verify``
exits 1; one ``model_tampered`` alert in all; and the appended line (it would write a marker
file) never runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tests.factories.digits import split_rows

REPO = Path(__file__).resolve().parents[3]
RUNTIME_INIT = "artifacts/runtime/__init__.py"


# --------------------------------------------------------------------------- the manifest, on plain files


def test_the_manifest_names_every_changed_missing_and_extra_file(tmp_path: Path) -> None:
    from tasks.models.integrity import differences, file_manifest

    (tmp_path / "artifacts" / "runtime").mkdir(parents=True)
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    (tmp_path / "artifacts" / "runtime" / "__init__.py").write_text("")
    (tmp_path / "artifacts" / "state_dict.pt").write_bytes(b"\x00" * 10)
    recorded = file_manifest(tmp_path)
    assert sorted(recorded) == ["MLmodel", "artifacts/runtime/__init__.py", "artifacts/state_dict.pt"]
    assert differences(recorded, file_manifest(tmp_path)) == []

    (tmp_path / "artifacts" / "runtime" / "__init__.py").write_text("import os\n")
    (tmp_path / "artifacts" / "state_dict.pt").unlink()
    (tmp_path / "artifacts" / "runtime" / "sitecustomize.py").write_text("")
    (tmp_path / "artifacts" / "weights.pt").symlink_to("/etc/hostname")  # hashed as a link, never followed
    (tmp_path / "registered_model_meta").write_text("model_name: m\n")  # MLflow's client writes it per download
    assert differences(recorded, file_manifest(tmp_path)) == [
        ("changed", "artifacts/runtime/__init__.py"),
        ("extra", "artifacts/runtime/sitecustomize.py"),
        ("missing", "artifacts/state_dict.pt"),
        ("extra", "artifacts/weights.pt"),
    ]


def test_a_version_without_a_consistent_manifest_is_refused(tmp_path: Path) -> None:
    from mlflow.entities.model_registry import ModelVersion, ModelVersionTag

    from tasks.errors import DataError
    from tasks.models.integrity import ModelIntegrityError, manifest_tags, recorded_manifest

    def version(tags: dict[str, str]) -> ModelVersion:
        return ModelVersion("m", "3", 0, tags=[ModelVersionTag(k, v) for k, v in tags.items()])

    good = manifest_tags({"MLmodel": "ab" * 32})
    assert recorded_manifest(version(good)) == {"MLmodel": "ab" * 32}
    forged = {**good, "cd4ml.manifest": json.dumps({"MLmodel": "cd" * 32})}  # manifest rewritten, digest not
    for tags in ({}, forged, {**good, "cd4ml.manifest": "{not json"}):
        with pytest.raises(ModelIntegrityError) as caught:
            recorded_manifest(version(tags))
        assert isinstance(caught.value, DataError) and not isinstance(caught.value, ValueError)
        assert caught.value.problems[0][0] == "manifest" and "models:/m/3" in str(caught.value)


# --------------------------------------------------------------------------- the attack, on a real model


def _version_folder(settings, name: str, version: int) -> Path:
    """Where the file artifact store keeps the version's files (what an attacker with write access edits)."""
    from tasks.models.registry import mlflow_client

    client = mlflow_client(settings)
    uri = client.get_model_version_download_uri(name, str(version))
    if uri.startswith("models:/"):  # MLflow 3: the logged model's own artifact location
        uri = client.get_logged_model(uri.removeprefix("models:/").split("/")[0]).artifact_location
    folder = Path(unquote(urlparse(uri).path))
    assert (folder / RUNTIME_INIT).is_file(), sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    return folder


@pytest.fixture(scope="module")
def tampered(tmp_path_factory: pytest.TempPathFactory):
    """(settings, ServingModel, marker) of a real champion whose bundled runtime got one line appended."""
    from tests.factories.champion import champion_home

    settings, model = champion_home(str(tmp_path_factory.mktemp("tampered-home")))
    marker = tmp_path_factory.mktemp("marker") / "the-appended-line-ran"
    init = _version_folder(settings, model.name, model.version) / RUNTIME_INIT
    with init.open("a") as stream:  # the attack: one line, run on import by whatever loads the model
        stream.write(f"\nimport pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n")
    return settings, model, marker


def _refused(caught: pytest.ExceptionInfo, model) -> None:
    error = caught.value
    assert error.name == model.name and error.version == model.version
    assert error.problems == [("changed", RUNTIME_INIT)]
    assert RUNTIME_INIT in str(error) and "pathlib" not in str(error)  # the file named, never its content


def test_a_clean_version_verifies_and_its_manifest_lives_in_the_registry(champion, capsys, monkeypatch) -> None:
    from tasks.cli import main
    from tasks.models.integrity import TAG_MANIFEST, TAG_MANIFEST_SHA256, manifest_digest
    from tasks.models.registry import mlflow_client

    settings, model = champion
    tags = mlflow_client(settings).get_model_version(model.name, str(model.version)).tags
    manifest = json.loads(tags[TAG_MANIFEST])
    assert manifest_digest(manifest) == tags[TAG_MANIFEST_SHA256]
    assert {"MLmodel", "python_model.pkl", RUNTIME_INIT, "artifacts/runtime/predictor.py"} <= set(manifest)
    assert any(path.endswith("state_dict.pt") for path in manifest) and any("requirements" in p for p in manifest)
    monkeypatch.setenv("CD4ML_HOME", settings.home)
    monkeypatch.setenv("CD4ML_ENV", settings.env)
    assert main(["verify", f"models:/{model.name}@champion"]) == 0
    assert capsys.readouterr().out.strip() == (f"models:/{model.name}/{model.version}: {len(manifest)} files match "
                                               f"manifest {tags[TAG_MANIFEST_SHA256]}")
    for unknown in (f"models:/{model.name}/999", f"runs:/{model.run_id}/model"):  # nothing to check: exit 1, one line
        assert main(["verify", unknown]) == 1
        assert capsys.readouterr().err.startswith(f"cd4ml verify: {unknown}")


def test_the_gate_refuses_a_tampered_model_naming_the_file(tampered) -> None:
    from tasks.models.integrity import ModelIntegrityError
    from tasks.models.registry import get_model_version, mlflow_client, trained_on
    from tasks.release.evaluate import evaluate

    settings, model, marker = tampered
    table, version = trained_on(get_model_version(mlflow_client(settings), model.name, model.version))
    with pytest.raises(ModelIntegrityError) as caught:
        evaluate(settings, model.version, table, version)
    _refused(caught, model)
    assert not marker.exists()


def test_the_gate_smoke_test_refuses_it_too(tampered) -> None:
    from tasks.models.integrity import ModelIntegrityError
    from tasks.release.evaluate import smoke_test

    settings, model, marker = tampered
    with pytest.raises(ModelIntegrityError) as caught:
        smoke_test(settings, model.uri, [r["image"] for r in split_rows("test")[:2]], {str(d) for d in range(10)})
    _refused(caught, model)
    assert not marker.exists()


def test_the_scorer_refuses_it_before_reading_an_image(tampered, tmp_path: Path) -> None:
    from tasks.models.integrity import ModelIntegrityError
    from tasks.serving.score import score

    settings, model, marker = tampered
    for i, row in enumerate(split_rows("test")[:3]):
        (tmp_path / f"{i}.png").write_bytes(row["image"])
    with pytest.raises(ModelIntegrityError) as caught:
        score(settings, str(tmp_path), run_id="manual__tampered", logical_date="2026-11-22")
    _refused(caught, model)
    assert not marker.exists()


def test_the_rest_server_refuses_to_start_naming_the_file(tampered, tmp_path: Path) -> None:
    settings, model, marker = tampered
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CD4ML_"))}
    env.update({"CD4ML_HOME": settings.home, "CD4ML_ENV": settings.env, "TMPDIR": str(tmp_path)})
    done = subprocess.run([sys.executable, "-m", "tasks.cli", "serve", "--port", "5999"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.stdout, done.stderr)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cd4ml serve: models:/{model.name}/{model.version} does not match") and RUNTIME_INIT in last
    assert done.stdout == ""  # nothing announced, nothing served
    assert not any(tmp_path.glob("cd4ml-serve-*"))  # no copy left for a server
    assert not marker.exists()


def test_the_deploy_model_copy_refuses_it_and_copies_nothing(tampered) -> None:
    from tasks.models.integrity import ModelIntegrityError
    from tasks.models.registry import mlflow_client
    from tasks.release.model_import import import_model
    from tasks.settings import load_settings

    settings, model, marker = tampered
    uat = load_settings("uat", home=settings.home)
    uat = uat.model_copy(update={"release": uat.release.model_copy(update={"pattern": "deploy_model", "upstream": "sit"})})
    with pytest.raises(ModelIntegrityError) as caught:
        import_model(uat)
    _refused(caught, model)
    assert not mlflow_client(uat).search_model_versions(f"name = '{uat.registry.model_name}'")
    assert not marker.exists()


def test_cd4ml_verify_exits_1_and_all_refusals_raised_one_alert(tampered, capsys, monkeypatch) -> None:
    from tasks.alerting.incidents import open_incidents
    from tasks.cli import main

    settings, model, marker = tampered
    monkeypatch.setenv("CD4ML_HOME", settings.home)
    monkeypatch.setenv("CD4ML_ENV", settings.env)
    assert main(["verify", model.uri]) == 1
    err = capsys.readouterr().err
    assert RUNTIME_INIT in err and "pathlib" not in err
    alerts = [i for i in open_incidents(settings) if i.kind == "model_tampered"]
    assert len(alerts) == 1, alerts  # the gate, smoke test, scorer, server, copy and verify: one incident
    assert alerts[0].dedup_key == f"{settings.env}:model_tampered:{model.name}:v{model.version}"
    assert alerts[0].severity == "critical" and RUNTIME_INIT in json.dumps(alerts[0].alert.details)
    assert not marker.exists()


def test_drift_features_refuse_it_instead_of_falling_back_to_pixels(tampered) -> None:
    from tasks.models.integrity import ModelIntegrityError
    from tasks.monitoring.drift import Featurizer

    settings, model, marker = tampered
    with pytest.raises(ModelIntegrityError) as caught:
        Featurizer(settings, model.uri)
    _refused(caught, model)
    assert not marker.exists()


def test_a_copy_whose_files_differ_from_its_source_is_refused_and_records_nothing(champion) -> None:
    from tasks.models.integrity import TAG_MANIFEST, ModelIntegrityError, record_manifest, recorded_manifest
    from tasks.models.registry import mlflow_client

    settings, model = champion
    client = mlflow_client(settings)
    source = client.get_model_version(model.name, str(model.version))
    copy = client.copy_model_version(f"models:/{model.name}/{model.version}", f"{model.name}-integrity-copy")
    expected = {**recorded_manifest(source), RUNTIME_INIT: "0" * 64}  # as if the source's file changed in between
    with pytest.raises(ModelIntegrityError) as caught:
        record_manifest(settings, client, client.get_model_version(copy.name, copy.version), expected=expected)
    assert caught.value.problems == [("changed", RUNTIME_INIT)]
    # MLflow copied the source's tags; what was found is not recorded over them
    assert json.loads(client.get_model_version(copy.name, copy.version).tags[TAG_MANIFEST]) != expected
    assert record_manifest(settings, client, copy, expected=recorded_manifest(source)) == recorded_manifest(source)


# --------------------------------------------------------------------------- two registries in one process


def _one_version(settings, weights: bytes) -> None:
    """Version 1 of ``settings``' model in ``settings``' own store: one weights file, its manifest recorded."""
    from tasks.models.integrity import record_manifest
    from tasks.models.registry import ensure_experiment, mlflow_client

    client = mlflow_client(settings)  # also points MLflow's process-wide URIs at this store
    files = Path(settings.home) / "files"
    files.mkdir(parents=True)
    (files / "weights.bin").write_bytes(weights)
    run = client.create_run(ensure_experiment(settings, client))
    client.log_artifacts(run.info.run_id, str(files), "model")
    client.set_terminated(run.info.run_id)
    client.create_registered_model(settings.registry.model_name)
    version = client.create_model_version(settings.registry.model_name, f"runs:/{run.info.run_id}/model",
                                          run_id=run.info.run_id)
    record_manifest(settings, client, version)


def test_a_version_is_read_from_its_own_registry_whatever_mlflow_points_at(tmp_path: Path, monkeypatch) -> None:
    """Two registries with the same model name and version; MLflow's process-wide URIs name the OTHER one."""
    import mlflow

    from tasks.models.integrity import verified_model, verify
    from tasks.models.registry import mlflow_client
    from tasks.settings import load_settings

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    saved = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    ours, other = (load_settings("sit", home=str(tmp_path / home)) for home in ("ours", "other"))
    assert ours.tracking_uri != other.tracking_uri and ours.registry.model_name == other.registry.model_name
    try:
        _one_version(ours, b"ours" * 1024)
        _one_version(other, b"other" * 1024)
        mlflow_client(other)
        assert mlflow.get_registry_uri() == other.tracking_uri == mlflow.get_tracking_uri()
        uri = f"models:/{ours.registry.model_name}/1"
        assert verify(ours, uri).files == 1  # the old download read the other store's v1: "changed weights.bin"
        with verified_model(ours, uri) as (folder, verified):
            assert (folder / "weights.bin").read_bytes() == b"ours" * 1024 and verified.version == 1
        with verified_model(other, uri) as (folder, _):
            assert (folder / "weights.bin").read_bytes() == b"other" * 1024
        assert mlflow.get_registry_uri() == other.tracking_uri  # read, not re-pointed
    finally:  # MLflow's setters export the URIs as variables, which settings read: not left behind
        mlflow.set_tracking_uri(saved[0])
        mlflow.set_registry_uri(saved[1])
        os.environ.pop("MLFLOW_TRACKING_URI", None)  # deleted above: monkeypatch puts back what was there
        os.environ.pop("MLFLOW_REGISTRY_URI", None)


def test_a_tag_write_refused_because_a_concurrent_writer_set_the_same_value_is_done(tmp_path: Path) -> None:
    """Two imports converging on one version both record its manifest: MLflow's store reads then inserts a new tag,
    so the later insert of the same tag is refused. Same value: done; another value: the refusal is raised."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.models.integrity import set_version_tag

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    client.create_registered_model("m")
    version = client.create_model_version("m", str(tmp_path / "model"))
    real = client.set_model_version_tag

    def concurrent_writer_first(value: str):
        def refused(name: str, v: str, key: str, _mine: str) -> None:
            real(name, v, key, value)  # the other racer's insert commits first
            raise MlflowException("UNIQUE constraint failed")  # ours is refused (the store's own error)
        return refused

    client.set_model_version_tag = concurrent_writer_first("abc")
    set_version_tag(client, "m", version.version, "cd4ml.manifest", "abc")
    assert client.get_model_version("m", version.version).tags["cd4ml.manifest"] == "abc"
    client.set_model_version_tag = concurrent_writer_first("other")
    with pytest.raises(MlflowException):
        set_version_tag(client, "m", version.version, "cd4ml.digest", "abc")
