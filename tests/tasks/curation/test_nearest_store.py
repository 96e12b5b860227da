"""The nearest summary's rewrite, block by block: every row back, in sha256 order, whatever the block size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.curation import nearest
from tasks.curation.nearest import NearestMap, store_nearest
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.tables import RawFacts, RawRows
from tasks.data import lake


@pytest.mark.parametrize("write_rows", [3, 7, 65_536])  # several blocks, a partial last block, one block
def test_a_full_rewrite_stores_every_row_in_sha_order_block_by_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_rows: int) -> None:
    monkeypatch.setattr(nearest, "WRITE_ROWS", write_rows)
    shas = [f"{i:064x}" for i in reversed(range(21))]  # given out of order; the last is not eligible
    rows = RawRows.of(RawFacts(s, f"c{int(s, 16) % 3}", 32, 32) for s in shas)
    m = NearestMap.over(rows, PixelKeys.of(rows.at, [f"p{i}" for i in range(21)]), rows.positions(shas[1:]), 5)
    for i in range(20):
        if i % 4:
            m.score[i], m.partner[i] = i / 10, i + 1
    uri = str(tmp_path / "curation_nearest")
    store_nearest(uri, m, 5, {"run_id": "r1"})
    version = lake.current_version(uri)
    got = lake.read(uri, version).to_pylist()
    assert [r["sha256"] for r in got] == sorted(shas[1:])
    assert [(r["label"], r["pixel_key"], r["nearest"], r["partner"]) for r in got] == [
        (f"c{i % 3}", f"p{i}", None if i % 4 == 0 else i / 10, None if i % 4 == 0 else f"{i + 1:064x}") for i in range(20)]
    assert lake.commit_at(uri, version).metadata["pairs_version"] == "5"  # one commit, stamped
    assert version == 0


def _map(shas: list[str], eligible: list[str], version: int = 5) -> NearestMap:
    rows = RawRows.of(RawFacts(s, "c0", 32, 32) for s in shas)
    return NearestMap.over(rows, PixelKeys.of(rows.at, [f"p{s[-2:]}" for s in rows.shas]), rows.positions(eligible),
                          version)


def test_a_batch_appends_its_changed_rows_and_a_marker_for_each_image_gone_and_the_newest_row_counts(
        tmp_path: Path) -> None:
    shas = [f"{i:064x}" for i in range(12)]
    uri = str(tmp_path / "curation_nearest")
    first = _map(shas, shas[:10])
    for i in range(10):
        first.score[i], first.partner[i] = i / 100, (i + 1) % 10
    store_nearest(uri, first, 5, {"run_id": "r1"})
    files = set(lake.open_table(uri).file_uris())
    batch = _map(shas, shas[1:12], 6)  # 0 left, 10 and 11 joined, 4 changed
    stored = nearest._stored(uri, 5)[0]
    assert stored.rows == 10
    added, gone = nearest.update_nearest(batch, stored, _no_scores())
    assert (added, gone) == ({shas[10], shas[11]}, {shas[0]}) and batch.left == [(shas[0], "c0", "p00")]
    batch.score[4], batch.partner[4] = 0.9, 5
    batch.changed.add(4)
    batch.full, batch.stored_rows = False, stored.rows
    store_nearest(uri, batch, 6, {"run_id": "r2"})
    table = lake.open_table(uri)
    assert files < set(table.file_uris())  # appended: no stored file rewritten
    # 4; 9, whose nearest partner left; 10 and 11; 0's marker
    assert lake.commit_at(uri, table.version()).metadata["rows_stored"] == str(10 + 5)
    summary = {r["sha256"]: (r["nearest"], r["partner"]) for r in nearest.read_summary(uri).to_pylist()}
    assert set(summary) == set(shas[1:12]) and summary[shas[4]] == (0.9, shas[5]) and summary[shas[3]] == (0.03, shas[4])
    assert summary[shas[9]] == (None, None)  # no scored partner left
    again = _map(shas, shas[1:12], 6)  # the next curation reads the newest rows: nothing new
    assert nearest.update_nearest(again, nearest._stored(uri, 6)[0], _no_scores()) == (set(), set())
    assert again.left == [] and again.score[4] == 0.9


def test_the_summary_is_written_whole_when_its_older_rows_would_pass_the_compact_factor_or_it_predates_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    shas = [f"{i:064x}" for i in range(6)]
    uri = str(tmp_path / "curation_nearest")
    legacy = pa.table({"sha256": shas, "label": ["c0"] * 6, "pixel_key": [f"p{s[-2:]}" for s in shas],
                       "nearest": [0.5] * 6, "partner": [shas[(i + 1) % 6] for i in range(6)]})
    lake.overwrite(uri, legacy, {"step": "curate_nearest", "score_config": nearest.score_config(),
                                 "pairs_version": "5"})
    stored = nearest._stored(uri, 5)[0]
    assert stored.rows is None  # written before the row count: read as each image's one row, then written whole
    m = _map(shas, shas)
    assert nearest.update_nearest(m, stored, _no_scores()) == (set(), set()) and list(m.score) == [0.5] * 6
    m.changed, m.stored_rows = {0}, stored.rows
    store_nearest(uri, m, 5, {"run_id": "r"})
    assert lake.read(uri, lake.current_version(uri)).num_rows == 6 and nearest._stored(uri, 5)[0].rows == 6
    monkeypatch.setattr(nearest, "COMPACT_FACTOR", 1.5)
    for step, changed in ((6, {0, 1, 2}), (7, {3, 4})):  # 6 + 3 <= 9 appended; 9 + 2 > 9: whole
        m = _map(shas, shas, step)
        nearest.update_nearest(m, nearest._stored(uri, step - 1)[0], _no_scores())
        m.changed, m.stored_rows, m.full = changed, nearest._stored(uri, step - 1)[0].rows, False
        store_nearest(uri, m, step, {"run_id": "r"})
        table = lake.read(uri, lake.current_version(uri))
        assert table.num_rows == (9 if step == 6 else 6)
    assert len(nearest.read_summary(uri)) == 6


def _no_scores():
    from tasks.curation.copy_pairs import CopyScores

    return CopyScores(lambda sha: b"", stored={})


def _newest_row_by_row(m: NearestMap, table) -> tuple[dict, dict, dict, bool]:
    """The rule ``nearest._newest`` keeps, one stored row at a time: a row counts when it is newer than any before
    it (of two written at once, the first); the newest row of an image eligible now must name its label and key."""
    written, live, outside, kept_out, other = {}, {}, {}, {}, {}
    for r in table.to_pylist():
        i = m.rows.at.get(r["sha256"])
        if i is None:
            if r["written"] > outside.get(r["sha256"], (-1,))[0]:
                outside[r["sha256"]] = (r["written"], r["eligible"], r["label"], r["pixel_key"])
            continue
        if r["written"] <= written.get(i, -1):
            continue
        written[i], live[i] = r["written"], r["eligible"]
        kept_out.pop(i, None)
        if r["eligible"] and not m.eligible[i]:
            kept_out[i] = (r["label"], r["pixel_key"])
        if r["eligible"] and m.eligible[i] and (m.rows.label(r["sha256"]) != r["label"]
                                                or m.pixels[r["sha256"]] != r["pixel_key"]):
            other[i] = r["written"]
    return written, live, outside, kept_out, any(written[i] == w for i, w in other.items())


@pytest.mark.parametrize("slice_rows", [5, 1_000])  # an image's rows spread over slices, or in one
@pytest.mark.parametrize("seed", range(12))
def test_each_images_newest_stored_row_is_the_one_a_row_by_row_pass_keeps(monkeypatch, seed: int, slice_rows: int
                                                                          ) -> None:
    import random

    import pyarrow as pa

    monkeypatch.setattr(nearest, "SLICE_ROWS", slice_rows)
    rng = random.Random(seed)
    shas = [f"{i:064x}" for i in range(30)]
    m = _map(shas, [s for s in shas if rng.random() < 0.8])
    stored = []
    for _ in range(90):  # rows of raw images and of images gone from the raw version, versions repeated (ties)
        sha = rng.choice(shas + [f"{99:064x}", f"{98:064x}"])
        same = sha in m.rows.at and rng.random() < 0.95
        stored.append({"sha256": sha, "label": "c0" if same or rng.random() < 0.5 else "c1",
                       "pixel_key": f"p{sha[-2:]}" if same else rng.choice(["p00", "pzz"]),
                       "nearest": None, "partner": None, "written": rng.randrange(4) if same else rng.randrange(2),
                       "eligible": rng.random() < 0.8})
    table = pa.Table.from_pylist(stored, schema=nearest.NEAREST_SCHEMA)
    written, live, outside, kept_out, refused = _newest_row_by_row(m, table)
    got = nearest._newest(m, table)
    if refused:
        assert got is None
        return
    assert got is not None
    assert {i: w for i, w in enumerate(got.written) if w >= 0} == written
    assert {i: bool(v) for i, v in enumerate(got.live) if i in written} == live
    assert got.outside == outside and got.kept_out == kept_out


@pytest.mark.parametrize("write_rows", [7, 65_536])  # blocks of positions, a partial last block; one block
def test_the_scores_by_label_are_each_labels_scored_eligible_images_in_position_order(
        monkeypatch: pytest.MonkeyPatch, write_rows: int) -> None:
    import math
    import random

    monkeypatch.setattr(nearest, "WRITE_ROWS", write_rows)
    rng = random.Random(5)
    shas = [f"{i:064x}" for i in range(60)]
    label = {s: f"c{rng.randrange(4)}" for s in shas}  # c3 may be given to none of the eligible
    rows = RawRows.of(RawFacts(s, label[s], 32, 32) for s in shas)
    eligible = [s for s in shas if rng.random() < 0.8]
    m = NearestMap.over(rows, PixelKeys.of(rows.at, [f"p{i}" for i in range(60)]), rows.positions(eligible), 1)
    for i in range(60):
        if rng.random() < 0.7:  # some eligible images have no scored partner (NaN); others are not eligible
            m.score[i] = rng.random()
    expected: dict[str, list[float]] = {}
    for i, s in enumerate(rows.shas):
        if s in eligible and not math.isnan(m.score[i]):
            expected.setdefault(label[s], []).append(m.score[i])
    got = m.by_label()
    assert list(got) == sorted(expected) and {k: v.tolist() for k, v in got.items()} == expected
