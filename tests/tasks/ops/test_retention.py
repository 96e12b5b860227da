import json

import pyarrow as pa
import pytest

from tasks.data import lake
from tasks.ops import retention


def _snapshot(uri: str, keys: list[str], step: str) -> int:
    return lake.overwrite(uri, pa.table({"k": keys}), {"step": step})


def _readable(uri: str, version: int) -> bool:
    try:
        retention.check_readable(uri, version)
        lake.read(uri, version)
        return True
    except Exception:
        return False


def test_vacuum_keeps_protected_versions_and_removes_the_rest(settings):
    uri = settings.raw_table
    for i in range(4):
        _snapshot(uri, [f"v{i}"], f"s{i}")  # each overwrite tombstones the previous version's file

    dry = retention.vacuum(settings, "raw_images", [1], retention_hours=0, dry_run=True)
    assert dry.deleted_files == 2 and _readable(uri, 0)  # a dry run deletes nothing

    result = retention.vacuum(settings, "raw_images", [1], retention_hours=0)
    assert result.protected_versions == [1] and result.deleted_files == 2
    assert _readable(uri, 1) and [r["k"] for r in lake.read(uri, 1).to_pylist()] == ["v1"]
    assert not _readable(uri, 0) and not _readable(uri, 2)
    assert _readable(uri, 3)
    config = lake.open_table(uri).metadata().configuration
    assert config["delta.enableExpiredLogCleanup"] == "false"  # the log of version 1 must outlive checkpoints


def test_default_window_keeps_recent_files(settings):
    uri = settings.raw_table
    for i in range(3):
        _snapshot(uri, [f"v{i}"], f"s{i}")
    result = retention.vacuum(settings, uri, [])  # sit keeps 24 hours of unreferenced files
    assert result.retention_hours == 24 and result.deleted_files == 0 and _readable(uri, 0)
    with pytest.raises(ValueError, match=">= 0"):
        retention.vacuum(settings, uri, [], retention_hours=-1)


def test_versions_models_were_trained_on_and_named_versions_are_protected(settings, tmp_path, capsys):
    from tasks.cli import main
    from tasks.models.registry import TAG_CURATED_TABLE, TAG_CURATED_VERSION, TAG_RAW_VERSION, mlflow_client

    raw, curated = settings.raw_table, settings.curated_table
    for i in range(4):
        _snapshot(raw, [f"r{i}"], f"raw{i}")
        _snapshot(curated, [f"c{i}"], f"cur{i}")
    client = mlflow_client(settings)
    client.create_registered_model(settings.registry.model_name)
    client.create_model_version(settings.registry.model_name, source=str(tmp_path / "model"), tags={
        TAG_CURATED_TABLE: curated, TAG_CURATED_VERSION: "1", TAG_RAW_VERSION: "0"})
    lake.tag_version(raw, 2, "release-2")
    assert retention.protected_versions(settings, raw) == {0, 2}
    assert retention.protected_versions(settings, "curated_images") == {1}

    for uri in (raw, curated):
        retention.vacuum(settings, uri, retention.protected_versions(settings, uri), retention_hours=0)
    assert [_readable(raw, v) for v in range(4)] == [True, False, True, True]
    assert [_readable(curated, v) for v in range(4)] == [False, True, False, True]

    assert main(["vacuum", "--dry-run"]) == 0  # the CLI walks every table with the same protection
    report = {r["table"].rsplit("/", 1)[-1]: r for r in json.loads(capsys.readouterr().out)}
    assert report["raw_images"]["protected_versions"] == [0, 2] and report["raw_images"]["dry_run"]
