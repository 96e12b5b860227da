"""Accepting a new class: a label a person offers is hostile input; the row names who accepted it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.data import classes, lake
from tasks.data.labels import MAX_ACCEPTED, MAX_LABEL_CHARS, LabelRefusedError, check_labels

HOSTILE = {
    "too long": "x" * (MAX_LABEL_CHARS + 1),
    "NUL": "seven\x00segment",
    "new line": "seven\nsegment",
    "escape sequence": "seven\x1b[2Jsegment",
    "right-to-left override": "seven\u202esegment",
    "line separator": "seven\u2028segment",
    "lone surrogate": "seven\udcffsegment",
    "path": "../seven",
    "separator": "seven/segment",
    "dots": "..",
    "blank edge": " seven",
    "empty": "",
}


@pytest.fixture
def discover(settings):
    return settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"allowed_labels": "discover"})})


@pytest.mark.parametrize("rule", sorted(HOSTILE))
def test_a_hostile_label_is_refused_by_its_rule_without_echoing_it(rule):
    with pytest.raises(LabelRefusedError) as refused:
        check_labels(["fine", HOSTILE[rule]])
    assert str(refused.value).startswith("label 2: ")
    assert HOSTILE[rule] not in str(refused.value) or HOSTILE[rule] in ("", "..")


def test_the_batch_itself_is_bounded():
    assert check_labels(["seven-segment", "Ünïcode 7", "x" * MAX_LABEL_CHARS]) == [
        "seven-segment", "Ünïcode 7", "x" * MAX_LABEL_CHARS]
    for labels in ([], "seven", None, [f"c{i}" for i in range(MAX_ACCEPTED + 1)], [7]):
        with pytest.raises(LabelRefusedError):
            check_labels(labels)


def test_accept_records_who_accepted_and_refuses_before_writing(discover, settings):
    uri = discover.table_uri(classes.CLASSES_TABLE)
    with pytest.raises(classes.NotDiscoveringError):
        classes.accept(settings, ["seven-segment"], "run-1", "cli:alice")  # allowed_labels is a list here
    with pytest.raises(LabelRefusedError):
        classes.accept(discover, ["seven-segment", "a\nb"], "run-1", "alice")
    assert lake.current_version(uri) is None  # one bad label: nothing written, not even the good one

    assert classes.accept(discover, ["seven-segment"], "manual__1", "alice") == 1
    assert classes.accept(discover, ["seven-segment"], "manual__2", "mallory") == 0  # recorded once, by alice
    rows = lake.read(uri, lake.current_version(uri)).to_pylist()
    assert rows == [{"label": "seven-segment", "first_raw_version": None, "added_by": "accepted",
                     "run_id": "manual__1", "actor": "alice"}]


def test_a_classes_table_written_before_the_actor_column_gains_it(discover):
    uri = discover.table_uri(classes.CLASSES_TABLE)
    old = pa.schema([f for f in classes.SCHEMA if f.name != "actor"])
    lake.merge_new_rows(uri, pa.Table.from_pylist(
        [{"label": "0", "first_raw_version": 0, "added_by": "discovered", "run_id": "r0"}], schema=old), "label", {})
    assert classes.accept(discover, ["seven-segment"], "manual__1", "alice") == 1
    rows = {r["label"]: r for r in lake.read(uri, lake.current_version(uri)).to_pylist()}
    assert rows["0"]["actor"] is None and rows["seven-segment"]["actor"] == "alice"
    assert classes.known(discover) == ["0", "seven-segment"]
