"""A batch walks only the components it touched; the others keep the previous curation's decisions (issue 25).

Real images: tiles of a bundled photo (a class whose copies stand out: a copy is dropped) and noisy
renderings of one digit (a class whose scores straddle the threshold: it abstains and lists possible
copies). The batch adds noisy digits; its decisions must equal a full recomputation's,
with the component of a tile copy (dropped then) reused as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tasks.curation import prior_walk
from tasks.curation.assignments import Assignment, Record
from tasks.curation.curate import curate
from tasks.curation.groups import GroupsBuilder
from tasks.curation.nearest import NEAREST_TABLE, NearestMap
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.prior_walk import PriorWalk, touched_components
from tasks.curation.sha_list import SortedShas
from tasks.curation.tables import RawFacts, RawRows
from tasks.data import lake
from tasks.data.ingest import ingest_landing
from tasks.settings import load_settings
from tests.factories.curation import encode, outcome, plant
from tests.tasks.curation.test_abstention import noisy_digits, photo_tiles


def _decisions(result) -> dict:
    return json.loads(Path(result.report_path).read_text())["decisions"]


def test_a_batch_reuses_untouched_components_and_decides_as_a_full_walk(settings, tmp_path) -> None:
    tiles, noisy = photo_tiles(60), noisy_digits(80)
    first, batch = tmp_path / "first", tmp_path / "batch"
    for i in range(60):
        plant(first, f"tile_{i:03d}.png", 1, encode(tiles[i], "PNG"))
    plant(first, "tile_007_copy.jpg", 1, encode(tiles[7], "JPEG", quality=85))
    for i in range(60):
        plant(first, f"noisy_{i:03d}.png", 2, encode(noisy[i], "PNG"))
    raw1 = ingest_landing(settings, run_id="i1", logical_date="2026-11-21", landing=first).raw_version
    before = _decisions(curate(settings, raw1, run_id="c1", logical_date="2026-11-21"))
    for i in range(60, 80):
        plant(batch, f"noisy_{i:03d}.png", 2, encode(noisy[i], "PNG"))
    raw2 = ingest_landing(settings, run_id="i2", logical_date="2026-11-22", landing=batch).raw_version

    full_home = tmp_path / "full"
    shutil.copytree(settings.home, full_home, symlinks=True)
    full_settings = load_settings("sit", home=full_home)
    shutil.rmtree(Path(full_settings.table_uri(NEAREST_TABLE)))  # no summary: no earlier state, every component walked
    full = curate(full_settings, raw2, run_id="c2", logical_date="2026-11-22")
    part = curate(settings, raw2, run_id="c2", logical_date="2026-11-22")

    assert outcome(settings, part) == outcome(full_settings, full)
    walked, everything = _decisions(part), _decisions(full)
    assert everything["components"]["reused"] == 0
    assert walked["components"]["reused"] > 0 and walked["components"]["reused_from_curated_version"] is not None
    assert walked["components"]["extended"] == 1 and walked["components"]["walked"] == 0  # the noisy digits grew
    assert [a["label"] for a in before["abstained"]] == ["2"]
    assert [a["label"] for a in walked["abstained"]] == [a["label"] for a in everything["abstained"]] == ["2"]
    reasons = {s: d["reason"] for s, d in outcome(settings, part).items() if not d["kept"]}
    assert list(reasons.values()) == ["near_duplicate"]  # tile 7's copy, in a component reused as it was
    listed = {(p["sha256"], p["partner"]) for p in walked["possible_copies"]}
    assert listed <= {(p["sha256"], p["partner"]) for p in everything["possible_copies"]}
    old = set(lake.read(settings.raw_table, raw1, columns=["sha256"]).column("sha256").to_pylist())
    for p in everything["possible_copies"]:  # every possible copy with a batch image is listed again
        if p["sha256"] not in old or p["partner"] not in old:
            assert (p["sha256"], p["partner"]) in listed


def _nearest(added: set[str], gone: set[str]) -> NearestMap:
    m = NearestMap.over(RawRows.of([]), PixelKeys.of({}, []), np.zeros(0, dtype=np.int64), 1)
    m.added, m.gone, m.written_by = added, gone, {"run_id": "c1", "raw_version": "0"}
    return m


@pytest.mark.parametrize("members_block", [1, 2, 3, 65_536])
@pytest.mark.parametrize("block", [1, 2, 65_536])
def test_touched_components_are_those_that_gained_lost_or_merged_members(monkeypatch, block, members_block) -> None:
    monkeypatch.setattr(prior_walk, "TOUCH_BLOCK", block)  # the members of a block of components coded at a time
    monkeypatch.setattr(prior_walk, "MEMBER_BLOCK", members_block)  # within it, this many members at a time
    given = {s: Assignment(k, "train", 0, "c1") for s, k in
             [("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c"), ("d1", "d"), ("e1", "e"), ("f1", "f")]}
    members = {"a": ["a1", "a2"], "b": ["b1", "new"], "c": ["c1"], "d": ["d1"], "e": ["e1", "f1"]}
    eligible = SortedShas.of(sorted(s for m in members.values() for s in m))
    rows = RawRows.of(RawFacts(s, "1", 32, 32) for s in [*eligible, "z"])
    record = Record(rows)
    for s, a in given.items():
        record.add(s, a)
    builder = GroupsBuilder(eligible)
    for key, shas in members.items():
        builder.add(key, [eligible.index_of(s) for s in shas])
    groups = builder.build()
    touched = touched_components(groups, record, rows.positions_of(eligible), {"f": "e"},
                                 _nearest(added={"c1"}, gone={"a2x", "d1"}), raw_version=1)
    assert touched.whole == {"c", "d"}  # c gained a newly eligible recorded image, d lost one
    grown = {k: (g.new.tolist(), g.merged) for k, g in touched.grown.items()}
    assert grown == {"b": ([eligible.index_of("new")], ()), "e": ([], ("f",))}  # b: a new image; e merged f
    parts = touched.grown["e"].parts
    assert parts is not None and len(set(parts.tolist())) == 2  # e1 and f1: each in its recorded component
    at_first = touched_components(groups, record, rows.positions_of(eligible), {"f": "e"},
                                  _nearest(added={"c1"}, gone={"a2x", "d1"}), raw_version=0)
    assert at_first.whole == {"b", "c", "d", "e"} and not at_first.grown  # b1 was not assigned before version 0
    record.add("z", Assignment("q", "train", 0, "c1"))  # a key no eligible image is named after: not a raw row
    record.add("a2", Assignment("q", "train", 0, "c1"))  # a2 recorded in another component: a touches
    again = touched_components(groups, record, rows.positions_of(eligible), {}, _nearest(set(), set()), raw_version=1)
    assert again.whole == {"a", "e"}  # a2 moved to q, f1 is recorded in f: neither merged now
    assert set(again.grown) == {"b"}


def test_a_class_whose_abstention_changed_walks_all_its_components() -> None:
    prior = PriorWalk(3, frozenset({"2"}), {"a": [{"sha256": "a2", "reason": "near_duplicate"}]})
    members = {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1", "c2"]}
    label = {"a1": "1", "a2": "1", "b1": "2", "c1": "3", "c2": "3"}
    eligible = SortedShas.of(sorted(label))
    builder = GroupsBuilder(eligible)
    for key, shas in members.items():
        builder.add(key, [eligible.index_of(s) for s in shas])
    groups = builder.build()
    class_at = np.array([label[s] for s in eligible])  # by eligible position, as a member is held

    def of_classes(wanted: set[str], block: int = 2) -> set[str]:  # members read two at a time
        return groups.keys_where(lambda members: np.isin(class_at[members], sorted(wanted)), block)

    assert of_classes({"1", "3"}) == of_classes({"1", "3"}, 1) == of_classes({"1", "3"}, 64) == {"a", "c"}
    assert prior.to_walk({"c"}, {"2"}, of_classes) == ["c"]
    assert prior.to_walk({"c"}, set(), of_classes) == ["b", "c"]  # class 2 no longer abstains
    assert prior.to_walk(set(), {"1", "2"}, of_classes) == ["a"]  # class 1 starts abstaining
    assert prior.outcome("a") == [{"sha256": "a2", "reason": "near_duplicate"}]
    merged = PriorWalk(3, frozenset(), {"a": [{"sha256": "a2", "component": "a"}], "f": [{"sha256": "f2", "component": "f"}]})
    assert merged.outcome("a", ("f",)) == [{"sha256": "a2", "component": "a"}, {"sha256": "f2", "component": "a"}]
