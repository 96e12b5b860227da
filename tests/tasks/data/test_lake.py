import pyarrow as pa
import pytest

from tasks.data import lake


def _rows(keys):
    return pa.table({"k": keys, "blob": pa.array([k.encode() for k in keys], pa.binary())})


def test_append_adds_only_new_keys_as_a_merge_would(tmp_path):
    uri = str(tmp_path / "t")
    two = pa.table({"a": ["x", "x", "y"], "b": ["1", "2", "1"], "v": [1.0, 2.0, 3.0]})
    assert lake.append_new_rows(uri, two, ["a", "b"], {"run_id": "r1"}) == (0, 3)  # created
    more = pa.table({"a": ["x", "y", "y"], "b": ["2", "1", "2"], "v": [9.0, 9.0, 4.0]})
    assert lake.append_new_rows(uri, more, ["a", "b"], {"run_id": "r2"}) == (1, 1)  # only (y, 2) is new
    assert lake.append_new_rows(uri, more, ["a", "b"], {"run_id": "r3"}) == (None, 0)  # a re-run commits nothing
    got = lake.read(uri, 1)
    assert sorted(zip(*(got.column(c).to_pylist() for c in ("a", "b", "v")))) == [
        ("x", "1", 1.0), ("x", "2", 2.0), ("y", "1", 3.0), ("y", "2", 4.0)]
    assert lake.history(uri)[0].metadata["run_id"] == "r2"


def test_overwrite_stream_replaces_the_contents_in_one_commit(tmp_path):
    uri = str(tmp_path / "t")
    first, second = _rows(["a", "b"]), _rows(["c", "d", "e"])
    assert lake.overwrite_stream(uri, first.schema, first.to_batches, {"run_id": "r1"}) == 0  # created
    assert lake.overwrite_stream(uri, second.schema, second.to_batches, {"run_id": "r2"}) == 1
    assert lake.read(uri, 1, ["k"]).column("k").to_pylist() == ["c", "d", "e"]
    assert sorted(lake.read(uri, 0, ["k"]).column("k").to_pylist()) == ["a", "b"]  # the old version stays
    assert lake.history(uri)[0].metadata["run_id"] == "r2"
    assert lake.overwrite_stream(uri, first.schema, lambda: iter(()), {"run_id": "r3"}) == 2  # nothing: empty
    assert lake.read(uri, 2).num_rows == 0


def test_overwrite_stream_makes_its_rows_again_after_a_lost_race(tmp_path, monkeypatch):
    """The rows are a stream made on each attempt: a retry writes them all, not what the first attempt left."""
    uri = str(tmp_path / "t")
    rows = _rows(["a", "b", "c"])
    lake.overwrite(uri, _rows(["x"]), {"run_id": "r0"})
    calls = []
    real = lake.append_stream

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # someone commits between our read of the table and our commit
            lake.overwrite(uri, _rows(["y"]), {"run_id": "other"})
        return real(*args, **kwargs)

    monkeypatch.setattr(lake, "append_stream", racing)
    made = []
    version = lake.overwrite_stream(uri, rows.schema, lambda: made.append(1) or rows.to_batches(max_chunksize=1),
                                    {"run_id": "r1"})
    assert (version, len(calls), len(made)) == (2, 2, 2)
    assert sorted(lake.read(uri, 2, ["k"]).column("k").to_pylist()) == ["a", "b", "c"]


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
    lake.merge_new_rows(uri, _rows(["c"]), "k", {"run_id": "r3"})
    assert [lake.commit_at(uri, v).metadata["run_id"] for v in (0, 1, 2)] == ["r1", "r2", "r3"]
    assert lake.commit_at(uri, 3) is None and lake.commit_at(str(tmp_path / "missing"), 0) is None


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


# --------------------------------------------------------------------------- dataset versions


def _three_versions(tmp_path):
    import time

    uri = str(tmp_path / "lake" / "t")
    stamps = []
    for keys, day in ((["a"], "2026-11-01"), (["b"], "2026-11-02"), (["c"], "2026-11-03")):
        lake.merge_new_rows(uri, _rows(keys), "k", {"logical_date": lake.normalise_logical_date(day)})
        stamps.append(lake.history(uri)[0].timestamp_ms)
        time.sleep(0.02)
    return uri, stamps


def test_time_travel_by_number_name_and_timestamp(tmp_path):
    from datetime import UTC, datetime, timedelta

    uri, stamps = _three_versions(tmp_path)
    assert lake.resolve_version(uri, 1) == 1 and lake.resolve_version(uri, " 2 ") == 2
    lake.tag_version(uri, 1, "release-3", run_id="r", note="first release")
    lake.tag_version(uri, 2, "2026-11-21")
    assert lake.resolve_version(uri, "release-3") == 1
    assert lake.resolve_version(uri, "2026-11-21") == 2  # a name wins over the date it looks like
    middle = datetime.fromtimestamp((stamps[1] + 5) / 1000, tz=UTC)
    assert lake.resolve_version(uri, middle) == 1
    assert lake.resolve_version(uri, middle.isoformat().replace("+00:00", "Z")) == 1
    assert lake.resolve_version(uri, middle.replace(tzinfo=None)) == 1  # naive = UTC
    assert lake.resolve_version(uri, datetime.now(UTC) + timedelta(days=1)) == 2
    assert sorted(r["k"] for r in lake.read(uri, lake.resolve_version(uri, "release-3")).to_pylist()) == ["a", "b"]
    with pytest.raises(lake.VersionNotFoundError, match="did not exist at"):
        lake.resolve_version(uri, "2020-01-01T00:00:00Z")
    with pytest.raises(lake.VersionNotFoundError, match="has no version 9"):
        lake.resolve_version(uri, 9)
    with pytest.raises(lake.VersionNotFoundError, match=r"names on this table: \['release-3', '2026-11-21'\]"):
        lake.resolve_version(uri, "2026-12-24")  # a bare date that is not a name: no guess at midnight
    assert [(v.version, v.names) for v in lake.versions(uri)] == [(2, ("2026-11-21",)), (1, ("release-3",)), (0, ())]


def test_names_are_immutable_and_checked(tmp_path):
    uri, _ = _three_versions(tmp_path)
    first = lake.tag_version(uri, 0, "gold")
    assert lake.tag_version(uri, 0, "gold") == first  # same version again: a no-op
    with pytest.raises(lake.TagConflictError, match="already names t version 0"):
        lake.tag_version(uri, 2, "gold")
    for bad in ("12", "", "has space", "../x"):
        with pytest.raises(ValueError):
            lake.tag_version(uri, 1, bad)
    with pytest.raises(lake.VersionNotFoundError):
        lake.tag_version(uri, 7, "future")
    other = str(tmp_path / "lake" / "other")
    lake.merge_new_rows(other, _rows(["z"]), "k", {})
    lake.tag_version(other, 0, "gold")  # names are per table
    assert [t.name for t in lake.tags(uri)] == ["gold"] and lake.tags_uri(uri) == lake.tags_uri(other)


def test_training_resolves_a_dataset_version_on_the_curated_table_or_through_a_raw_name(tmp_path):
    raw, _ = _three_versions(tmp_path)
    curated = str(tmp_path / "lake" / "curated")
    lake.overwrite(curated, _rows(["a"]), {"raw_version": "0"})
    lake.overwrite(curated, _rows(["a", "b"]), {"raw_version": "1"})
    lake.tag_version(raw, 1, "nov-batch")
    lake.tag_version(curated, 0, "baseline")
    assert lake.resolve_dataset_version(curated, "baseline", raw) == 0
    assert lake.resolve_dataset_version(curated, 1, raw) == 1
    assert lake.resolve_dataset_version(curated, "nov-batch", raw) == 1
    lake.tag_version(raw, 2, "not-curated")
    with pytest.raises(lake.VersionNotFoundError, match="no version of .* was curated from it yet"):
        lake.resolve_dataset_version(curated, "not-curated", raw)


def test_append_stream_is_one_commit_against_its_snapshot_or_nothing(tmp_path):
    uri = str(tmp_path / "s")
    schema = _rows(["a"]).schema

    def reader(keys):
        return pa.RecordBatchReader.from_batches(schema, iter(_rows(keys).to_batches(max_chunksize=1)))

    cfg = lake.stats_columns_config(schema)
    assert lake.append_stream(uri, reader(["a", "b", "c"]), {"run_id": "1"}, None, cfg, target_file_size=1) == (0, 3)
    assert len(lake.open_table(uri).file_uris()) == 3  # files rolled at the target size, one commit
    assert lake.open_table(uri).metadata().configuration == cfg
    with pytest.raises(lake.ConcurrentCreateError):
        lake.append_stream(uri, reader(["x"]), {"run_id": "2"}, None)  # planned against no table: refused
    snapshot = lake.open_table(uri)  # what a slower writer planned against
    assert lake.append_stream(uri, reader(["d"]), {"run_id": "3"}, lake.open_table(uri)) == (1, 1)
    from deltalake.exceptions import CommitFailedError

    files = {p.name for p in (tmp_path / "s").glob("*.parquet")}
    with pytest.raises(CommitFailedError):  # its snapshot is stale now: the plan must be redone
        lake.append_stream(uri, reader(["d", "e"]), {"run_id": "4"}, snapshot)
    assert {p.name for p in (tmp_path / "s").glob("*.parquet")} == files  # the refused attempt cleaned up
    assert lake.append_stream(uri, reader([]), {}, lake.open_table(uri)) == (None, 0)
    assert lake.history(uri)[0].metadata["run_id"] == "3"
    assert sorted(lake.read(uri, 1, ["k"]).column("k").to_pylist()) == ["a", "b", "c", "d"]
    assert lake.open_table(uri).count() == 4  # numRecords stats are right


def test_append_stream_writes_stats_that_filters_can_trust(tmp_path):
    """delta-rs prunes a file from a filter on a column whose min/max the stats lack: they must be there."""
    from datetime import UTC, datetime

    uri = str(tmp_path / "f")
    at = [datetime(2026, 11, 21, 8, 30, 0, 123456, tzinfo=UTC), datetime(2026, 11, 21, 9, 0, 0, 999999, tzinfo=UTC)]
    rows = pa.table({"k": ["été 1", "b"], "n": [1, 2], "at": pa.array(at, pa.timestamp("us", tz="UTC")),
                     "blob": pa.array([b"x", b"y"], pa.binary())})
    lake.append_stream(uri, pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches()), {}, None)
    table = lake.open_table(uri)
    assert table.to_pyarrow_table(filters=[("k", "=", "été 1")]).column("n").to_pylist() == [1]
    assert table.to_pyarrow_table(filters=[("k", "in", ["b", "zzz"])]).column("n").to_pylist() == [2]
    for when, n in zip(at, (1, 2)):  # exact microseconds, at either end of the millisecond-rounded bounds
        exact = pa.scalar(when, pa.timestamp("us", tz="UTC"))
        assert table.to_pyarrow_table(filters=[("at", "=", exact)]).column("n").to_pylist() == [n]


def test_upsert_batches_commits_in_chunks_and_replaces_changed_rows(tmp_path):
    uri = str(tmp_path / "m")
    rows = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})
    assert lake.upsert_batches(uri, lambda: rows.to_batches(max_chunksize=1), rows.schema, "k", {"step": "m"}) == [0]
    changed = pa.table({"k": ["b", "d", "a"], "v": [20, 4, 10]})
    # the new key is appended (one commit), the two known ones MERGEd one chunk at a time
    assert lake.upsert_batches(uri, changed.to_batches, rows.schema, "k", {"step": "m"}, chunk_rows=1) == [1, 2, 3]
    got = dict(zip(*lake.read(uri, 3).sort_by("k").to_pydict().values()))
    assert got == {"a": 10, "b": 20, "c": 3, "d": 4}


def test_spark_user_metadata_is_read_like_delta_rs_metadata(tmp_path):
    from deltalake import CommitProperties, write_deltalake

    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows(["a"]), commit_properties=CommitProperties(
        custom_metadata={"userMetadata": '{"cd4ml.run_id": "spark-1", "cd4ml.logical_date": "2026-11-21T00:00:00+00:00"}'}))
    assert lake.history(uri)[0].metadata == {"run_id": "spark-1", "logical_date": "2026-11-21T00:00:00+00:00"}
    assert lake.version_as_of(uri, "2026-11-22") == 0


def test_cli_tag_and_versions(tmp_path, capsys, cd4ml_home):
    from tasks.cli import main

    uri, _ = _three_versions(tmp_path)
    assert main(["tag", uri, "1", "release-1"]) == 0
    assert '"version": 1' in capsys.readouterr().out
    assert main(["tag", uri, "2", "release-1"]) == 1
    assert "already names" in capsys.readouterr().err
    assert main(["versions", uri]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("v1") and "release-1" in out[1] and "logical_date=2026-11-02" in out[1]


def test_a_process_that_read_a_table_exits_cleanly(tmp_path) -> None:
    """delta-rs' Python filesystem made about half of such exits die in arrow's teardown (SIGABRT)."""
    import subprocess
    import sys

    import pyarrow as pa

    from tasks.data import lake

    uri = str(tmp_path / "t")
    lake.overwrite(uri, pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), metadata={"step": "test"})
    code = "import sys; from tasks.data import lake; print(lake.read(sys.argv[1], 0).num_rows)"
    for _ in range(6):
        proc = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, timeout=120)
        assert (proc.returncode, proc.stdout.strip()) == (0, "3"), proc.stderr[-2000:]


def test_scan_batches_streams_one_version_with_its_filter_and_columns_added_later(tmp_path):
    from deltalake import write_deltalake

    uri = str(tmp_path / "t")
    first = pa.table({"key": [f"k{i}" for i in range(10)], "split": ["train", "test"] * 5})
    v0 = lake.overwrite(uri, first, metadata={"step": "test"})
    write_deltalake(uri, pa.table({"key": ["n1", "n2"], "split": ["train", "train"], "extra": [1, 2]}),
                    mode="append", schema_mode="merge")
    rows = [r for b in lake.scan_batches(uri, v0 + 1, ["extra", "key"], {"split": ["train"]}, batch_rows=3)
            for r in b.to_pylist()]
    assert sorted((r["key"], r["extra"]) for r in rows) == sorted([(f"k{i}", None) for i in range(0, 10, 2)]
                                                                  + [("n1", 1), ("n2", 2)])
    old = [r["key"] for b in lake.scan_batches(uri, v0, ["key"]) for r in b.to_pylist()]
    assert sorted(old) == sorted(first["key"].to_pylist())  # time travel: the later file is not read


def test_scan_blocks_regroups_every_row_once_across_files_written_by_merge_and_append(tmp_path):
    """Blocks of at least the asked rows (the last may hold fewer), one schema each although a MERGE's files
    hold string_view and an append's string, and together exactly the version's rows."""
    uri = str(tmp_path / "t")
    lake.merge_new_rows(uri, _rows(["a", "b", "c"]), "k", {"run_id": "r1"})  # creates the table
    lake.merge_new_rows(uri, _rows(["d", "e"]), "k", {"run_id": "r2"})  # a MERGE: its file holds string_view
    for i, keys in enumerate([["f"], ["g", "h", "i", "j"]]):
        lake.append_new_rows(uri, _rows(keys), "k", {"run_id": f"r{i + 3}"})
    version = lake.current_version(uri)
    assert {b.schema.field("k").type for b in lake.scan_batches(uri, version, ["k"])} == {pa.string(), pa.string_view()}
    blocks = list(lake.scan_blocks(uri, version, ["k"], 4))
    assert all(b.num_rows >= 4 for b in blocks[:-1]) and blocks[-1].num_rows >= 1
    assert all(b.schema.field("k").type == pa.string() for b in blocks)
    assert sorted(k for b in blocks for k in b.column("k").to_pylist()) == list("abcdefghij")
    assert [b.num_rows for b in lake.scan_blocks(uri, version, ["k"], 100)] == [10]


def _keyed_table(tmp_path) -> tuple[str, int]:
    """Keys k00..k39: a MERGE's file (string_view), then two files of row groups of 4 rows, the last with a column
    added later (null in the others)."""
    from deltalake import WriterProperties, write_deltalake

    uri = str(tmp_path / "t")
    lake.merge_new_rows(uri, _rows([f"k{i:02d}" for i in range(8)]), "k", {"run_id": "r1"})
    more = _rows([f"k{i:02d}" for i in range(8, 24)])
    lake.append_stream(uri, pa.RecordBatchReader.from_batches(more.schema, more.to_batches()), {"run_id": "r2"},
                       lake.open_table(uri), row_group_rows=4)
    later = _rows([f"k{i:02d}" for i in range(24, 40)]).append_column("extra", pa.array(range(16), pa.int64()))
    write_deltalake(uri, later, mode="append", schema_mode="merge",
                    writer_properties=WriterProperties(max_row_group_size=4))
    return uri, lake.current_version(uri)


@pytest.mark.parametrize("joined", [1, 256], ids=["kept-as-read", "kept-joined"])
@pytest.mark.parametrize("local", [True, False])
def test_scan_keyed_gives_the_wanted_rows_in_order_reading_only_the_row_groups_holding_one(tmp_path, monkeypatch, local,
                                                                                          joined):
    import pyarrow.parquet as pq

    monkeypatch.setattr(lake, "KEPT_BATCHES", joined)  # the kept rows of this many reads joined into one batch
    uri, version = _keyed_table(tmp_path)
    if not local:  # what a remote table takes: the dataset, every row read, the marked ones kept
        monkeypatch.setattr(lake, "_plain_local_files", lambda table: None)
    read_groups = []
    real = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *a, **kw: (read_groups.append(kw.get("row_groups")), real(self, *a, **kw))[1])
    order = [k for b in lake.scan_batches(uri, version, ["k"]) for k in b.column("k").to_pylist()]
    wanted = ["k03", "k09", "k10", "k33", "k99"]  # k99 is not in the table
    read_groups.clear()
    blocks = list(lake.scan_keyed(uri, version, "k", pa.array(wanted), ["k", "blob", "extra"], 2, 1 << 20))
    got = [r for b in blocks for r in b.to_pylist()]
    assert [r["k"] for r in got] == [k for k in order if k in wanted]  # the table's order, each row once
    assert all(r["blob"] == r["k"].encode() for r in got)
    assert [r["extra"] for r in got if r["k"] == "k33"] == [9] and {r["extra"] for r in got if r["k"] < "k24"} == {None}
    assert [b.num_rows for b in blocks] == ([2, 2] if joined == 1 else [4])  # a block is past block_rows by a batch
    assert {b.schema.field("k").type for b in blocks} == {pa.string()}
    if local:  # the keys read whole, then only the groups holding a wanted key: k03, k09+k10, k33
        assert sorted(g for g in read_groups if g is not None) == [[0], [0], [2]]
    placed = lake.scan_keyed(uri, version, "k", pa.array(wanted), ["k"], 100, 1 << 20, position="at")
    assert [(r["k"], wanted[r["at"]]) for b in placed for r in b.to_pylist()] == [(r["k"], r["k"]) for r in got]
    by_bytes = list(lake.scan_keyed(uri, version, "k", pa.array(wanted), ["k", "blob"], 100, 1))
    assert [b.num_rows for b in by_bytes] == ([1, 2, 1] if joined == 1 else [4])  # ends once it holds block_bytes
    assert sum(len(b.column(0).chunks) for b in by_bytes) == (3 if joined == 1 else 1)  # joined: one piece
    assert list(lake.scan_keyed(uri, version, "k", pa.array([], pa.string()), ["k"], 2, 1 << 20)) == []
    assert list(lake.scan_keyed(uri, version, "k", pa.array(["k99"]), ["k"], 2, 1 << 20)) == []


def test_a_keyed_scan_holds_only_the_rows_it_found_read_in_blocks_sized_by_its_value_set(tmp_path, monkeypatch):
    uri, version = _keyed_table(tmp_path)
    sizes = []
    real = lake.scan_blocks
    monkeypatch.setattr(lake, "scan_blocks", lambda *a, **kw: (sizes.append(a[3]), real(*a, **kw))[1])
    marks = lake._marks(uri, version, "k", pa.array(["k03", "k33", "k99"]))
    assert marks.total == 40 and len(marks.rows) == len(marks.codes) == 2  # an entry a row found, not a row read
    assert sizes == [lake.SEARCH_BLOCK_ROWS]  # a few keys: the smaller block
    order = [k for b in lake.scan_batches(uri, version, ["k"]) for k in b.column("k").to_pylist()]
    assert [order[r] for r in marks.rows.tolist()] == sorted(["k03", "k33"], key=order.index)
    part = marks.within(int(marks.rows[0]), 40)
    assert part.total == 40 - int(marks.rows[0]) and part.rows[0] == 0 and len(part.rows) == 2
    many = pa.array([f"x{i}" for i in range(lake.SEARCH_BLOCK_ROWS + 1)])
    assert not len(lake._marks(uri, version, "k", many).rows) and sizes[-1] == lake.LOOKUP_BLOCK_ROWS


def test_rows_for_keys_aligns_a_row_to_each_key_asked_with_nulls_where_none(tmp_path):
    uri, version = _keyed_table(tmp_path)
    wanted = pa.chunked_array([["k33", None, "k99"], ["k03", "k33"]])  # a null, a missing key, a repeat
    got = lake.rows_for_keys(uri, version, "k", wanted, ["k", "blob", "extra"])
    assert got.column("k").to_pylist() == ["k33", None, None, "k03", "k33"]
    assert got.column("blob").to_pylist() == [b"k33", None, None, b"k03", b"k33"]
    assert got.column("extra").to_pylist() == [9, None, None, None, 9]  # written before the column: null
    none = lake.rows_for_keys(uri, version, "k", pa.array(["k99", None]), ["k", "extra"])
    assert none.to_pydict() == {"k": [None, None], "extra": [None, None]}
    assert none.schema.field("k").type == pa.string() and none.schema.field("extra").type == pa.int64()


def test_rows_for_keys_takes_the_first_of_two_rows_with_one_key(tmp_path):
    from deltalake import write_deltalake
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"k": ["a", "b"], "v": [1, 2]}))
    write_deltalake(uri, pa.table({"k": ["a"], "v": [3]}), mode="append")
    order = [r["v"] for b in lake.scan_batches(uri, 1, ["v"]) for r in b.to_pylist() if r["v"] != 2]
    assert lake.rows_for_keys(uri, 1, "k", pa.array(["a"]), ["v"]).column("v").to_pylist() == order[:1]


def test_upsert_batches_never_reads_the_key_column_whole(tmp_path, monkeypatch):
    uri = str(tmp_path / "m")
    rows = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})
    lake.upsert_batches(uri, rows.to_batches, rows.schema, "k", {"step": "m"})
    monkeypatch.setattr(lake, "scan", lambda *a, **kw: pytest.fail("the table was read whole"))
    changed = pa.table({"k": ["c", "d"], "v": [30, 4]})
    assert lake.upsert_batches(uri, changed.to_batches, rows.schema, "k", {"step": "m"}) == [1, 2]
    monkeypatch.undo()
    got = dict(zip(*lake.read(uri, 2).sort_by("k").to_pydict().values()))
    assert got == {"a": 1, "b": 2, "c": 30, "d": 4}


def test_scan_blocks_ends_a_block_at_its_bytes(tmp_path):
    uri, version = _keyed_table(tmp_path)
    by_bytes = lake.scan_blocks(uri, version, ["k", "blob"], 1000, block_bytes=1)
    assert sorted(b.num_rows for b in by_bytes) == [8, 16, 16]  # a block a read (here a file: fewer than READ_ROWS)
    assert [b.num_rows for b in lake.scan_blocks(uri, version, ["k", "blob"], 1000)] == [40]


def test_row_groups_of_big_rows_hold_about_row_group_bytes(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(lake, "ROW_GROUP_BYTES", 50_000)
    keys = [f"k{i:03d}" for i in range(60)]
    big = pa.table({"k": keys, "blob": pa.array([k.encode() * 2500 for k in keys], pa.binary())})  # 10 KB a row
    small = _rows(keys)
    for name, rows, expected in (("big", big, 4), ("small", small, 60)):  # a group of 60 small rows: 300 bytes
        uri = str(tmp_path / name)
        lake.append_stream(uri, pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches()), {"run_id": "r"},
                           None, row_group_rows=2048)
        (path,) = lake._plain_local_files(lake.open_table(uri))
        meta = pq.ParquetFile(path).metadata
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        assert max(sizes) == expected and sum(sizes) == 60, sizes
        assert lake.read(uri, 0).sort_by("k").equals(rows.sort_by("k"))


def test_interned_strings_are_one_object_a_value_across_columns_and_tables():
    label = "".join(["ca", "t"])  # built at run time: not a constant the compiler already interned
    first = lake.interned(pa.chunked_array([[label, None], [label, "dog"]]))
    second = lake.interned(pa.array(["dog", label]))
    assert first == [label, None, label, "dog"] and second == ["dog", label]
    assert first[0] is first[2] is second[1] and first[3] is second[0]
    assert pa.array([label]).to_pylist()[0] is not first[0]  # what a plain read gives: a copy a row


def test_kept_batches_are_joined_by_count_or_by_bytes_in_order():
    batches = [pa.record_batch({"k": [f"k{i}a", f"k{i}b"], "blob": [b"x" * 100, b"y" * 100]}) for i in range(5)]
    by_count = list(lake._coalesced(iter(batches), 2, 1 << 20))
    assert [b.num_rows for b in by_count] == [4, 4, 2]
    assert [k for b in by_count for k in b.column("k").to_pylist()] == [k for b in batches for k in b.column("k").to_pylist()]
    assert all(len(b.column(1).buffers()) == 3 for b in by_count)  # one binary array each: validity, offsets, data
    by_bytes = list(lake._coalesced(iter(batches), 256, batches[0].nbytes))  # one batch reaches the size: as read
    assert [b.num_rows for b in by_bytes] == [2, 2, 2, 2, 2]
