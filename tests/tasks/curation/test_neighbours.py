"""The neighbour graph: the stored index finds what the exact search finds, skips what is not eligible, and grows."""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import pytest

from tasks.curation.neighbours import (
    NeighbourGraph,
    ShaIndex,
    _unindexed,
    candidate_pairs,
    index_dir,
    neighbour_graph,
    neighbour_pairs,
    similar_pairs,
)
from tasks.curation.sha_list import Keys, ShaList


def _unit_rows(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    m = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _shas(n: int, prefix: str = "") -> list[str]:
    return [f"{prefix}{i:06d}".rjust(64, "0") for i in range(n)]


def test_index_finds_the_exact_neighbours(tmp_path: Path) -> None:
    m = _unit_rows(2000)
    m[700] = m[3]  # an exact copy and a near one of query rows
    m[901] = (m[9] + 0.02 * m[901]) / np.linalg.norm(m[9] + 0.02 * m[901])
    shas, queries = _shas(2000), list(range(0, 2000, 3))
    exact = neighbour_graph([m], shas, queries, 8, exact_below=10**9, folder=tmp_path, version="v")
    indexed = neighbour_graph([m], shas, queries, 8, exact_below=0, folder=tmp_path, version="v")
    assert exact.search.startswith("exact") and indexed.search.startswith("faiss")
    assert np.array_equal(candidate_pairs(indexed, 8), candidate_pairs(exact, 8))
    assert similar_pairs(indexed, 8, 0.97) == similar_pairs(exact, 8, 0.97)
    assert {(a, b) for a, b, _ in similar_pairs(exact, 8, 0.97)} == {(3, 700), (9, 901)}
    assert not any(i == q for q, row in zip(queries, exact.ids[0].tolist()) for i in row)  # never itself


@pytest.mark.parametrize("exact_below", [0, 10**9])
def test_pairs_found_block_by_block_are_the_whole_graphs_pairs_in_the_same_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_below: int) -> None:
    """What a curation takes (similar pairs of the first view, candidates of every view) without the whole graph."""
    m = _unit_rows(1500, seed=3)
    m[1200:1300] = (m[:100] + 0.05 * m[1200:1300]) / np.linalg.norm(m[:100] + 0.05 * m[1200:1300], axis=1,
                                                                       keepdims=True)  # near copies
    views = [m, np.roll(m, 1, axis=1)]
    shas, queries = _shas(1500), list(range(0, 1500, 2))
    whole = neighbour_graph(views, shas, queries, 12, exact_below=exact_below, folder=tmp_path, version="v")
    monkeypatch.setattr("tasks.curation.neighbours.RANK_BLOCK", 64)  # 12 blocks of queries
    pairs = neighbour_pairs(views, shas, queries, 12, 5, 0.99, exact_below=exact_below, folder=tmp_path,
                            version="v")
    assert pairs.search == whole.search
    assert pairs.similar_list() == similar_pairs(whole, 12, 0.99) and len(pairs.similar) >= 50
    assert pairs.most_similar(7) == heapq.nsmallest(7, pairs.similar_list(), key=lambda t: (-t[2], t[0], t[1]))
    assert np.array_equal(pairs.candidates, candidate_pairs(whole, 5))
    empty = neighbour_pairs(views, shas, [], 12, 5, 0.99, exact_below=exact_below, folder=tmp_path, version="v")
    assert empty.similar_list() == [] == empty.most_similar(3) and empty.candidates.shape == (0, 2)


def test_index_skips_images_that_are_not_eligible_now(tmp_path: Path) -> None:
    m = _unit_rows(600, seed=1)
    shas = _shas(600)
    neighbour_graph([m], shas, [0], 5, exact_below=0, folder=tmp_path, version="v")  # indexes all 600
    keep = [i for i in range(600) if i % 2 == 0]
    graph = neighbour_graph([m[keep]], [shas[i] for i in keep], [0], 5, exact_below=0, folder=tmp_path, version="v")
    exact = neighbour_graph([m[keep]], [shas[i] for i in keep], [0], 5, exact_below=10**9, folder=tmp_path,
                            version="v")
    assert graph.ids[0].tolist() == exact.ids[0].tolist()


def test_the_images_an_index_lacks_are_those_no_row_of_its_list_is_at(monkeypatch) -> None:
    listed = _shas(40)[::3] + _shas(50, prefix="gone")[:5]  # some eligible images, and rows not eligible now
    eligible = Keys.of(_shas(40))
    at = ShaList.of(listed).located(eligible, np.int32)
    assert at.dtype == np.int32
    expected = np.flatnonzero(ShaList.of(listed).rows_of(eligible) < 0)
    monkeypatch.setattr("tasks.curation.neighbours.ROW_FLAGS", 4)  # several blocks of rows
    assert _unindexed(at, len(eligible)).tolist() == expected.tolist() == [i for i in range(40) if i % 3]


def test_index_is_stored_once_per_version_and_extended(tmp_path: Path) -> None:
    m = _unit_rows(300, seed=2)
    shas = _shas(300)
    neighbour_graph([m[:200]], shas[:200], [0], 4, exact_below=0, folder=tmp_path, version="v1")
    assert ShaIndex.open(tmp_path, "v1;view=0", 64).index.ntotal == 200
    neighbour_graph([m], shas, [250], 4, exact_below=0, folder=tmp_path, version="v1")
    reopened = ShaIndex.open(tmp_path, "v1;view=0", 64)
    assert reopened.index.ntotal == 300 and reopened.shas.array.tolist() == [s.encode() for s in sorted(shas)]
    assert ShaIndex.open(tmp_path, "v2;view=0", 64).index.ntotal == 0  # another embedding version: its own index


def test_a_stored_index_is_opened_mapped_searches_as_read_whole_and_is_read_whole_to_grow(tmp_path: Path) -> None:
    import faiss

    m = _unit_rows(500, seed=3)
    shas = _shas(500)
    neighbour_graph([m[:400]], shas[:400], [0], 4, exact_below=0, folder=tmp_path, version="v")
    index = ShaIndex.open(tmp_path, "v;view=0", 64)
    whole = faiss.read_index(str(index.path))
    assert index.mapped and index.index.ntotal == whole.ntotal == 400
    whole.hnsw.efSearch = index.index.hnsw.efSearch = 64
    assert all(np.array_equal(a, b) for a, b in zip(index.index.search(m[400:], 9), whole.search(m[400:], 9)))
    index.extend(shas, m, Keys.of(shas))  # a fold: the mapped file's pages cannot grow
    assert not index.mapped and ShaIndex.open(tmp_path, "v;view=0", 64).index.ntotal == 500


def test_a_small_batch_is_searched_exactly_beside_the_index_which_it_neither_grows_nor_rewrites(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eligible rows the index lacks (a batch's) are its delta, searched exactly; ranked with the index's hits
    they give the exact neighbours. The index takes them in once they are more than FOLD_SHARE of it."""
    m = _unit_rows(2200, seed=4)
    m[2100:2150] = (m[:50] + 0.03 * m[2100:2150]) / np.linalg.norm(m[:50] + 0.03 * m[2100:2150], axis=1,
                                                                   keepdims=True)  # the batch copies the table
    m[2180] = m[2170]  # and itself
    shas = _shas(2200)
    neighbour_graph([m[:2000]], shas[:2000], [0], 8, exact_below=0, folder=tmp_path, version="v")
    stored = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr("tasks.curation.neighbours.DELTA_SCRATCH", 3000)  # 15 queries a block against 200 rows
    batch = list(range(2000, 2200))  # 10% of the index: searched beside it
    indexed = neighbour_graph([m], shas, batch + [3, 1999], 8, exact_below=0, folder=tmp_path, version="v")
    exact = neighbour_graph([m], shas, batch + [3, 1999], 8, exact_below=10**9, folder=tmp_path, version="v")
    for got, want in zip(indexed.ids[0].tolist(), exact.ids[0].tolist()):  # the delta's part is exact
        assert {p for p in want if p >= 2000} <= set(got)
    assert np.mean(indexed.ids[0] == exact.ids[0]) > 0.95  # the index's part: HNSW's recall on random rows
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == stored  # not grown, not rewritten
    assert similar_pairs(indexed, 8, 0.99) == similar_pairs(exact, 8, 0.99)
    assert {(a, b) for a, b, _ in similar_pairs(exact, 8, 0.999)} >= {(2170, 2180)}
    assert ShaIndex.open(tmp_path, "v;view=0", 64).index.ntotal == 2000  # 200 rows: not more than 10% of 2,000
    more = np.vstack([m, _unit_rows(1, seed=5)])
    neighbour_graph([more], shas + _shas(1, "f"), [0], 8, exact_below=0, folder=tmp_path, version="v")
    assert ShaIndex.open(tmp_path, "v;view=0", 64).index.ntotal == 2201  # 201: folded in, stored


def test_a_local_lake_keeps_the_index_next_to_its_tables(tmp_path: Path) -> None:
    assert index_dir(str(tmp_path / "lake"), tmp_path / "env" / "reports") == tmp_path / "lake" / "curation_index"
    assert index_dir("s3://bucket/lake", tmp_path / "env" / "reports") == tmp_path / "env" / "curation_index"


def test_hits_are_ranked_in_numpy_as_one_by_one_nearest_first_ties_by_position_without_self_or_ineligible() -> None:
    """The index's hits become each query's k eligible neighbours in blocks of arrays; the same as ranking them
    one query at a time (cosines rounded so ties are common, missing hits (-1), rows no longer eligible)."""
    from tasks.curation.neighbours import _ranked
    from tasks.curation.sha_list import ShaList

    rng = np.random.default_rng(7)
    indexed = _shas(300)
    eligible = [s for i, s in enumerate(indexed) if i % 7]  # every seventh indexed row is not eligible now
    at = ShaList.of(indexed).located(Keys.of(eligible)).astype(np.int32)
    q = rng.choice(len(eligible), size=200, replace=False).astype(np.int64)
    ids = np.stack([rng.choice(len(indexed), size=12, replace=False) for _ in q])
    ids[:20, 0] = [indexed.index(eligible[p]) for p in q[:20]]  # some queries find themselves
    ids[rng.random(ids.shape) < 0.1] = -1  # and some hits are missing
    sims = np.round(rng.random(ids.shape), 1).astype(np.float32)
    for k in (1, 5, 12):
        got_ids, got_sims = _ranked(at, q, ids, sims, k)
        pos = {sha: i for i, sha in enumerate(eligible)}
        for r, self_pos in enumerate(q.tolist()):
            hits = sorted((-float(s), p) for i, s in zip(ids[r].tolist(), sims[r].tolist()) if i >= 0
                          for p in [pos.get(indexed[i], -1)] if p >= 0 and p != self_pos)[:k]
            want = [p for _, p in hits] + [-1] * (k - len(hits))
            assert got_ids[r].tolist() == want
            assert got_sims[r].tolist() == [-s for s, _ in hits] + [-np.inf] * (k - len(hits))


def _similar_pairs_one_by_one(graph: NeighbourGraph, k: int, threshold: float) -> list[tuple[int, int, float]]:
    """The pair-by-pair reading ``similar_pairs`` replaced (it held every neighbour as a Python object)."""
    seen: dict[tuple[int, int], float] = {}
    for a, row, sims in zip(graph.queries.tolist(), graph.ids[0][:, :k].tolist(), graph.sims[0][:, :k].tolist()):
        for b, s in zip(row, sims):
            if b >= 0 and s >= threshold:
                seen.setdefault((min(a, b), max(a, b)), s)
    return [(a, b, s) for (a, b), s in seen.items()]


def test_similar_pairs_in_arrays_are_the_pairs_found_one_by_one_in_the_same_order():
    """Missing hits, a pair found from both sides (with the first cosine kept), repeats in a row, and cosines one
    float32 step either side of the threshold, compared as Python floats are."""
    rng = np.random.default_rng(0)
    steps = np.float32([np.nextafter(np.float32(0.97), np.float32(0)), 0.97, np.nextafter(np.float32(0.97), np.float32(1)),
                        0.5, 0.99, 1.0, -np.inf])
    for _ in range(200):
        n = int(rng.integers(2, 60))
        queries = rng.choice(n, int(rng.integers(0, n + 1)), replace=False).astype(np.int64)
        width = int(rng.integers(1, 10))
        ids = rng.integers(-1, n, (len(queries), width)).astype(np.int64)
        graph = NeighbourGraph(queries, [ids], [rng.choice(steps, ids.shape).astype(np.float32)], "test")
        for k, threshold in ((1, 0.97), (width, 0.97), (width + 3, 0.5), (width, 0.99)):
            assert similar_pairs(graph, k, threshold) == _similar_pairs_one_by_one(graph, k, threshold)


@pytest.mark.parametrize("scratch", [1, 40, 1 << 24])
def test_the_delta_gives_each_query_its_exact_nearest_delta_rows_never_itself(
        monkeypatch: pytest.MonkeyPatch, scratch: int) -> None:
    from tasks.curation.neighbours import _Delta

    monkeypatch.setattr("tasks.curation.neighbours.DELTA_SCRATCH", scratch)  # one query a block, a few, all
    m = np.round(_unit_rows(60, dim=8, seed=6), 1)  # rounded: equal cosines are common
    delta = _Delta(m, np.arange(30, 60))
    queries = np.array([0, 31, 59, 5, 45])
    for k in (1, 4, 29, 35):  # 35: more than the delta holds (29 others for a query in it)
        ids, sims = delta.nearest(m[queries], queries, k)
        assert ids.shape == (len(queries), min(k, 30))
        for row, q in enumerate(queries.tolist()):
            want = sorted(float(m[q] @ m[p]) for p in range(30, 60) if p != q)[::-1][:k]
            got = [(p, s) for p, s in zip(ids[row].tolist(), sims[row].tolist()) if p >= 0]
            assert q not in [p for p, _ in got] and len(got) == len(want)
            np.testing.assert_allclose(sorted((s for _, s in got), reverse=True), want, atol=1e-6)
            np.testing.assert_allclose([s for _, s in got], [float(m[q] @ m[p]) for p, _ in got], atol=1e-6)
    assert _Delta(m, np.arange(0)).nearest(m[queries], queries, 5)[0].shape == (5, 0)


@pytest.mark.parametrize("exact_below", [0, 10**9])
def test_a_pair_exactly_at_the_threshold_is_similar_though_only_cosines_near_it_are_computed(
        tmp_path: Path, exact_below: int) -> None:
    """The exact cosine decides; the search's float32 cosine only picks the cells computed (within COSINE_MARGIN)."""
    m = _unit_rows(800, seed=5)
    m[700:750] = (m[:50] + 0.2 * m[700:750]) / np.linalg.norm(m[:50] + 0.2 * m[700:750], axis=1, keepdims=True)
    views, shas, queries = [m], _shas(800), list(range(700, 750))
    whole = neighbour_graph(views, shas, queries, 8, exact_below=exact_below, folder=tmp_path, version="v")
    threshold = float(np.sort(whole.sims[0][whole.sims[0] > 0.9])[10])  # a pair's exact cosine, rounded to float32
    pairs = neighbour_pairs(views, shas, queries, 8, 8, threshold, exact_below=exact_below, folder=tmp_path,
                            version="v")
    assert pairs.similar_list() == similar_pairs(whole, 8, threshold)
    assert 0 < len(pairs.similar) < len(queries)  # the threshold cuts through the copies' cosines
