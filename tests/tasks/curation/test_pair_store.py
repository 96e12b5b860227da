"""Stored copy scores read by key (issue 25): a batch reads the pairs of the images it asks for, from a real Delta
table, complete for those images, each pair once, and no pair of an image not eligible or of another score config."""

from __future__ import annotations

import random

import pytest

import tasks.curation.copy_pairs as copy_pairs
from tasks.curation import pair_store
from tasks.curation.copy_pairs import CopyScores, FreshPairs, score_config, store_scores
from tasks.curation.pair_store import StoredScores


@pytest.fixture
def table(tmp_path, monkeypatch) -> tuple[str, list[str], dict[tuple[str, str], float]]:
    """A pairs table of 3,000 pairs among 300 images (in several commits and row groups), 200 under an old config."""
    rng = random.Random(7)
    shas = sorted(f"{rng.getrandbits(128):032x}" for _ in range(300))
    pairs = list({CopyScores.key(*rng.sample(shas, 2)) for _ in range(3000)})
    scores = {p: rng.random() for p in pairs}
    uri = str(tmp_path / "curation_pairs")
    monkeypatch.setattr(copy_pairs, "STORE_BLOCK", 256)
    for start in range(0, len(pairs), 1000):
        fresh = FreshPairs()
        fresh.add(pairs[start:start + 1000], [scores[p] for p in pairs[start:start + 1000]])
        store_scores(uri, fresh, f"run-{start}", {"run_id": f"run-{start}"})
    old = FreshPairs()
    old.add(pairs[:200], [0.5] * 200)
    monkeypatch.setattr(copy_pairs, "score_config", lambda: "old-score;grid=1")
    store_scores(uri, old, "run-old", {"run_id": "run-old"})
    monkeypatch.undo()
    return uri, shas, scores


def _expected(sha: str, eligible: set[str], scores: dict[tuple[str, str], float]) -> dict[str, float]:
    return {b if a == sha else a: v for (a, b), v in scores.items() if sha in (a, b) and a in eligible and b in eligible}


@pytest.mark.parametrize(("scan_rows", "code_rows"), [(None, None), (64, 5), (64, 1_000)])
def test_the_images_asked_for_get_all_their_eligible_partners_from_one_scan(table, monkeypatch, scan_rows, code_rows
                                                                            ) -> None:
    if scan_rows is not None:  # blocks of the table's rows, and the narrowed rows coded a few at a time or many
        monkeypatch.setattr(pair_store, "SCAN_ROWS", scan_rows)
        monkeypatch.setattr(pair_store, "CODE_ROWS", code_rows)
    uri, shas, scores = table
    eligible = shas[::2] + shas[1::4]  # some images are not eligible: their pairs are not read
    eligible.sort()
    stored = StoredScores(uri, score_config(), eligible)
    asked = eligible[:40]
    stored.want(asked)
    assert stored.scans == 1
    touching = {p for p in scores if (p[0] in asked or p[1] in asked) and set(p) <= set(eligible)}
    assert stored.count == len(touching) < len([p for p in scores if set(p) <= set(eligible)])
    for sha in asked:
        assert stored.partners(sha) == _expected(sha, set(eligible), scores)
    assert stored.scans == 1  # all answered from what was read

    stored.want(asked[:10] + eligible[30:80])  # overlapping: only the images not read yet, each pair once
    assert stored.scans == 2
    touching |= {p for p in scores if (p[0] in eligible[30:80] or p[1] in eligible[30:80]) and set(p) <= set(eligible)}
    assert stored.count == len(touching)
    stored.want(eligible[50:60])  # all read: no scan
    assert stored.scans == 2


def test_an_image_not_asked_for_is_read_alone_and_answers_in_full(table) -> None:
    uri, shas, scores = table
    stored = StoredScores(uri, score_config(), shas)
    stored.want(shas[:5])
    late = shas[200]
    assert stored.partners(late) == _expected(late, set(shas), scores)
    assert stored.scans == 2
    assert stored.partners("f" * 40) == {}  # not eligible: nothing, no scan
    assert stored.scans == 2


def test_all_eligible_pairs_once_and_none_of_another_config(table) -> None:
    uri, shas, scores = table
    stored = StoredScores(uri, score_config(), shas)
    stored.want(shas[:7])
    stored.want_all()
    assert stored.count == len(scores)  # the 200 old-config rows are not taken for this config's
    for sha in shas[::17]:
        assert stored.partners(sha) == _expected(sha, set(shas), scores)
    assert stored.scans == 2


def test_no_table_reads_nothing_and_the_eligible_must_be_sorted(tmp_path) -> None:
    stored = StoredScores(str(tmp_path / "missing"), score_config(), ["a", "b"])
    stored.want(["a", "b"])
    assert stored.partners("a") == {} and stored.scans == 0
    with pytest.raises(ValueError):
        StoredScores(None, score_config(), ["b", "a"])


def test_released_pairs_are_read_again_when_asked_and_answer_the_same(table) -> None:
    uri, shas, scores = table
    stored = StoredScores(uri, score_config(), shas)
    scored = CopyScores(lambda sha: b"", stored)
    scored.fresh.add([(shas[0], shas[-1])], [0.25])  # a pair scored here stays through a release
    scored.want(shas[:30])
    before = {sha: scored.partners(sha) for sha in shas[:30]}
    assert stored.scans == 1 and stored._parts
    scored.forget_partners()  # the gathered partners go, the pairs stay: the same answers, no scan
    assert {sha: scored.partners(sha) for sha in shas[:30]} == before and stored.scans == 1
    scored.release_stored()
    assert not stored._parts and not stored._read.any() and stored.scans == 1
    assert scored.partners(shas[0])[shas[-1]] == 0.25
    assert stored.scans == 2  # read again: alone, as an image not asked for
    scored.want(shas[:30])
    assert {sha: scored.partners(sha) for sha in shas[:30]} == before
    assert stored.scans == 3


def test_a_single_pair_is_scored_as_the_partners_would_answer_without_gathering_them(table) -> None:
    uri, shas, scores = table
    eligible = sorted(shas[::2] + shas[1::4])
    stored = StoredScores(uri, score_config(), eligible)
    stored.want(eligible[:30])
    rng = random.Random(3)
    asked = [(a, b) for a, b in scores][:300] + [tuple(rng.sample(shas, 2)) for _ in range(300)]
    for a, b in asked:  # read alone when not asked for; none for a pair with an image not eligible
        assert stored.score(a, b) == stored.partners(a).get(b) == _expected(a, set(eligible), scores).get(b)
    assert stored.score("f" * 32, eligible[0]) is None and stored.score(eligible[0], "f" * 32) is None

    copies = CopyScores(lambda sha: b"", StoredScores(uri, score_config(), eligible))
    fresh_pair = CopyScores.key(*[p for p in scores if set(p) <= set(eligible)][0])
    copies.fresh.add([fresh_pair], [2.0])  # a score computed here answers over the stored one
    for a, b in [fresh_pair, fresh_pair[::-1], *asked[:100]]:
        got = copies.get(a, b)
        assert got == copies.partners(a).get(b)
        copies.forget_partners()
        assert copies.get(a, b) == got
    assert copies.get(*fresh_pair) == 2.0 and not copies._partners
