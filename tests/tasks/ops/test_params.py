"""Params are checked before any work: versions that do not exist, names taken, bad training overrides."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.data import lake
from tasks.ops.params import ParamsError, check_params
from tasks.settings import load_settings


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("CD4ML_HOME", str(tmp_path))
    monkeypatch.setenv("CD4ML_ENV", "sit")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return load_settings()


def _versions(uri: str, n: int) -> None:
    for i in range(n):
        lake.overwrite(uri, pa.table({"k": [f"row{i}"]}), {"run_id": f"r{i}", "raw_version": "0"})


def _problems(dag_id: str, settings, **params) -> list[str]:
    with pytest.raises(ParamsError) as info:
        check_params(dag_id, settings, params)
    assert f"{len(info.value.problems)} bad Param(s), nothing was run" in str(info.value)
    return info.value.problems


def test_train_names_every_bad_param_at_once(settings):
    _versions(settings.curated_table, 3)
    problems = _problems("cd4ml_train", settings, curated_version=99,
                         training_overrides={"epochs": "many", "learning_rat": 0.1})
    assert problems[0] == "curated_version=99: curated_images has versions 0..2"
    assert problems[1].startswith("training_overrides: invalid training overrides")
    assert "epochs" in problems[1] and "learning_rat" in problems[1]


def test_train_accepts_what_exists_and_valid_overrides(settings):
    _versions(settings.curated_table, 2)
    check_params("cd4ml_train", settings, {"curated_version": 1, "dataset_version": None, "model": "resnet18",
                                           "training_overrides": {"epochs": 3}})
    check_params("cd4ml_train", settings, {"curated_version": None, "dataset_version": "0"})
    check_params("cd4ml_train", settings, {})  # the asset-triggered default


def test_train_rejects_both_versions_an_unknown_name_and_a_missing_table(settings):
    problems = _problems("cd4ml_train", settings, curated_version=0, dataset_version="release-9")
    assert "give one of them, not both" in problems[0]
    assert _problems("cd4ml_train", settings, curated_version=0) == [
        f"curated_version=0: curated_images has no version yet (nothing was written to {settings.curated_table})"
    ]
    _versions(settings.curated_table, 1)
    problems = _problems("cd4ml_train", settings, dataset_version="release-9")
    assert problems[0].startswith("dataset_version='release-9'") and "names on this table: none" in problems[0]
    problems = _problems("cd4ml_train", settings, model="resnet18", training_overrides={"batch_size": -1})
    assert "batch_size" in problems[0]


def test_curate_and_ingest_params(settings):
    assert _problems("cd4ml_curate", settings, raw_version=4) == [
        f"raw_version=4: raw_images has no version yet (nothing was written to {settings.raw_table})"
    ]
    _versions(settings.raw_table, 1)
    check_params("cd4ml_curate", settings, {"raw_version": 0})
    lake.tag_version(settings.raw_table, 0, "digits-1")
    problems = _problems("cd4ml_ingest", settings, label_source="csv", dataset_version_name="digits-1")
    assert problems == [
        "label_source='csv' needs manifest_uri (a csv file of path,label)",
        "dataset_version_name='digits-1' already names raw_images v0; names are immutable, pick another",
    ]
    check_params("cd4ml_ingest", settings, {"label_source": "jsonl", "manifest_uri": "labels.jsonl",
                                            "dataset_version_name": "digits-2"})


def test_promote_and_rollback_name_model_versions_that_do_not_exist(settings):
    problems = _problems("cd4ml_rollback", settings, to_version=7)
    assert problems[0].startswith("to_version=7: digits-classifier-sit has no version 7")
    problems = _problems("cd4ml_promote", settings, version=2, test_version=5)
    assert problems[0].startswith("version=2: ") and problems[1].startswith("test_version=5: curated_images has no")


def test_feedback_and_source_params_outside_settings_are_refused_unfetched(settings):
    from tests.factories.hostile import watched_http_server

    with watched_http_server() as (base, requests):  # before: the check itself fetched the URL
        problems = _problems("cd4ml_monitor", settings, feedback_files=[f"{base}/labels.csv", "/etc/passwd"])
        assert len(problems) == 2 and all("feedback_files" in p for p in problems)
        assert len(_problems("cd4ml_score", settings, source=f"{base}/inbox")) == 1
    assert requests == []


def test_accept_class_labels_are_checked_by_the_label_rules(settings, monkeypatch):
    assert _problems("cd4ml_accept_class", settings, labels=["zebra"]) == [
        "ingest.allowed_labels is a list in this environment's settings: add the class there"]
    monkeypatch.setenv("CD4ML_DATASET", "photos")
    photos = load_settings()
    check_params("cd4ml_accept_class", photos, {"labels": ["zebra"]})
    problems = _problems("cd4ml_accept_class", photos, labels=["zebra", "x" * 500])
    assert problems == ["labels: label 2: a label holds at most 128 characters (this one 500)"]
