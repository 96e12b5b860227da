"""A new image that would join recorded components of different splits: set aside, and named for what holds.

The name of a bridge claims a copy only where the class's test lets it: the same pixels in any
class, a near copy only in a class whose copies stand out. In an abstaining class the possible copy
is named in the detail of a ``split_bridge`` (the image is set aside either way: no split can take it).
"""

import random

import numpy as np

from tasks.curation.assignments import Assignment, Bridge, Record, RecordAfter, bridge_rows, record_table
from tasks.curation.tables import RawFacts, RawRows

RECORD = {"r_train": Assignment("k_train", "train", 1, "c1"), "r_test": Assignment("k_test", "test", 1, "c1")}
BY_SHA = RawRows.of(RawFacts(s, label, 32, 32) for s, label in
                    (("r_train", "7"), ("r_test", "7"), ("n_plain", "7"), ("n_near", "7"), ("n_same", "7"), ("n_other", "3")))
DETAIL = "would join recorded components k_test (test), k_train (train) in different splits"
BRIDGES = [
    Bridge("n_plain", "k_test", DETAIL, None),
    Bridge("n_near", "k_test", DETAIL, ("near_duplicate", "r_train", "copy score 0.9991")),
    Bridge("n_same", "k_test", DETAIL, ("exact_duplicate", "r_test", "same decoded pixels")),
]


def _by_sha(rows):
    return {r["sha256"]: r for r in rows}


def test_in_a_class_whose_copies_stand_out_a_bridge_that_is_a_copy_is_named_a_duplicate():
    rows = _by_sha(bridge_rows(BRIDGES, BY_SHA, RECORD, abstain={"3": "its own reason"}))
    assert (rows["n_plain"]["reason"], rows["n_plain"]["kept_sha256"]) == ("split_bridge", None)
    assert rows["n_plain"]["component"] == "k_test" and rows["n_plain"]["detail"] == DETAIL
    near = rows["n_near"]
    assert (near["reason"], near["kept_sha256"], near["component"]) == ("near_duplicate", "r_train", "k_train")
    assert near["detail"] == f"copy score 0.9991 to the recorded image (it also {DETAIL})"
    assert (rows["n_same"]["reason"], rows["n_same"]["component"]) == ("exact_duplicate", "k_test")


def test_in_an_abstaining_class_a_near_copy_bridge_is_a_split_bridge_that_names_the_possible_copy():
    rows = _by_sha(bridge_rows(BRIDGES, BY_SHA, RECORD, abstain={"7": "copies do not stand out"}))
    near = rows["n_near"]
    assert (near["reason"], near["kept_sha256"], near["component"]) == ("split_bridge", "r_train", "k_test")
    assert near["detail"].startswith(DETAIL) and "possibly a copy of the recorded image (copy score 0.9991)" in near[
        "detail"] and "class 7 do not stand out" in near["detail"]
    # The same pixels are a copy whatever the class's test: nothing of the image is lost.
    assert rows["n_same"]["reason"] == "exact_duplicate"
    assert rows["n_plain"]["reason"] == "split_bridge"



def test_the_record_after_a_curation_lays_its_rows_over_the_record_read_without_copying_it() -> None:
    record = {"a": Assignment("a", "train", 0, "r0"), "b": Assignment("b", "val", 0, "r0"),
              "c": Assignment("a", "train", 0, "r0")}
    changes = {"d": Assignment("a", "train", 1, "r1"),  # a new image
               "b": Assignment("a", "val", 0, "r0"),  # renamed by a merge
               "c": Assignment("a", "train", 0, "r0")}  # laid over, equal to the record's: not a change
    after = RecordAfter(record, changes)
    assert list(after) == ["a", "b", "c", "d"] and len(after) == 4
    assert after["a"] is record["a"] and after["b"] == changes["b"] and after["d"] == changes["d"]
    assert after.changed() == {"b", "d"}
    assert "x" not in after and after.get("x") is None
    assert record_table(after, 0).column("component").to_pylist() == ["a", "a", "a", "a"]
    assert record == {"a": Assignment("a", "train", 0, "r0"), "b": Assignment("b", "val", 0, "r0"),
                      "c": Assignment("a", "train", 0, "r0")}  # the record read is left as it was


def test_the_record_by_the_raw_rows_positions_reads_as_the_map_it_replaces():
    from tasks.curation.assignments import Record

    rows = RawRows.of(RawFacts(s, "7", 32, 32) for s in ("a", "b", "c", "d"))
    given = [("b", Assignment("k1", "train", 1, "c1")), ("z", Assignment("k9", "test", 1, "c0")),
             ("d", Assignment("k1", "val", 2, "c2")), ("b", Assignment("k2", "test", 3, "c2"))]  # b twice: the later
    record = Record(rows)
    for sha, a in given:
        record.add(sha, a)
    expected = dict(given)
    assert dict(record) == expected and dict(record.items()) == expected and len(record) == 3
    assert sorted(record) == sorted(expected) and "a" not in record and "z" in record and "q" not in record
    assert record.get("a") is None and record["d"] == Assignment("k1", "val", 2, "c2")
    after = RecordAfter(record, {"a": Assignment("k1", "val", 4, "c4")})
    assert dict(after) == {**expected, "a": Assignment("k1", "val", 4, "c4")} and after.changed() == {"a"}


def test_split_codes_by_position_are_each_images_split_as_looked_up():
    import numpy as np

    from tasks.curation.assignments import Record
    from tasks.curation.sha_list import SortedShas
    from tasks.curation.tables import SPLITS

    rows = RawRows.of(RawFacts(s, "7", 32, 32) for s in ("a", "b", "c", "d", "e"))
    record = Record(rows)
    for sha, split in (("b", "test"), ("c", "train"), ("d", "val"), ("e", "test")):
        record.add(sha, Assignment(sha, split, 1, "r"))
    after = RecordAfter(record, {"a": Assignment("a", "val", 2, "r2"), "c": Assignment("a", "test", 1, "r")})
    eligible = SortedShas.of(["a", "b", "c", "e"])  # d not eligible
    codes = after.split_codes(eligible, rows.positions_of(eligible))
    assert codes.dtype == np.int8 and [SPLITS[c] for c in codes.tolist()] == [after[s].split for s in eligible]
    assert RecordAfter(record, {}).split_codes(eligible, rows.positions_of(eligible)).tolist()[0] == -1  # a: none
    as_map = RecordAfter(dict(record), after.changes).split_codes(eligible, rows.positions_of(eligible))
    assert as_map.tolist() == codes.tolist()


def test_components_as_codes_are_the_raw_position_of_the_image_named_else_one_past_the_raw_rows():
    import numpy as np

    from tasks.curation.assignments import Record

    rows = RawRows.of(RawFacts(s, "7", 32, 32) for s in ("a", "b", "c", "d", "e"))
    record = Record(rows)
    for sha, key in (("b", "a"), ("c", "gone"), ("d", "gone"), ("e", "e"), ("a", "a")):
        record.add(sha, Assignment(key, "train", 0, "r"))
    record.add("z", Assignment("b", "val", 0, "r"))  # not a raw image: no position, no code
    codes = record.component_codes(np.arange(5))
    assert codes.tolist() == [0, 0, 5, 5, 4]
    fresh = Record(rows)
    fresh.add("c", Assignment("c", "val", 0, "r"))
    assert fresh.component_codes(np.array([3, 2])).tolist() == [-1, 2]  # d not recorded
    assert [record.name_of_code(c) for c in codes.tolist()] == [record[s].component for s in "abcde"]
    assert sorted(record.members_of({"gone", "b"})) == sorted(
        (s, a) for s, a in record.items() if a.component in {"gone", "b"})  # z (not a raw image) is in b
    assert record.members_of({"nothing"}) == []


def test_an_images_newest_row_counts_in_whatever_order_the_rows_are_read():
    from tasks.curation.assignments import Record

    rows = RawRows.of(RawFacts(s, "7", 32, 32) for s in ("a", "b"))
    record = Record(rows)
    record.add("a", Assignment("k2", "train", 1, "c2"), 2)
    record.add("a", Assignment("k1", "train", 1, "c1"), 1)  # older, read after
    record.add("z", Assignment("k2", "test", 1, "c2"), 2)
    record.add("z", Assignment("k1", "test", 1, "c1"), 1)
    assert record["a"].component == "k2" and record["z"].component == "k2" and len(record) == 2


def _stored(uri: str, rows: list[str]):
    """The record read from ``uri`` as a curation reads it (over the raw rows ``rows``)."""
    from types import SimpleNamespace

    from tasks.curation.assignments import read_assignments

    settings = SimpleNamespace(table_uri=lambda name: uri, curation=SimpleNamespace(split_salt="s"))
    return read_assignments(settings, RawRows.of(RawFacts(s, "7", 32, 32) for s in rows))


def test_a_batch_appends_its_rows_and_a_rename_is_a_newer_row(tmp_path):
    from tasks.curation.assignments import read_record, store_record
    from tasks.data import lake
    from tests.factories.curation import files_removed

    uri, meta = str(tmp_path / "curation_components"), {"split_salt": "s"}
    first = {s: Assignment(s, "train", 1, "c1") for s in "abcd"}
    store_record(uri, RecordAfter(_stored(uri, list("abcd"))[0], first), None, meta)
    record, _ = _stored(uri, list("abcdef"))
    assert record.stored_rows == 4 and dict(record) == first
    changes = {"e": Assignment("a", "train", 2, "c2"), "f": Assignment("a", "train", 2, "c2"),
               "c": Assignment("a", "train", 1, "c1"), "d": Assignment("a", "train", 1, "c1")}  # c, d renamed to a
    version = store_record(uri, RecordAfter(record, changes), set(changes), meta)
    assert files_removed(uri, version) == 0 and lake.read(uri, version).num_rows == 8  # appended: a, b untouched
    expected = {**first, **changes}
    assert {r["sha256"]: r["component"] for r in read_record(uri, version).to_pylist()} == \
        {s: a.component for s, a in expected.items()}
    again, _ = _stored(uri, list("abcdef"))
    assert dict(again) == expected and again.stored_rows == 8
    assert store_record(uri, RecordAfter(again, {}), set(), meta) is None  # nothing changed: nothing written


def test_the_record_is_written_whole_when_its_older_rows_pass_the_compact_factor(tmp_path):
    from tasks.curation.assignments import COMPACT_FACTOR, store_record
    from tasks.data import lake

    uri, meta = str(tmp_path / "curation_components"), {"split_salt": "s"}
    store_record(uri, RecordAfter(_stored(uri, ["a", "b"])[0], {s: Assignment(s, "train", 1, "c1") for s in "ab"}),
                 None, meta)
    for n in range(2, 2 + 2 * COMPACT_FACTOR):  # "b" renamed again and again: an older row each time
        record, _ = _stored(uri, ["a", "b"])
        version = store_record(uri, RecordAfter(record, {"b": Assignment(f"k{n}", "train", 1, "c1")}), {"b"}, meta)
        assert lake.read(uri, version).num_rows <= COMPACT_FACTOR * 2
    assert dict(_stored(uri, ["a", "b"])[0])["b"].component == f"k{1 + 2 * COMPACT_FACTOR}"


def test_a_record_written_before_the_written_column_is_read_and_then_written_whole_once(tmp_path):
    import pyarrow as pa

    from tasks.curation.assignments import store_record
    from tasks.curation.tables import COMPONENTS_SCHEMA
    from tasks.data import lake

    uri, meta = str(tmp_path / "curation_components"), {"split_salt": "s"}
    legacy = pa.schema([f for f in COMPONENTS_SCHEMA if f.name != "written"])
    lake.overwrite(uri, pa.Table.from_pylist([{"sha256": "a", "component": "a", "split": "val",
                                               "first_raw_version": 1, "run_id": "c1"}], schema=legacy), meta)
    record, _ = _stored(uri, ["a", "b"])
    assert dict(record) == {"a": Assignment("a", "val", 1, "c1")} and record.stored_rows is None
    version = store_record(uri, RecordAfter(record, {"b": Assignment("b", "test", 2, "c2")}), {"b"}, meta)
    table = lake.read(uri, version)
    assert table.schema.names == COMPONENTS_SCHEMA.names and table.column("sha256").to_pylist() == ["a", "b"]
    assert _stored(uri, ["a", "b"])[0].stored_rows == 2  # from now on a batch appends


def test_many_rows_added_at_once_leave_the_record_row_by_row_would():
    rng = random.Random(11)
    shas = sorted(f"{i:04x}" for i in range(60))
    rows = RawRows.of(RawFacts(s, "1", 8, 8) for s in shas)
    at_once, one_by_one = Record(rows), Record(rows)
    for record in (at_once, one_by_one):
        assert [record.outside_code(k) for k in ("k0", "k1", "k2")] == [-1, -2, -3]  # keys that are no raw rows
    for _ in range(3):  # slices read one after the other: an image's rows spread over them, written at several versions
        n = 80
        at = np.array([rng.randrange(60) for _ in range(n)], dtype=np.int64)
        component = np.array([rng.choice([rng.randrange(60), -1 - rng.randrange(3)]) for _ in range(n)], dtype=np.int64)
        split = [rng.choice(["train", "val", "test"]) for _ in range(n)]
        run = [rng.choice(["c1", "c2"]) for _ in range(n)]
        first = np.array([rng.randrange(4) for _ in range(n)], dtype=np.int64)
        written = np.array([rng.randrange(4) for _ in range(n)], dtype=np.int64)
        at_once.add_many(at, component, split, first, run, written)
        for r in range(n):
            one_by_one.add_at(int(at[r]), int(component[r]), split[r], int(first[r]), run[r], int(written[r]))
    assert at_once.known == one_by_one.known and len(at_once) == len(one_by_one)
    assert dict(at_once.items()) == dict(one_by_one.items())
    assert list(at_once.written) == list(one_by_one.written)
