"""The downstream gate's leakage check with the upstream deployment gone: what a model saw travels in its files.

``gone``: a sit home whose champion is trained on the real digits, imported into a uat home of its
own, after which sit's whole home (registry, artifacts, lake) is deleted. uat's curated table holds
30 images of sit's train split in its test split: the gate must remove them, reading only uat.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.factories.digits import curated_rows
from tests.tasks.release.test_model_import import downstream_of

PLANTED = 30


def _planted_table(uri: str) -> int:
    """The digits with the first ``PLANTED`` train images moved into the test split; returns the version."""
    from tasks.curation.curate import CURATED_SCHEMA
    from tasks.data import lake

    rows, moved = [], 0
    for row in curated_rows():
        if row["split"] == "train" and moved < PLANTED:
            row, moved = {**row, "split": "test"}, moved + 1
        rows.append(row)
    return lake.overwrite(uri, pa.Table.from_pylist(rows, schema=CURATED_SCHEMA),
                          metadata={"run_id": "test-curate", "logical_date": "2026-11-21", "step": "curate"})


@pytest.fixture(scope="module")
def gone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tasks.models.registry import trained_on
    from tasks.models.seen_images import from_table
    from tasks.release.model_import import import_model
    from tests.factories.champion import champion_home

    sit, _ = champion_home(str(tmp_path_factory.mktemp("seen-upstream")))
    uat = downstream_of(tmp_path_factory.mktemp("seen-downstream") / "uat", sit.tracking_uri)
    imported = import_model(uat)
    table, version = trained_on(_version(uat, imported.version))  # the lineage copied from upstream: sit's lake
    assert table == sit.curated_table
    upstream_seen = from_table(table, version, "the upstream champion")
    shutil.rmtree(sit.home)
    return {"uat": uat, "version": imported.version, "upstream_seen": upstream_seen, "upstream_table": table,
            "upstream_version": version}


def _version(settings: Any, number: int) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(settings.tracking_uri, settings.tracking_uri).get_model_version(settings.registry.model_name,
                                                                                      str(number))


def _removed(gate: Any) -> int:
    return json.loads(Path(gate.report_path).read_text())["details"]["test_images_removed_as_seen_in_training"]


def test_the_gate_removes_images_the_upstream_trained_on_without_reading_the_upstreams_lake(gone) -> None:
    from tasks.data import lake
    from tasks.models.integrity import recorded_manifest, verified_model
    from tasks.models.seen_images import DIGEST_BYTES, FILE_NAME, seen_by
    from tasks.release.evaluate import evaluate

    uat, number = gone["uat"], gone["version"]
    assert not lake.exists(gone["upstream_table"])  # the upstream deployment is gone
    version = _version(uat, number)
    assert f"artifacts/{FILE_NAME}" in recorded_manifest(version)  # carried and checked like every file
    with verified_model(uat, f"models:/{uat.registry.model_name}/{number}") as (folder, _):
        assert seen_by(version, folder) == gone["upstream_seen"]  # every train and val image, nothing else
        array = np.load(folder / "artifacts" / FILE_NAME, allow_pickle=False)
    assert array.dtype == np.uint8 and array.shape == (len(gone["upstream_seen"]), DIGEST_BYTES)

    curated = _planted_table(uat.curated_table)
    tests = sum(r["split"] == "test" for r in curated_rows()) + PLANTED
    gate = evaluate(uat, number, uat.curated_table, curated)
    assert _removed(gate) == PLANTED and gate.test_images == tests - PLANTED
    assert gate.passed, gate.reasons


def _without_seen_images(uat: Any, number: int, tags: dict[str, str]) -> int:
    """A uat version with the imported files minus seen_images.npy (as logged before it existed), manifest recorded."""
    import mlflow

    from tasks.models.integrity import CLIENT_WRITTEN, record_manifest
    from tasks.models.registry import mlflow_client
    from tasks.models.seen_images import FILE_NAME

    client = mlflow_client(uat)
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{uat.registry.model_name}/{number}",
                                                      tracking_uri=uat.tracking_uri, registry_uri=uat.tracking_uri))
    (folder / CLIENT_WRITTEN).unlink(missing_ok=True)
    (folder / "artifacts" / FILE_NAME).unlink()
    experiment = client.get_experiment_by_name(uat.tracking.experiment).experiment_id
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(folder), "model")
    client.set_terminated(run.info.run_id)
    version = client.create_model_version(uat.registry.model_name, f"runs:/{run.info.run_id}/model",
                                          run_id=run.info.run_id, tags=tags)
    record_manifest(uat, client, client.get_model_version(version.name, version.version))
    return int(version.version)


def test_a_version_without_the_file_falls_back_to_a_reachable_table_else_the_gate_fails(gone) -> None:
    from tasks.curation.curate import CURATED_SCHEMA
    from tasks.data import lake
    from tasks.models.seen_images import SeenImagesUnavailableError
    from tasks.release.evaluate import evaluate

    uat = gone["uat"]
    curated = _planted_table(uat.curated_table)
    unreachable = _without_seen_images(uat, gone["version"], {"cd4ml.curated_table": gone["upstream_table"],
                                                              "cd4ml.curated_version": str(gone["upstream_version"])})
    with pytest.raises(SeenImagesUnavailableError, match="cannot be read from this deployment"):
        evaluate(uat, unreachable, uat.curated_table, curated)
    assert "cd4ml.gate.decision" not in _version(uat, unreachable).tags  # no verdict without the leakage check

    legacy = uat.table_uri("legacy_curated")  # the old table, reachable here: read as before
    lake.overwrite(legacy, pa.Table.from_pylist(list(curated_rows()), schema=CURATED_SCHEMA),
                   metadata={"run_id": "test-curate", "logical_date": "2026-11-21", "step": "curate"})
    reachable = _without_seen_images(uat, gone["version"], {"cd4ml.curated_table": legacy,
                                                            "cd4ml.curated_version": "0"})
    gate = evaluate(uat, reachable, uat.curated_table, curated)
    assert _removed(gate) == PLANTED


def test_a_changed_seen_images_file_is_refused_like_any_file(gone) -> None:
    from mlflow import MlflowClient

    from tasks.models.integrity import ModelIntegrityError
    from tasks.models.seen_images import FILE_NAME, write
    from tasks.release.evaluate import evaluate

    uat, number = gone["uat"], gone["version"]
    client = MlflowClient(uat.tracking_uri, uat.tracking_uri)
    run_id, _, path = client.get_model_version_download_uri(uat.registry.model_name, str(number)).removeprefix(
        "runs:/").partition("/")
    store = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / path  # uat's artifact store
    write(store / "artifacts" / FILE_NAME, [])  # "saw nothing": every test image would stay
    curated = _planted_table(uat.curated_table)
    with pytest.raises(ModelIntegrityError) as refused:
        evaluate(uat, number, uat.curated_table, curated)
    assert refused.value.problems == [("changed", f"artifacts/{FILE_NAME}")]
