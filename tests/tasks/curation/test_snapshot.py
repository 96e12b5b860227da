"""The curated snapshot's rows with their bytes (streamed from the raw table or the images held), and which kept
rows a curation appends to the stored snapshot, or when it rewrites the snapshot whole instead."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.curation import plan, raw_images
from tasks.curation.curate import _appended
from tasks.curation.kept_facts import KEPT_FACTS_SCHEMA, KeptFacts
from tasks.curation.plan import snapshot_batches
from tasks.curation.raw_images import RawImages
from tasks.curation.tables import CURATED_SCHEMA
from tasks.data import lake


def _table(rows: list[tuple[str, str, str]]) -> pa.Table:
    return pa.Table.from_pylist([{"sha256": s, "label": label, "split": split, "width": 8, "height": 8}
                                 for s, label, split in rows], schema=KEPT_FACTS_SCHEMA)


def _facts(rows: list[tuple[str, str, str]]) -> KeptFacts:
    """What a plan keeps: ``rows`` in sha256 order."""
    return KeptFacts.of_table(_table(sorted(rows)))


def _stored(tmp_path, rows: list[tuple[str, str, str]], component: bool = False):
    """A stored snapshot of ``rows`` (``component``: with the column snapshots had before it moved to the record)."""
    facts = _table(rows)
    table = facts.add_column(1, CURATED_SCHEMA.field("image"), pa.array([s.encode() for s, _, _ in rows], pa.binary()))
    if component:
        table = table.add_column(4, "component", facts.column("sha256"))
    uri = str(tmp_path / "snapshot")
    lake.overwrite(uri, table, {"run_id": "r"})
    return lake.open_table(uri)


STORED = [("c", "1", "train"), ("a", "0", "train"), ("b", "1", "test")]  # not in sha256 order, as appends leave it


@pytest.mark.parametrize("block_rows", [1 << 18, 2])  # the stored rows read in one block, or a few
def test_rows_already_stored_unchanged_leave_only_the_new_ones_to_append(tmp_path, monkeypatch, block_rows):
    monkeypatch.setattr(lake, "LOOKUP_BLOCK_ROWS", block_rows)
    table = _stored(tmp_path, STORED)
    added = _appended(table, _facts(sorted([*STORED, ("d", "0", "val"), ("0", "1", "train")])))
    assert added.table().column("sha256").to_pylist() == ["0", "d"]


@pytest.mark.parametrize("block_rows", [1 << 18, 2])
def test_a_stored_row_that_changes_goes_or_repeats_makes_the_snapshot_whole_again(tmp_path, monkeypatch, block_rows):
    monkeypatch.setattr(lake, "LOOKUP_BLOCK_ROWS", block_rows)
    table = _stored(tmp_path, STORED)
    assert _appended(table, _facts([("a", "0", "train"), ("b", "1", "val"), ("c", "1", "train")])) is None  # moved
    assert _appended(table, _facts([("a", "0", "train"), ("c", "1", "train"), ("d", "0", "val")])) is None  # b gone
    twice = _stored(tmp_path / "twice", [*STORED, ("a", "0", "train")])  # in two blocks when they are 2 rows
    assert _appended(twice, _facts([*STORED, ("d", "0", "val")])) is None


def test_a_snapshot_that_still_holds_the_component_is_written_whole_once(tmp_path):
    old = _stored(tmp_path / "old", STORED, component=True)
    assert "component" in old.schema().to_arrow().names
    assert _appended(old, _facts([*STORED, ("d", "0", "val")])) is None  # same rows: the columns differ
    assert _appended(_stored(tmp_path / "new", STORED), _facts([*STORED, ("d", "0", "val")])).num_rows == 1


@pytest.mark.parametrize("held", [False, True])
def test_the_snapshot_gets_each_kept_rows_own_bytes_in_blocks_from_a_scan_or_the_held_images(
        settings, raw_digits, monkeypatch, held):
    monkeypatch.setattr(plan, "ROW_BLOCK", 64)
    monkeypatch.setattr(raw_images, "BLOCK_ROWS", 100)  # the scan yields 18 blocks of the 1,797 digits
    raw = lake.read(settings.raw_table, raw_digits.raw_version, columns=["sha256", "image", "label"])
    stored = {r["sha256"]: r for r in raw.to_pylist()}
    kept = sorted(stored)[::3]  # a third of the images, in sha256 order as a plan keeps them
    facts = KeptFacts.of_table(pa.Table.from_pylist([{"sha256": s, "label": stored[s]["label"], "split": "train",
                                                      "width": 8, "height": 8} for s in kept], schema=KEPT_FACTS_SCHEMA))
    images = RawImages(settings.raw_table, raw_digits.raw_version)
    if held:
        images.hold(kept[:-1] + kept[-1:])
        assert images.holds(kept) and not images.holds(sorted(stored)[1:2])
    batches = list(snapshot_batches(facts, images))
    assert all(b.schema == CURATED_SCHEMA and b.num_rows <= 64 for b in batches)
    if held:  # past ROW_BLOCK, a batch holds about BLOCK_BYTES of images at most (thousands of photos: GBs)
        mean = sum(b.column("image").nbytes for b in batches) / len(kept)
        monkeypatch.setattr(plan, "BLOCK_BYTES", int(10 * mean))
        small = list(snapshot_batches(facts, images))
        rows = {b.num_rows for b in small[:-1]}  # the held chunks' sizes count their offsets too
        assert len(rows) == 1 and 5 <= rows.pop() <= 10
        assert pa.Table.from_batches(small).equals(pa.Table.from_batches(batches))
    rows = pa.Table.from_batches(batches).to_pylist()
    assert sorted(r["sha256"] for r in rows) == kept
    assert all(r["image"] == stored[r["sha256"]]["image"] and r["label"] == stored[r["sha256"]]["label"] for r in rows)


def test_raw_images_hold_only_what_is_asked_and_answer_for_it(settings, raw_digits):
    images = RawImages(settings.raw_table, raw_digits.raw_version)
    raw = lake.read(settings.raw_table, raw_digits.raw_version, columns=["sha256", "image"])
    some = raw.column("sha256").to_pylist()[5:9]
    assert not images.holds(some[:1])
    images.hold(some[:2])
    images.hold(some)  # adds the two others only
    assert images.holds(some) and images(some[3]) == raw.column("image")[8].as_py()
    assert images.column(some[::-1]).to_pylist() == raw.column("image").to_pylist()[5:9][::-1]
    images.hold(["0" * 64])  # not in the version: nothing held for it
    assert not images.holds(["0" * 64])
    images.release()
    assert not images.holds(some[:1])


def test_held_images_answer_for_the_raw_rows_sha256s(settings, raw_digits):
    from tasks.curation.tables import read_raw

    rows = read_raw(settings.raw_table, raw_digits.raw_version)
    images = RawImages(settings.raw_table, raw_digits.raw_version)
    some = rows.shas[10:14]
    images.hold(list(some))
    assert images.holds(some) and not images.holds(rows.shas[20:21])
    assert images.column(some[::-1]).equals(images.column(some).take([3, 2, 1, 0]))


def test_held_images_gathered_across_many_chunks_in_the_order_asked(settings, raw_digits, monkeypatch):
    import random

    monkeypatch.setattr(raw_images, "BLOCK_ROWS", 100)  # 18 held chunks of the 1,797 digits
    monkeypatch.setattr(raw_images, "TAKE_ROWS", 70)
    images = RawImages(settings.raw_table, raw_digits.raw_version)
    raw = lake.read(settings.raw_table, raw_digits.raw_version, columns=["sha256", "image"])
    by_sha = dict(zip(raw.column("sha256").to_pylist(), raw.column("image").to_pylist()))
    shas = sorted(by_sha)
    images.hold(shas[::2])
    images.hold(shas[1::2])  # a second scan: more chunks after the first ones
    rng = random.Random(5)
    asked = rng.sample(shas, 500) + rng.choices(shas, k=100)  # any order, some twice
    got = images.column(asked)
    assert got.type == pa.binary() and got.to_pylist() == [by_sha[s] for s in asked]
    assert images.column([]).to_pylist() == []


def test_a_scan_holds_what_it_passes_within_its_budget_and_nothing_past_it(settings, raw_digits, monkeypatch):
    monkeypatch.setattr(raw_images, "BLOCK_ROWS", 100)
    raw = lake.read(settings.raw_table, raw_digits.raw_version, columns=["sha256", "image"])
    by_sha = dict(zip(raw.column("sha256").to_pylist(), raw.column("image").to_pylist()))
    wanted = sorted(by_sha)[::4]
    size = sum(len(by_sha[s]) for s in wanted)
    within = RawImages(settings.raw_table, raw_digits.raw_version)
    scanned = [s for b in within.blocks_holding(wanted, budget=2 * size) for s in b.column("sha256").to_pylist()]
    assert sorted(scanned) == wanted and within.holds(wanted) and within(wanted[7]) == by_sha[wanted[7]]
    past = RawImages(settings.raw_table, raw_digits.raw_version)
    assert sorted(s for b in past.blocks_holding(wanted, budget=size // 3) for s in b.column("sha256").to_pylist()) \
        == wanted  # every image still passes once
    assert not past.holds(wanted[:1]) and not past.holds(wanted[-1:])  # but none is held
