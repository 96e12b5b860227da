"""What a curation keeps, by position (``KeptFacts``): the same rows and counts as a table of every kept row."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from tasks.curation.assignments import Assignment, RecordAfter
from tasks.curation.kept_facts import KEPT_FACTS_SCHEMA, KeptFacts
from tasks.curation.report import count_by_split
from tasks.curation.sha_list import Keys, SortedShas
from tasks.curation.tables import SPLITS, RawFacts, RawRows


def _sha(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


@pytest.fixture()
def plan_like():
    """A raw version of 60 images in 3 classes, 50 eligible (10 bad ones), 7 of those dropped, and their splits."""
    raw = RawRows.of(RawFacts(_sha(i), f"class{i % 3}", 8 + i % 5, 9 + i % 4) for i in range(60))
    eligible = [s for k, s in enumerate(raw.shas) if k % 6]  # sorted, as the screen leaves them
    dropped = set(eligible[::7]) | {raw.shas[0], raw.shas[6]}  # two bad images (not eligible) are dropped too
    splits = {s: Assignment(s, SPLITS[k % 3], 1, "r") for k, s in enumerate(eligible)}
    return raw, eligible, dropped, splits


def _kept(raw: RawRows, eligible: list[str], dropped: set[str], splits: dict, scratch=None) -> KeptFacts:
    """``KeptFacts.of`` given what the plan gives it: each eligible image's raw position and split code (their
    arrays mapped from ``scratch`` when given)."""
    keys = SortedShas.of(eligible)
    at = raw.positions_of(keys)
    return KeptFacts.of(Keys.of(keys), at, dropped, raw, RecordAfter({}, splits).split_codes(keys, at, scratch), scratch)


def _expected(raw: RawRows, eligible: list[str], dropped: set[str], splits: dict) -> pa.Table:
    kept = [s for s in eligible if s not in dropped]
    return pa.Table.from_pylist([{"sha256": s, "label": raw[s].label, "split": splits[s].split, "width": raw[s].width,
                                  "height": raw[s].height} for s in kept], schema=KEPT_FACTS_SCHEMA)


@pytest.mark.parametrize("mapped", [False, True])
def test_kept_rows_and_counts_are_those_of_a_table_of_every_kept_row(plan_like, tmp_path, monkeypatch, mapped) -> None:
    from tasks.curation import kept_facts

    monkeypatch.setattr(kept_facts, "BLOCK_ROWS", 4)  # taken and counted a few blocks at a time
    raw, eligible, dropped, splits = plan_like
    facts = _kept(raw, eligible, dropped, splits, tmp_path / "scratch" if mapped else None)
    expected = _expected(raw, eligible, dropped, splits)
    assert facts.num_rows == expected.num_rows == len(eligible) - len(set(eligible[::7]))
    assert facts.table().equals(expected)
    assert pa.concat_tables(facts.blocks(5)).equals(expected)
    assert facts.table(slice(3, 9)).equals(expected.slice(3, 6))
    assert facts.table(np.array([4, 0, 2])).equals(expected.take([4, 0, 2]))
    assert facts.counts() == count_by_split(expected)
    assert list(facts.shas()) == expected.column("sha256").to_pylist()
    assert facts.sha_column().equals(expected.column("sha256").combine_chunks())


def test_find_gives_each_kept_image_its_index_and_minus_one_otherwise(plan_like) -> None:
    raw, eligible, dropped, splits = plan_like
    facts = _kept(raw, eligible, dropped, splits)
    kept = facts.shas()
    asked = [kept[3], sorted(dropped)[0], "not a sha256", raw.shas[0], kept[0], kept[-1], _sha(1000)]
    assert facts.find(pa.array(asked)).tolist() == [3, -1, -1, -1, 0, len(kept) - 1, -1]
    subset = facts.subset(np.arange(facts.num_rows) % 2 == 1)
    assert list(subset.shas()) == kept[1::2]
    assert subset.table().equals(facts.table(np.arange(1, facts.num_rows, 2)))


def test_keys_that_are_not_sha256s_make_the_same_strings() -> None:
    table = pa.Table.from_pylist([{"sha256": s, "label": "x", "split": "val", "width": 1, "height": 2}
                                  for s in ["a", "bb", "c" * 70]], schema=KEPT_FACTS_SCHEMA)
    facts = KeptFacts.of_table(table)
    assert facts.table().equals(table)
    assert facts.counts() == count_by_split(table)


def test_unsorted_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="sorted"):
        KeptFacts(Keys.of(["b", "a"]), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                  RawRows.of([]), np.zeros(0, dtype=np.int8))
