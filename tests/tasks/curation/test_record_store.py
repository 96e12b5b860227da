"""The assignment record kept between curations (tasks.curation.record_store): a stored record carried over to a later
raw version, with the rows the components table appended since, is the record read whole."""

import hashlib
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from tasks.curation import record_store
from tasks.curation.assignments import Assignment, RecordAfter, read_assignments, store_record
from tasks.curation.raw_store import stored_raw
from tasks.curation.record_store import open_record

META = {"split_salt": "s"}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _raw(shas: list[str]) -> pa.Table:
    return pa.table({"sha256": pa.array(shas, pa.string()), "label": pa.array(["7"] * len(shas), pa.string()),
                     "width": pa.array([8] * len(shas), pa.int32()), "height": pa.array([8] * len(shas), pa.int32())})


def _settings(uri: str) -> SimpleNamespace:
    return SimpleNamespace(table_uri=lambda name: uri, curation=SimpleNamespace(split_salt="s"))


def _same(got, whole) -> None:
    assert dict(got.items()) == dict(whole.items())
    assert (len(got), got.known, got.stored_rows) == (len(whole), whole.known, whole.stored_rows)


def _whole_read_fails(*_args):
    raise AssertionError("read whole: the stored record was not carried over")


def test_a_record_carried_over_to_a_later_raw_version_is_the_record_read_whole(tmp_path, monkeypatch):
    raw, uri, root = str(tmp_path / "raw"), str(tmp_path / "components"), tmp_path / "index"
    images = [_sha(str(i)) for i in range(40)]
    late, gone_key = _sha("late"), _sha("key outside")  # recorded before it is a raw row; a key that never is one
    write_deltalake(raw, _raw(images[:30]))
    first = {s: Assignment(min(s, images[i % 7]), "train" if i % 3 else "test", 0, "c0")
             for i, s in enumerate(images[:30])}
    first[images[5]] = Assignment(gone_key, "val", 0, "c0")
    first[late] = Assignment(images[1], "train", 0, "c0")
    rows, folder = stored_raw(raw, 0, root)
    store_record(uri, RecordAfter(read_assignments(_settings(uri), rows)[0], first), None, META)
    record, version = open_record(_settings(uri), rows, folder)
    _same(record, read_assignments(_settings(uri), rows)[0])
    assert version == 0 and isinstance(record.split, np.memmap) and late in record.others

    write_deltalake(raw, _raw([*images[30:], late]), mode="append")
    changes = {s: Assignment(images[2], "val", 1, "c1") for s in images[30:]}
    changes[images[3]] = Assignment(images[0], "test", 0, "c0")  # renamed: a newer row
    store_record(uri, RecordAfter(record, changes), set(changes), META)
    rows, folder = stored_raw(raw, 1, root)
    with monkeypatch.context() as patched:
        patched.setattr(record_store, "whole_record", _whole_read_fails)
        carried, version = open_record(_settings(uri), rows, folder)  # v0's record, then the appended rows
        _same(carried, read_assignments(_settings(uri), rows)[0])
        assert version == 1 and late not in carried.others and carried[late].component == images[1]
        again, _ = open_record(_settings(uri), rows, folder)  # stored: mapped as it is (a retry)
        _same(again, carried)


def test_a_rewritten_raw_or_components_table_is_read_whole(tmp_path):
    raw, uri, root = str(tmp_path / "raw"), str(tmp_path / "components"), tmp_path / "index"
    images = [_sha(str(i)) for i in range(20)]
    write_deltalake(raw, _raw(images))
    rows, folder = stored_raw(raw, 0, root)
    store_record(uri, RecordAfter(read_assignments(_settings(uri), rows)[0],
                                  {s: Assignment(images[0], "train", 0, "c0") for s in images}), None, META)
    open_record(_settings(uri), rows, folder)
    write_deltalake(raw, _raw(images[5:]), mode="overwrite")  # images gone: the stored places no longer hold
    rows, folder = stored_raw(raw, 1, root)
    _same(open_record(_settings(uri), rows, folder)[0], read_assignments(_settings(uri), rows)[0])
    record = read_assignments(_settings(uri), rows)[0]
    store_record(uri, RecordAfter(record, {images[9]: Assignment(images[9], "val", 1, "c1")}), None, META)  # whole
    write_deltalake(raw, _raw([_sha("new")]), mode="append")
    rows, folder = stored_raw(raw, 2, root)
    _same(open_record(_settings(uri), rows, folder)[0], read_assignments(_settings(uri), rows)[0])


def test_a_record_of_another_salt_is_not_stored(tmp_path):
    raw, uri, root = str(tmp_path / "raw"), str(tmp_path / "components"), tmp_path / "index"
    write_deltalake(raw, _raw([_sha("a")]))
    rows, folder = stored_raw(raw, 0, root)
    store_record(uri, RecordAfter(read_assignments(_settings(uri), rows)[0],
                                  {_sha("a"): Assignment(_sha("a"), "train", 0, "c0")}), None, {"split_salt": "t"})
    record, version = open_record(_settings(uri), rows, folder)
    assert len(record) == 0 and version == 0 and not list(folder.glob("record-*"))
