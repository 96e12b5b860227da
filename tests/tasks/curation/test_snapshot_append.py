"""Which kept rows a curation appends to the stored snapshot, and when it rewrites the snapshot whole instead."""

from __future__ import annotations

import pyarrow as pa

from tasks.curation.curate import _appended
from tasks.curation.plan import KEPT_FACTS_SCHEMA
from tasks.data import lake


def _facts(rows: list[tuple[str, str, str]]) -> pa.Table:
    return pa.Table.from_pylist([{"sha256": s, "label": label, "split": split, "component": s, "width": 8, "height": 8}
                                 for s, label, split in rows], schema=KEPT_FACTS_SCHEMA)


def _stored(tmp_path, rows: list[tuple[str, str, str]]):
    uri = str(tmp_path / "snapshot")
    lake.overwrite(uri, _facts(rows), {"run_id": "r"})
    return lake.open_table(uri)


STORED = [("c", "1", "train"), ("a", "0", "train"), ("b", "1", "test")]  # not in sha256 order, as appends leave it


def test_rows_already_stored_unchanged_leave_only_the_new_ones_to_append(tmp_path):
    table = _stored(tmp_path, STORED)
    added = _appended(table, _facts(sorted([*STORED, ("d", "0", "val"), ("0", "1", "train")])))
    assert added.column("sha256").to_pylist() == ["0", "d"]


def test_a_stored_row_that_changes_goes_or_repeats_makes_the_snapshot_whole_again(tmp_path):
    table = _stored(tmp_path, STORED)
    assert _appended(table, _facts([("a", "0", "train"), ("b", "1", "val"), ("c", "1", "train")])) is None  # moved
    assert _appended(table, _facts([("a", "0", "train"), ("c", "1", "train"), ("d", "0", "val")])) is None  # b gone
    twice = _stored(tmp_path / "twice", [*STORED, ("a", "0", "train")])
    assert _appended(twice, _facts([*STORED, ("d", "0", "val")])) is None
