"""The raw version's facts stored between curations (tasks.curation.raw_store): a version merged from a stored one
and the rows added since is the version read whole."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tasks.curation import raw_store
from tasks.curation.raw_store import STORE_FOLDER, stored_raw
from tasks.curation.tables import CurationError, RawRows, read_raw


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _rows(rows: list[tuple[str, str, int, int]]) -> pa.Table:
    return pa.table({"sha256": pa.array([r[0] for r in rows], pa.string()),
                     "label": pa.array([r[1] for r in rows], pa.string()),
                     "width": pa.array([r[2] for r in rows], pa.int32()),
                     "height": pa.array([r[3] for r in rows], pa.int32())})


def _same(got: RawRows, whole: RawRows) -> None:
    assert list(got.shas) == list(whole.shas) and got.names == whole.names
    for column in ("codes", "width", "height"):
        assert getattr(got, column).tolist() == getattr(whole, column).tolist(), column
    assert dict(got) == dict(whole)


def _whole_read_fails(*_args):
    raise AssertionError("read whole: the stored version was not merged")


def test_a_version_merged_from_the_stored_one_is_the_version_read_whole(tmp_path, monkeypatch):
    uri, root = str(tmp_path / "raw"), tmp_path / "index"
    first = [(_sha(str(i)), "bca"[i % 3], 32 + i, 30 - i % 5) for i in range(40)]
    write_deltalake(uri, _rows(first))
    _same(stored_raw(uri, 0, root).rows, read_raw(uri, 0))  # nothing stored yet: read whole, then stored
    added = [(_sha(f"new{i}"), "bca"[i % 3], 8, 8) for i in range(25)]
    added += [(first[4][0], "z", 1, 1),  # stored already: a greater label replaces its row
              (first[7][0], "a", 1, 1),  # a smaller one does not
              (_sha("new3"), "c", 99, 99),  # given twice in the added rows: the greater
              (min(_sha(f"k{i}") for i in range(200)), "0-first", 5, 5)]  # a new label, early in sha256 order
    write_deltalake(uri, _rows(added[:10]), mode="append")
    write_deltalake(uri, _rows(added[10:]), mode="append")
    with monkeypatch.context() as patched:
        patched.setattr(raw_store, "read_raw", _whole_read_fails)
        merged = stored_raw(uri, 2, root).rows  # v0 stored: the two appended files merged in
    _same(merged, read_raw(uri, 2))
    assert isinstance(merged.width.base, np.memmap) or isinstance(merged.width, np.memmap)  # the file's pages
    assert merged.label(first[4][0]) == "z" and merged.label(first[7][0]) == "c" and merged[_sha("new3")].width == 99
    with monkeypatch.context() as patched:
        patched.setattr(raw_store, "read_raw", _whole_read_fails)
        _same(stored_raw(uri, 2, root).rows, merged)  # stored: read again as it is (a retry)


def test_a_rewritten_table_is_read_whole_and_an_older_version_again(tmp_path):
    uri, root = str(tmp_path / "raw"), tmp_path / "index"
    write_deltalake(uri, _rows([(_sha(str(i)), "a", 8, 8) for i in range(30)]))
    stored_raw(uri, 0, root)
    write_deltalake(uri, _rows([(_sha(f"b{i}"), "b", 9, 9) for i in range(5)]), mode="append")
    write_deltalake(uri, _rows([(_sha(f"c{i}"), "c", 7, 7) for i in range(12)]), mode="overwrite")  # files removed
    for version in (2, 0, 1, 2):  # the last built (v1) prunes v0
        _same(stored_raw(uri, version, root).rows, read_raw(uri, version))
    (folder,) = (root / STORE_FOLDER).iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["v1", "v2"]  # the newest two; no temporary folder left


def test_an_empty_version_is_refused(tmp_path):
    uri = str(tmp_path / "raw")
    write_deltalake(uri, _rows([]))
    with pytest.raises(CurationError):
        stored_raw(uri, 0, tmp_path / "index")


def test_keys_that_share_a_prefix_are_found_without_stored_prefixes(tmp_path):
    """Two sha256s with the same first 16 hex digits: no prefix file, every lookup compares whole keys; else the
    prefixes are stored and mapped with the keys."""
    uri, root = str(tmp_path / "raw"), tmp_path / "index"
    twins = ["ab" * 8 + _sha("one")[16:], "ab" * 8 + _sha("two")[16:]]
    write_deltalake(uri, _rows([(_sha(str(i)), "a", 8, 8) for i in range(10)]))
    assert isinstance(stored_raw(uri, 0, root).rows.shas.keys.prefix, np.memmap)  # stored beside the keys
    write_deltalake(uri, _rows([(t, "b", 9, 9) for t in twins]), mode="append")
    merged = stored_raw(uri, 1, root).rows
    assert merged.shas.keys.prefix is None
    _same(merged, read_raw(uri, 1))
    assert merged.at[twins[1]] == list(merged.shas).index(twins[1]) and merged.label(twins[0]) == "b"
