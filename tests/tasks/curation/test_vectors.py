"""The embedding's memory-mapped vector files: extended by a batch, rebuilt when missing or stale, idempotent."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tasks.curation import vectors
from tasks.curation.copy_pairs import blurred
from tasks.curation.vectors import RowView, VectorFile, stored_views


def _unit_rows(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    m = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _shas(n: int, prefix: str = "a") -> list[str]:
    return [f"{prefix}{i:06d}".rjust(64, "0") for i in range(n)]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.vectors.*")) if p.suffix in (".npy", ".shas")}


def test_a_batch_extends_the_file_and_a_retry_adds_nothing(tmp_path: Path) -> None:
    m = _unit_rows(300)
    shas = _shas(300)
    table = dict(zip(shas, m))
    asked: list[list[str]] = []

    def vectors_of(wanted: list[str]) -> np.ndarray:
        asked.append(wanted)
        return np.stack([table[s] for s in wanted])

    first = stored_views(tmp_path, "v", shas[:200], vectors_of)
    assert np.load(next(tmp_path.glob("*.vectors.npy")), mmap_mode="r").shape == (200, 64)
    views = stored_views(tmp_path, "v", shas, vectors_of)  # the batch: 100 more
    assert asked == [shas[:200], shas[200:]]  # only what the file lacked, in sha256 order
    stored = VectorFile.open(tmp_path, "v;view=0")
    assert isinstance(stored.array, np.memmap) and stored.shas.array.tolist() == [s.encode() for s in shas]
    np.testing.assert_array_equal(views[0][np.arange(300)], m)  # read by position
    np.testing.assert_array_equal(first[0][[5, 7]], m[[5, 7]])
    written = _files(tmp_path)
    stored_views(tmp_path, "v", shas, vectors_of)  # a retried batch
    assert asked == [shas[:200], shas[200:]] and _files(tmp_path) == written


def test_a_missing_or_stale_file_is_rebuilt_with_the_same_rows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(vectors, "COPY_ROWS", 7)  # copies and blurs a block at a time
    m = _unit_rows(120, seed=1)
    shas = _shas(120)

    def vectors_of(wanted: list[str]) -> np.ndarray:
        return m[[shas.index(s) for s in wanted]]

    blur = [lambda rows: blurred(rows, 8)]
    stored_views(tmp_path, "v", shas[:60], vectors_of, blur)
    stored_views(tmp_path, "v", shas, vectors_of, blur)
    once = _files(tmp_path)
    for path in tmp_path.glob("*.vectors.npy"):
        path.unlink()  # missing
    rebuilt = stored_views(tmp_path, "v", shas, vectors_of, blur)
    np.testing.assert_array_equal(np.asarray(rebuilt[0]), m)
    np.testing.assert_array_equal(np.asarray(rebuilt[1]), blurred(m, 8))  # a row's blur does not depend on others
    assert _files(tmp_path) == once  # here the batch's shas sort after the first ones: the same order
    extra = _shas(3, "f")  # stale: the list names more images than the file has rows
    VectorFile.open(tmp_path, "v;view=0").path.with_suffix(".shas").write_text("\n".join(shas + extra) + "\n")
    assert len(VectorFile.open(tmp_path, "v;view=0").shas) == 0
    again = stored_views(tmp_path, "v", shas, vectors_of, blur)
    np.testing.assert_array_equal(np.asarray(again[0]), m)
    np.testing.assert_array_equal(np.asarray(again[1]), blurred(m, 8))


@pytest.mark.parametrize("mapped", [False, True])
def test_row_view_gathers_by_position(tmp_path: Path, mapped: bool) -> None:
    m = _unit_rows(10, dim=4)
    view = RowView(m, np.array([9, 2, 5]), tmp_path if mapped else None)  # its row map mapped from a file, or held
    assert view.shape == (3, 4) and len(view) == 3
    np.testing.assert_array_equal(view[np.array([[0, 2], [1, 1]])], m[[[9, 5], [2, 2]]])
    np.testing.assert_array_equal(np.asarray(view), m[[9, 2, 5]])


def test_consecutive_rows_are_a_view_of_the_file_and_every_answer_is_read_only(tmp_path: Path) -> None:
    shas = _shas(50)
    m = np.arange(50 * 4, dtype=np.float32).reshape(50, 4)
    store = VectorFile.open(tmp_path, "v;view=0")
    store.append(shas, iter([m]))
    array = VectorFile.open(tmp_path, "v;view=0").array
    view = RowView(array, np.arange(10, 50))  # a first curation's eligible images: the file's rows in order
    whole = view[np.arange(40)]
    assert np.shares_memory(whole, array) and np.array_equal(whole, m[10:50])  # no copy of the rows
    gathered = RowView(array, np.arange(50)[::-1])[np.arange(5)]
    assert not np.shares_memory(gathered, array) and np.array_equal(gathered, m[[49, 48, 47, 46, 45]])
    writable = np.array(m)  # a view over a writable array (not the product's mapped file) is read-only too
    over_writable = RowView(writable, np.arange(50))[np.arange(10)]
    assert np.shares_memory(over_writable, writable) and writable.flags.writeable
    for rows in (whole, gathered, view[np.array([3])], over_writable):
        with pytest.raises(ValueError):
            rows[0, 0] = 1.0


def test_rows_are_appended_block_by_block_and_a_short_or_wrong_append_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    m = _unit_rows(50, dim=8, seed=2)
    shas = _shas(50)
    store = VectorFile.open(tmp_path, "v;view=0")
    store.append(shas[:20], iter([m[:7], m[7:20]]))  # blocks of any length, written as they come
    store.append(shas[20:], iter([m[20:21], m[21:50]]))
    np.testing.assert_array_equal(np.load(store.path), m)
    before = _files(tmp_path)
    for blocks, why in (([m[:3]], "3 rows for 4 images"), ([m[:4, :4]], "rows of 4 floats, the file has 8"),
                        ([], "0 rows for 4 images")):
        with pytest.raises(ValueError, match=why):
            store.append(_shas(4, "b"), iter(blocks))
        assert _files(tmp_path) == before and not list(tmp_path.glob("*.tmp"))
    assert VectorFile.open(tmp_path, "v;view=0").shas.array.tolist() == [s.encode() for s in shas]


def _store(folder: Path, shas: list[str], m: np.ndarray) -> VectorFile:
    store = VectorFile.open(folder, "v;view=0")
    store.append(shas, iter([m]))
    return store


def test_a_batch_appends_in_place_and_its_file_is_the_file_written_at_once(tmp_path: Path, monkeypatch) -> None:
    m = _unit_rows(90, dim=8, seed=3)
    shas = _shas(90)
    store = _store(tmp_path / "batches", shas[:60], m[:60])
    inode = os.stat(store.path).st_ino
    copied = []
    monkeypatch.setattr(VectorFile, "_append_by_copy", lambda self, *a: copied.append(a))
    store.append(shas[60:], iter([m[60:70], m[70:90]]))  # the stored 60 rows are not copied
    assert not copied and os.stat(store.path).st_ino == inode
    monkeypatch.undo()
    _store(tmp_path / "once", shas, m)
    assert _files(tmp_path / "batches") == _files(tmp_path / "once")  # byte for byte, header included
    np.testing.assert_array_equal(np.load(store.path), m)


def test_rows_an_append_did_not_commit_are_not_read_and_are_cut_by_the_next(tmp_path: Path) -> None:
    m = _unit_rows(80, dim=8, seed=4)
    shas = _shas(80)
    store = _store(tmp_path, shas[:40], m[:40])
    store._append_in_place(20, iter([m[40:60]]))  # rows and header written, then a crash before the list
    reopened = VectorFile.open(tmp_path, "v;view=0")
    assert len(reopened.shas) == 40 and reopened.array.shape == (40, 8)  # the committed rows only
    np.testing.assert_array_equal(np.asarray(reopened.array), m[:40])
    with open(store.path, "ab") as f:  # and a crash while writing rows, before the header
        f.write(b"\xff" * 100)
    reopened = VectorFile.open(tmp_path, "v;view=0")
    reopened.append(shas[40:80], iter([m[40:80]]))
    np.testing.assert_array_equal(np.load(store.path), m)
    assert _files(tmp_path) == _files(_store(tmp_path / "once", shas, m).path.parent)


def test_a_header_that_cannot_grow_is_copied_and_a_rebuild_never_pairs_an_old_list_with_new_rows(
        tmp_path: Path, monkeypatch) -> None:
    m = _unit_rows(30, dim=8, seed=5)
    shas = _shas(30)
    store = _store(tmp_path, shas[:10], m[:10])
    with open(store.path, "wb") as out:  # a version 2.0 header (np.save's for big headers): copied, not grown
        np.lib.format.write_array_header_2_0(out, {"descr": "<f4", "fortran_order": False, "shape": (10, 8)})
        out.write(m[:10].tobytes())
    VectorFile.open(tmp_path, "v;view=0").append(shas[10:20], iter([m[10:20]]))
    np.testing.assert_array_equal(np.load(store.path), m[:20])
    # A rebuild (the file unreadable) whose list write fails: the old list is gone first, so the new rows are never
    # read under it (in another order than its images).
    store.path.write_bytes(b"\x93NUMPY torn")  # a torn header: not read, rebuilt
    rebuilding = VectorFile.open(tmp_path, "v;view=0")
    assert rebuilding.array is None
    monkeypatch.setattr(vectors.ShaList, "write", lambda self, path, more=(): (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        rebuilding.append(shas[::-1], iter([m[::-1]]))
    monkeypatch.undo()
    assert not store.path.with_suffix(".shas").exists()
    assert len(VectorFile.open(tmp_path, "v;view=0").shas) == 0  # missing list: rebuilt again, never misread

