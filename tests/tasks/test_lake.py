import pyarrow as pa
import pytest

from tasks import lake


def _rows(keys):
    return pa.table({"k": keys, "blob": pa.array([k.encode() for k in keys], pa.binary())})


def test_merge_inserts_only_new_keys_and_skips_empty_commits(tmp_path):
    uri = str(tmp_path / "t")
    cfg = lake.stats_columns_config(_rows(["a"]).schema)
    assert cfg == {"delta.dataSkippingStatsColumns": "k"}
    assert lake.merge_new_rows(uri, _rows(["a", "b"]), "k", {"run_id": "r1", "logical_date": "2026-11-01"}, cfg) == (0, 2)
    assert lake.merge_new_rows(uri, _rows(["b", "c"]), "k", {"run_id": "r2", "logical_date": "2026-11-02"}) == (1, 1)
    assert lake.merge_new_rows(uri, _rows(["a", "c"]), "k", {"run_id": "r3"}) == (None, 0)
    assert lake.current_version(uri) == 1
    assert sorted(lake.read(uri, 1, ["k"]).column("k").to_pylist()) == ["a", "b", "c"]
    assert lake.open_table(uri).metadata().configuration == cfg


def test_time_travel_and_history_metadata(tmp_path):
    uri = str(tmp_path / "t")
    lake.merge_new_rows(uri, _rows(["a"]), "k", {"run_id": "r1", "logical_date": "2026-11-01"})
    lake.merge_new_rows(uri, _rows(["b"]), "k", {"run_id": "r2", "logical_date": "2026-11-03"})
    assert lake.read(uri, 0).num_rows == 1 and lake.read(uri, 1).num_rows == 2
    assert [c.metadata["run_id"] for c in lake.history(uri)] == ["r2", "r1"]
    assert lake.find_commit(uri, run_id="r1").version == 0
    assert lake.find_commit(uri, run_id="nope") is None


def test_version_as_of_logical_date(tmp_path):
    uri = str(tmp_path / "t")
    lake.merge_new_rows(uri, _rows(["a"]), "k", {"logical_date": lake.normalise_logical_date("2026-11-01")})
    lake.merge_new_rows(uri, _rows(["b"]), "k", {"logical_date": lake.normalise_logical_date("2026-11-03")})
    assert lake.version_as_of(uri, "2026-11-01T00:00:00+00:00") == 0
    assert lake.version_as_of(uri, "2026-11-02T12:00:00") == 0
    assert lake.version_as_of(uri, "2026-11-05") == 1
    with pytest.raises(lake.VersionNotFoundError, match="at or before"):
        lake.version_as_of(uri, "2026-10-01")
    with pytest.raises(lake.VersionNotFoundError, match="run the producing DAG first"):
        lake.version_as_of(str(tmp_path / "missing"), "2026-11-01")


def test_missing_version_is_a_clear_error(tmp_path):
    uri = str(tmp_path / "t")
    lake.overwrite(uri, _rows(["a"]), {"step": "x"})
    with pytest.raises(lake.VersionNotFoundError):
        lake.read(uri, 7)
    with pytest.raises(lake.VersionNotFoundError, match="no Delta table"):
        lake.open_table(str(tmp_path / "nothing"))


def test_overwrite_makes_full_snapshots(tmp_path):
    uri = str(tmp_path / "t")
    assert lake.overwrite(uri, _rows(["a", "b"]), {"step": "s1"}) == 0
    assert lake.overwrite(uri, _rows(["c"]), {"step": "s2"}) == 1
    assert lake.read(uri, 0).num_rows == 2 and lake.read(uri, 1).column("k").to_pylist() == ["c"]


def test_normalise_logical_date():
    assert lake.normalise_logical_date("2026-11-21") == "2026-11-21T00:00:00+00:00"
    assert lake.normalise_logical_date("2026-11-21T01:30:00.123+01:00") == "2026-11-21T00:30:00+00:00"
