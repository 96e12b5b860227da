"""Copy scores stored a block at a time (issue 25): the rows a real Delta table gets, once each, whatever the retries."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

import tasks.curation.copy_pairs as copy_pairs
from tasks.curation.copy_pairs import PAIRS_SCHEMA, CopyScores, FreshPairs, score_config, store_scores
from tasks.data import lake


def _fresh(n_images: int, n_pairs: int, seed: int, block: int = 37) -> tuple[FreshPairs, dict[tuple[str, str], float]]:
    rng = random.Random(seed)
    shas = [f"{rng.getrandbits(128):032x}" for _ in range(n_images)]
    pairs = list({CopyScores.key(*rng.sample(shas, 2)) for _ in range(n_pairs)})
    rng.shuffle(pairs)  # added in no particular order, as the scoring adds them
    scores = {p: rng.random() for p in pairs}
    fresh = FreshPairs()
    for start in range(0, len(pairs), block):
        fresh.add(pairs[start:start + block], [scores[p] for p in pairs[start:start + block]])
    return fresh, scores


def _stored(uri: str) -> list[tuple[str, str, str, float]]:
    t = lake.read(uri, lake.current_version(uri))
    return list(zip(t.column("sha256_a").to_pylist(), t.column("sha256_b").to_pylist(),
                    t.column("config").to_pylist(), t.column("score").to_pylist()))


def test_blocks_are_the_sorted_rows_a_block_at_a_time() -> None:
    fresh, scores = _fresh(80, 900, seed=3)
    blocks = list(fresh.blocks("run-1", block_rows=50))
    assert [b.num_rows for b in blocks[:-1]] == [50] * (len(blocks) - 1) and len(blocks) > 10
    rows = pa.Table.from_batches(blocks, PAIRS_SCHEMA)
    reference = pa.table({"sha256_a": [a for a, _ in scores], "sha256_b": [b for _, b in scores],
                          "config": [score_config()] * len(scores), "score": list(scores.values()),
                          "run_id": ["run-1"] * len(scores)}, schema=PAIRS_SCHEMA)
    assert rows.equals(reference.sort_by([("sha256_a", "ascending"), ("sha256_b", "ascending")]))
    keep = fresh.blocks("run-1", keep=np.arange(fresh.count) % 3 == 0, block_rows=50)
    kept = pa.Table.from_batches(list(keep), PAIRS_SCHEMA)
    assert kept.num_rows == len(range(0, fresh.count, 3))
    assert set(zip(kept.column("sha256_a").to_pylist(), kept.column("sha256_b").to_pylist())) == \
        {p for i, p in enumerate(scores) if i % 3 == 0}


def test_store_creates_adds_only_what_is_missing_and_a_rerun_commits_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(copy_pairs, "STORE_BLOCK", 64)  # many blocks, several row groups
    uri = str(tmp_path / "curation_pairs")
    fresh, scores = _fresh(120, 1500, seed=4)
    first = FreshPairs()
    some = list(scores)[:400]
    first.add(some, [scores[p] for p in some])
    v0 = store_scores(uri, first, "run-0", {"run_id": "run-0"})
    assert v0 == lake.current_version(uri) and len(_stored(uri)) == 400

    v1 = store_scores(uri, fresh, "run-1", {"run_id": "run-1"})  # 400 of its pairs are there already
    rows = _stored(uri)
    assert v1 == v0 + 1 and len(rows) == len(scores)
    assert sorted((a, b) for a, b, _, _ in rows) == sorted(scores)  # each pair once
    assert {(a, b): v for a, b, _, v in rows} == scores

    assert store_scores(uri, fresh, "run-1", {"run_id": "run-1"}) is None  # a re-run: nothing new, no commit
    assert lake.current_version(uri) == v1
    assert store_scores(uri, FreshPairs(), "run-2", {"run_id": "run-2"}) is None


def test_a_pair_stored_under_another_score_config_is_not_taken_for_this_one(tmp_path, monkeypatch) -> None:
    uri = str(tmp_path / "curation_pairs")
    fresh, scores = _fresh(30, 100, seed=5)
    monkeypatch.setattr(copy_pairs, "score_config", lambda: "old-score;grid=1")
    store_scores(uri, fresh, "run-0", {"run_id": "run-0"})
    monkeypatch.undo()
    store_scores(uri, fresh, "run-1", {"run_id": "run-1"})
    configs = [c for _, _, c, _ in _stored(uri)]
    assert configs.count("old-score;grid=1") == len(scores) and configs.count(score_config()) == len(scores)


def test_a_lost_race_reads_again_and_stores_each_pair_once(tmp_path, monkeypatch) -> None:
    uri = str(tmp_path / "curation_pairs")
    fresh, scores = _fresh(60, 600, seed=6)
    rival = FreshPairs()
    theirs = list(scores)[1::2]  # not the one pair stored first
    rival.add(theirs, [scores[p] for p in theirs])
    start = FreshPairs()
    start.add(list(scores)[:1], [scores[list(scores)[0]]])
    store_scores(uri, start, "run-0", {"run_id": "run-0"})  # the table exists: the race is against an append

    real_append, calls = lake.append_stream, []

    def racing_append(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # a concurrent curation commits between our read and our commit
            real_append(uri, pa.RecordBatchReader.from_batches(PAIRS_SCHEMA, rival.blocks("rival")),
                        {"run_id": "rival"}, lake.open_table(uri), lake.stats_columns_config(PAIRS_SCHEMA))
        return real_append(*args, **kwargs)

    monkeypatch.setattr(lake, "append_stream", racing_append)
    monkeypatch.setattr(lake.time, "sleep", lambda _s: None)
    store_scores(uri, fresh, "run-1", {"run_id": "run-1"})
    rows = _stored(uri)
    assert len(calls) == 2  # refused once, planned again
    assert sorted((a, b) for a, b, _, _ in rows) == sorted(scores)


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_sets_store(tmp_path, n) -> None:
    uri = str(tmp_path / "curation_pairs")
    fresh, scores = _fresh(3, n, seed=n)
    store_scores(uri, fresh, "r", {"run_id": "r"})
    assert sorted((a, b) for a, b, _, _ in _stored(uri)) == sorted(scores)
