"""Settled zones: an unchanged landing zone costs its listing; any change falls back to the per-file path."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from tasks.data import ingest_zones, lake
from tasks.data.ingest import MANIFEST_TABLE, ingest_landing
from tasks.data.sources import LISTING_SCHEMA, Source


def _png(seed: int, side: int = 16) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, size=(side, side), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _zone(landing: Path) -> Path:
    """Good images plus every kind of outcome a re-run must reproduce from the record alone."""
    for seed in range(12):
        (landing / str(seed % 3)).mkdir(parents=True, exist_ok=True)
        (landing / str(seed % 3) / f"img {seed}.png").write_bytes(_png(seed))
    (landing / "0" / "copy of img 0.png").write_bytes(_png(0))  # same bytes, same label: already present
    (landing / "1" / "twin a.png").write_bytes(_png(100))  # same bytes under two labels: both rejected
    (landing / "2" / "twin b.png").write_bytes(_png(100))
    (landing / "1" / "empty.png").write_bytes(b"")  # a content verdict the manifest caches
    (landing / "1" / "notes.txt").write_text("not an image")  # rejected from the listing alone
    (landing / "x").mkdir(exist_ok=True)
    (landing / "x" / "img.png").write_bytes(_png(200))  # unknown label
    (landing / "2" / "escape.png").symlink_to("/etc/hostname")  # a listing problem
    return landing


def _versions(settings) -> dict[str, int | None]:
    names = ["raw_images", "rejects", MANIFEST_TABLE, ingest_zones.ZONES_TABLE]
    return {name: lake.current_version(settings.table_uri(name)) for name in names}


def _counts(result) -> tuple:
    return (result.raw_version, result.files_seen, result.inserted, result.already_present, result.rejected,
            result.committed)


def test_an_unchanged_zone_returns_what_the_per_file_path_would_and_commits_nothing(settings, tmp_path, monkeypatch):
    landing = _zone(tmp_path / "landing")
    first = ingest_landing(settings, "z1", "2026-11-21", landing)
    assert first.inserted == 12 and not first.zone_unchanged
    before = _versions(settings)
    assert before[ingest_zones.ZONES_TABLE] == 0  # the zone was recorded once its files were decided

    again = ingest_landing(settings, "z2", "2026-11-22", landing)
    assert again.zone_unchanged and again.files_read == 0 and again.commit_attempts == 0
    assert _versions(settings) == before  # nothing committed anywhere

    with monkeypatch.context() as patched:  # the same question through the per-file path
        patched.setattr(ingest_zones, "settled", lambda *args: None)
        slow = ingest_landing(settings, "z3", "2026-11-23", landing)
    assert not slow.zone_unchanged and slow.files_read > 0  # it re-reads the conflicting twins
    assert _counts(again) == _counts(slow) == (first.raw_version, first.files_seen, 0, 13, first.rejected, False)
    assert _versions(settings)[lake.table_name(settings.raw_table)] == before["raw_images"]


@pytest.mark.parametrize("change", ["touch", "rewrite", "add", "remove", "rename"])
def test_any_change_to_the_zone_is_decided_file_by_file(settings, tmp_path, change):
    landing = _zone(tmp_path / "landing")
    first = ingest_landing(settings, "c1", "2026-11-21", landing)
    target = landing / "1" / "img 1.png"
    if change == "touch":
        os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 1))
    elif change == "rewrite":
        target.write_bytes(_png(300))
    elif change == "add":
        (landing / "1" / "new.png").write_bytes(_png(301))
    elif change == "remove":
        target.unlink()
    else:
        target.rename(landing / "1" / "renamed.png")

    second = ingest_landing(settings, "c2", "2026-11-22", landing)
    assert not second.zone_unchanged
    expected = {"touch": (1, 0), "rewrite": (1, 1), "add": (1, 1), "remove": (0, 0), "rename": (1, 0)}[change]
    assert (second.files_read - 2, second.inserted) == expected  # (the two conflicting twins are re-read too)
    assert second.committed == (expected[1] == 1)

    third = ingest_landing(settings, "c3", "2026-11-23", landing)  # the new state is settled in turn
    assert third.zone_unchanged and third.raw_version == second.raw_version
    assert third.already_present == first.inserted + first.already_present + (change == "add") - (change == "remove")


def test_another_commit_to_raw_images_sends_the_zone_back_to_the_per_file_path(settings, tmp_path):
    zone_a, zone_b = tmp_path / "a", tmp_path / "b"
    for seed in range(6):
        (zone_a / "1").mkdir(parents=True, exist_ok=True)
        (zone_a / "1" / f"a{seed}.png").write_bytes(_png(seed))
    (zone_b / "2").mkdir(parents=True)
    (zone_b / "2" / "b.png").write_bytes(_png(50))
    ingest_landing(settings, "a1", "2026-11-21", zone_a)
    other = ingest_landing(settings, "b1", "2026-11-21", zone_b)
    assert other.committed

    again = ingest_landing(settings, "a2", "2026-11-22", zone_a)
    assert not again.zone_unchanged and again.files_read == 0 and again.raw_version == other.raw_version
    assert ingest_landing(settings, "a3", "2026-11-23", zone_a).zone_unchanged


def test_an_unreadable_file_keeps_the_zone_unsettled_until_it_can_be_read(settings, tmp_path, monkeypatch):
    landing = _zone(tmp_path / "landing")
    locked = str(landing / "0" / "img 3.png")
    real_read = Source.read
    tries: list[str] = []

    def read(self, entry, max_bytes):
        if entry.path == locked:
            tries.append(entry.path)
            raise PermissionError(errno.EACCES, "Permission denied", locked)
        return real_read(self, entry, max_bytes)

    with monkeypatch.context() as patched:
        patched.setattr(Source, "read", read)
        first = ingest_landing(settings, "u1", "2026-11-21", landing)
        assert first.inserted == 11
        assert lake.current_version(settings.table_uri(ingest_zones.ZONES_TABLE)) is None  # not recorded
        still = ingest_landing(settings, "u2", "2026-11-22", landing)
        assert not still.zone_unchanged and len(tries) == 2  # the locked file is tried again
        assert still.rejected == first.rejected

    fixed = ingest_landing(settings, "u3", "2026-11-23", landing)  # a chmod changes no size or mtime
    assert not fixed.zone_unchanged and fixed.inserted == 1
    assert ingest_landing(settings, "u4", "2026-11-24", landing).zone_unchanged


def test_other_rules_or_labels_mean_another_decision(settings, tmp_path):
    landing = _zone(tmp_path / "landing")
    ingest_landing(settings, "r1", "2026-11-21", landing)
    labels = (*settings.ingest.allowed_labels, "x")
    widened = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"allowed_labels": labels})})
    again = ingest_landing(widened, "r2", "2026-11-22", landing)
    assert not again.zone_unchanged and again.inserted == 1  # x/img.png is welcome now

    manifest = landing / "labels.csv"
    manifest.write_text("path,label\n1/img 1.png,1\n")
    by_csv = ingest_landing(widened, "r3", "2026-11-23", landing, label_source="csv", manifest=str(manifest))
    assert not by_csv.zone_unchanged  # another zone: root + label source + manifest
    assert ingest_landing(widened, "r4", "2026-11-24", landing, label_source="csv", manifest=str(manifest)).zone_unchanged
    manifest.write_text("path,label\n1/img 1.png,2\n")  # a relabel: same file, other label
    relabelled = ingest_landing(widened, "r5", "2026-11-25", landing, label_source="csv", manifest=str(manifest))
    assert not relabelled.zone_unchanged and relabelled.rejected == 1  # same bytes already under label 1


def test_full_recheck_opens_every_file_and_duplicates_nothing(settings, tmp_path):
    landing = _zone(tmp_path / "landing")
    first = ingest_landing(settings, "f1", "2026-11-21", landing)
    full = ingest_landing(settings, "f2", "2026-11-22", landing, full=True)
    assert not full.zone_unchanged and not full.committed
    assert full.files_read == 16  # every image-named file under a known label (not the .txt, link or x/)
    assert (full.inserted, full.already_present, full.rejected) == (0, 13, first.rejected)
    raw = lake.read(settings.raw_table, full.raw_version, ["sha256"])
    assert raw.num_rows == 12


def test_unknown_stamps_and_unreadable_files_are_never_recorded():
    def listing(size: int, mtime: int, code: str | None = None) -> pa.Table:
        return pa.Table.from_pylist([{"uri": "s3://b/1/a.png", "path": "b/1/a.png", "label": "1", "size": size,
                                      "mtime_ns": mtime, "etag": None, "problem_code": code,
                                      "problem_detail": None}], schema=LISTING_SCHEMA)

    assert ingest_zones.stable(listing(10, 5), set())
    assert not ingest_zones.stable(listing(10, -1), set())  # an object store that gives no mtime
    assert ingest_zones.stable(listing(-1, -1, "missing_file"), {"missing_file"})  # a listing verdict is stable
    assert not ingest_zones.stable(listing(10, 5), {"unreadable"})
    rules = {"allowed": ["1"]}
    assert ingest_zones.listing_digest(listing(10, 5), rules) == ingest_zones.listing_digest(listing(10, 5), rules)
    assert ingest_zones.listing_digest(listing(10, 5), rules) != ingest_zones.listing_digest(listing(10, 6), rules)
    assert ingest_zones.listing_digest(listing(10, 5), rules) != ingest_zones.listing_digest(listing(10, 5), {})
