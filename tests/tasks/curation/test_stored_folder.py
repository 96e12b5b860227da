import os
import time

from tasks.curation.stored_folder import STALE_SECONDS, complete, prune_stale, publish, work_folder


def test_a_folder_is_there_whole_and_the_first_rename_stands(tmp_path):
    own = tmp_path / "v3"
    first, second = work_folder(tmp_path), work_folder(tmp_path)
    (first / "keys.npy").write_text("first")
    (second / "keys.npy").write_text("second")
    assert not complete(first) and not complete(own)
    assert publish(first, own) and complete(own)
    assert not publish(second, own)  # another curation's stands; the caller removes its own
    assert (own / "keys.npy").read_text() == "first" and second.is_dir()


def test_only_a_crashed_builds_folder_is_pruned(tmp_path):
    old, fresh, kept = work_folder(tmp_path), work_folder(tmp_path), tmp_path / "v1"
    kept.mkdir()
    past = time.time() - STALE_SECONDS - 60
    for path in (old, kept):
        os.utime(path, (past, past))
    prune_stale(tmp_path)
    assert not old.exists() and fresh.is_dir() and kept.is_dir()
