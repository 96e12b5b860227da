"""The neighbour graph: each new image's nearest eligible images, the one source of grouping and copy candidates.

Every new image (eligible, not in the assignment record) gets its ``k`` nearest eligible images by
the cosine of each view of the embedding (the embedding itself and, for pixels, the blurred one:
``tasks.curation.copy_pairs.blurred``), nearest first, ties by position. From that one graph:

* grouping (``link_neighbours``): a query joins each of its ``curation.similar_neighbours`` nearest
  images of the first view whose cosine reaches ``near_duplicate_threshold``;
* copy candidates (``candidate_pairs``): a query and each of its ``curation.copy_candidates``
  nearest images in every view get a copy score (``tasks.curation.copy_pairs``).

How the neighbours are found (the decisions above do not depend on it, only the recall does):

* below ``curation.exact_search_below`` eligible images, an exact blocked cosine product in numpy
  (milliseconds to seconds: cheaper than any index at that size);
* from there on, a faiss HNSW index of inner products (``IndexHNSWFlat``, unit rows: inner product
  = cosine) per embedding version and view, kept in ``curation_index/`` next to the curated tables
  (the home's lake folder; a remote lake keeps it in the environment's local folder). It is built
  once from every eligible image; its ids are the row of a sha256 in a sidecar list. The eligible
  images it lacks (a batch's) are its delta, searched exactly and ranked with the index's hits; the
  index takes the delta in (extended, stored) once it is more than ``FOLD_SHARE`` (10%) of its rows,
  so a 1% batch reads the index but neither grows nor rewrites it (each did both before: at a million
  images a copy of its vectors resident beside them and 0.5 GB written, a view). Images in the index that
  are not eligible in this raw version (bad images, images no longer in it) are skipped: the search asks
  for ``SEARCH_SLACK`` more neighbours than it needs. Additions run on one thread and in sha256 order,
  and a delta is folded at the same counts, so the same history of batches builds the same index; a
  search is deterministic for a given index and delta.

The vectors are not held in memory: each view is read by position from its memory-mapped file
(``tasks.curation.vectors``), only the rows a search adds, queries and compares.

Why faiss (docs/curation.md, "Nearest neighbours"): MIT licence, Meta's maintained library with
wheels for CPython 3.11 on x86_64 (abi3), exact and approximate indexes behind one API, incremental
``add``, indexes read and written as one file (and memory-mappable read-only).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from tasks.curation.sha_list import Keys, ShaList

log = logging.getLogger(__name__)

SEARCH_BLOCK = 1024  # query rows per exact matrix product: bounds memory at BLOCK x N floats
RANK_BLOCK = 65_536  # query rows searched and ranked at a time (a few arrays of BLOCK x hits, not of every query)
SEARCH_SLACK = 16  # neighbours asked beyond k: room for indexed images that are not eligible now
FOLD_SHARE = 0.10  # the index takes in the eligible rows it lacks once they are more than this share of its rows
DELTA_SCRATCH = 1 << 22  # floats of query x delta cosines computed at a time (16 MB, and 32 MB of their ranks)
HNSW_M = 32  # graph degree of the HNSW index
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128  # at least; raised to twice the neighbours asked
INDEX_FOLDER = "curation_index"
# A search's float32 cosine of unit rows of a few hundred dimensions is within about 1e-5 of the float64 one: the
# exact cosine of a neighbour is computed where the search's comes within this of a threshold (the rest cannot reach it).
COSINE_MARGIN = 1e-3
CELL_BLOCK = 8192  # (query, neighbour) cells whose exact cosine is computed at a time
ROW_FLAGS = 1 << 18  # index rows whose eligible positions are flagged at a time


@dataclass(frozen=True)
class NeighbourGraph:
    """Per view, for each query (a row of ``queries``), its nearest eligible images: ``ids`` -1 where none."""

    queries: np.ndarray  # int64 eligible positions, one row each
    ids: list[np.ndarray]  # per view: (len(queries), k) int32 eligible positions, nearest first (half of int64's memory)
    sims: list[np.ndarray]  # per view: (len(queries), k) float32 cosines
    search: str  # how they were found, for the report


def index_dir(lake_uri: str, reports_path: Path) -> Path:
    """Where the indexes live: the lake's own folder when it is local, else the environment's local folder."""
    parsed = urlparse(lake_uri)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else lake_uri) / INDEX_FOLDER
    return reports_path.parent / INDEX_FOLDER


def neighbour_graph(views: Sequence[Any], eligible: Sequence[str], queries: Sequence[int], k: int,
                    exact_below: int, folder: Path, version: str, asked: Keys | None = None) -> NeighbourGraph:
    """The ``k`` nearest eligible images of each query in every view (unit rows, one per eligible image), whole.

    A view is an array or a ``tasks.curation.vectors.RowView`` (rows gathered by position from a
    memory-mapped file): the index search reads only the rows it adds, queries and compares. ``asked``: the
    eligible images' ``Keys`` when the caller has them (else built here).
    """
    q, kk = np.asarray(queries, dtype=np.int64), _width(len(eligible), k)
    if not len(q) or kk <= 0:
        empty = np.zeros((len(q), 0), dtype=np.int32)
        return NeighbourGraph(q, [empty for _ in views], [empty.astype(np.float32) for _ in views], "none")
    where = _Where(eligible, asked, exact_below, folder, version)
    ids = [np.concatenate([found for _, found, _ in _searched(v, i, q, kk, where)]) for i, v in enumerate(views)]
    return NeighbourGraph(q, ids, [_cosines(v, q, i) for v, i in zip(views, ids)],
                          _search_name(len(eligible), exact_below))


@dataclass(frozen=True)
class NeighbourPairs:
    """What a curation takes from the neighbour graph: ``similar_pairs`` of the first view, ``candidate_pairs``.

    In arrays: the similar pairs as a Python list set the million's high-water mark (5.5 GiB, run 15).
    """

    similar: np.ndarray  # (n, 2) int64 eligible positions i < j: ``similar_pairs``, each once, in the order found
    similar_cos: np.ndarray  # their float32 cosines
    candidates: np.ndarray  # (n, 2) int64 eligible positions, i < j, sorted and unique
    search: str

    def similar_list(self) -> list[tuple[int, int, float]]:
        """``similar_pairs``' list: (i, j, cosine)."""
        return list(zip(self.similar[:, 0].tolist(), self.similar[:, 1].tolist(), self.similar_cos.tolist()))

    def most_similar(self, n: int) -> list[tuple[int, int, float]]:
        """The ``n`` similar pairs of highest cosine, ties by positions: (i, j, cosine)."""
        top = np.lexsort((self.similar[:, 1], self.similar[:, 0], -self.similar_cos))[:n]
        return list(zip(self.similar[top, 0].tolist(), self.similar[top, 1].tolist(), self.similar_cos[top].tolist()))


def neighbour_pairs(views: Sequence[Any], eligible: Sequence[str], queries: Sequence[int], similar_k: int,
                    copy_k: int, threshold: float, exact_below: int, folder: Path, version: str,
                    asked: Keys | None = None) -> NeighbourPairs:
    """``similar_pairs(graph, similar_k, threshold)`` and ``candidate_pairs(graph, copy_k)`` of the graph of
    ``k = max(similar_k, copy_k)`` neighbours, the same pairs in the same order, found a block of queries at a time.

    The graph is never whole (at a million images, its ids and cosines in two views held 0.5 GB), and only the
    first view's cosines are computed (the only ones a decision reads). ``asked`` as in ``neighbour_graph``.
    """
    q, kk = np.asarray(queries, dtype=np.int64), _width(len(eligible), max(similar_k, copy_k))
    if not len(q) or kk <= 0:
        none = np.zeros((0, 2), dtype=np.int64)
        return NeighbourPairs(none, np.zeros(0, dtype=np.float32), none, "none")
    edges, codes = [], []
    where = _Where(eligible, asked, exact_below, folder, version)
    for i, view in enumerate(views):
        for rows, ids, sims in _searched(view, i, q, kk, where):
            if i == 0:  # exact cosines only where the search's float32 ones come near the threshold
                near = sims[:, :similar_k] >= threshold - COSINE_MARGIN
                edges.append(_similar_edges(rows, ids, _cosines(view, rows, ids, near), similar_k, threshold))
            codes.append(_candidate_codes(rows, ids, copy_k, len(eligible)))
    lo, hi, cos = (np.concatenate(parts) for parts in zip(*edges)) if edges else (np.zeros(0, np.int64),) * 3
    unique = np.unique(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)
    first = _first_found(lo, hi)
    return NeighbourPairs(np.stack([lo[first], hi[first]], axis=1), cos[first].astype(np.float32),
                          _decoded(unique, len(eligible)), _search_name(len(eligible), exact_below))


def _width(n: int, k: int) -> int:
    """Neighbours a query can have among ``n`` eligible images (itself excluded)."""
    return min(k, n - 1) if n > 1 else 0


def _search_name(n: int, exact_below: int) -> str:
    if n < exact_below:
        return f"exact cosine (numpy), {n} eligible images < exact_search_below {exact_below}"
    return (f"faiss HNSW (M={HNSW_M}, efConstruction={HNSW_EF_CONSTRUCTION}, efSearch>={HNSW_EF_SEARCH}), "
            f"{n} eligible images >= exact_search_below {exact_below}")


class _Where:
    """Where a search looks: the eligible images (their ``Keys`` built once, on the first index search), the exact
    search's bound, the index folder and the embedding version."""

    def __init__(self, eligible: Sequence[str], asked: Keys | None, exact_below: int, folder: Path, version: str
                 ) -> None:
        self.eligible, self._asked, self.exact_below = eligible, asked, exact_below
        self.folder, self.version = folder, version

    @property
    def asked(self) -> Keys:
        if self._asked is None:
            self._asked = Keys.of(self.eligible)
        return self._asked


def _searched(view: Any, i: int, q: np.ndarray, k: int, where: _Where
              ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(queries, their ``k`` nearest eligible positions: int32, -1 where none, and the search's float32 cosines) a
    block of ``RANK_BLOCK`` queries at a time, in one view: exact below ``exact_below`` eligible images (every row,
    few), else from the stored index."""
    if len(where.eligible) < where.exact_below:
        matrix = np.asarray(view)
        for start in range(0, len(q), RANK_BLOCK):
            rows = q[start:start + RANK_BLOCK]
            yield rows, *_exact(matrix, rows, k)
        return
    yield from _indexed(view, where.eligible, where.asked, q, k, where.folder, f"{where.version};view={i}")


def _cosines(matrix: Any, q: np.ndarray, ids: np.ndarray, near: np.ndarray | None = None) -> np.ndarray:
    """Each (query, neighbour) cosine computed one way whichever search found it: a threshold decides alike.

    ``near``: only those of its (query, neighbour) cells, the first ``near.shape[1]`` neighbours, are computed (None:
    every neighbour), the rest are -inf. A curation asks only for the cells whose search cosine comes within
    ``COSINE_MARGIN`` of the threshold: it gathered every neighbour's row from the memory-mapped file (at a million
    images, 320,000 rows of a 256 MB file) for cosines of which about 0.4% can reach a threshold of 0.97
    (bench/README.md, run 25; the batch's resident memory did not change with it).
    """
    out = np.full(ids.shape, -np.inf, dtype=np.float32)
    found = ids >= 0
    rows, cols = np.nonzero(found if near is None else near & found[:, :near.shape[1]])
    for start in range(0, len(rows), CELL_BLOCK):  # (block, dim) floats twice at a time
        r, c = rows[start:start + CELL_BLOCK], cols[start:start + CELL_BLOCK]
        out[r, c] = np.einsum("nd,nd->n", matrix[q[r]].astype(np.float64), matrix[ids[r, c]].astype(np.float64))
    return out


def _exact(matrix: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` other rows of each query by cosine, nearest first, ties by position."""
    ids = np.empty((len(q), k), dtype=np.int32)
    sims = np.empty((len(q), k), dtype=np.float32)
    for start in range(0, len(q), SEARCH_BLOCK):
        block = q[start:start + SEARCH_BLOCK]
        s = matrix[block] @ matrix.T
        s[np.arange(len(block)), block] = -np.inf
        top = np.argpartition(-s, k - 1, axis=1)[:, :k]
        top_s = np.take_along_axis(s, top, axis=1)
        order = np.lexsort((top, -top_s), axis=1)
        ids[start:start + len(block)] = np.take_along_axis(top, order, axis=1)
        sims[start:start + len(block)] = np.take_along_axis(top_s, order, axis=1)
    return ids, sims


def _indexed(matrix: Any, eligible: Sequence[str], asked: Keys, q: np.ndarray, k: int, folder: Path, version: str
             ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Top ``k`` eligible neighbours of each query and their float32 cosines: the stored index's hits and, exactly,
    the eligible rows it lacks (its delta: a batch's own images), ranked together, a block of queries at a time
    (bounded hits).

    The index is extended (its delta folded in, then stored) only when the delta outgrows ``FOLD_SHARE`` of it
    (``_folds``): a batch of a few percent reads the index but neither grows nor rewrites it. Growing it copies its
    vectors (numpy-free C++ storage: the old and the grown copy are resident together, 256 MB a view at a million
    images) and rewriting it writes every row (about 0.5 GB a view at a million), both at every batch before.
    """
    index = ShaIndex.open(folder, version, matrix.shape[1])
    at = index.shas.located(asked, np.int32)  # each indexed row's eligible position, -1: not eligible now
    unindexed = _unindexed(at, len(asked))
    if _folds(len(unindexed), index.index.ntotal):
        index.extend(eligible, matrix, asked)
        at, unindexed = index.shas.located(asked, np.int32), unindexed[:0]
    delta = _Delta(matrix, unindexed)
    for start in range(0, len(q), RANK_BLOCK):
        rows = q[start:start + RANK_BLOCK]
        queries = matrix[rows]  # gathered from the mapped file once a block, for both searches
        found = [delta.nearest(queries, rows, k)]
        if index.index.ntotal:
            ids, sims = index.search(queries, k + 1 + SEARCH_SLACK)
            found.append((_positions(at, ids), sims))
        yield rows, *_ranked_positions(rows, np.concatenate([p for p, _ in found], axis=1),
                                       np.concatenate([s for _, s in found], axis=1), k)


def _unindexed(at: np.ndarray, n: int) -> np.ndarray:
    """The eligible positions (ascending: sha256 order) that no indexed row is at (``at``: each row's position).

    One pass over ``at`` and a flag an image: the rows of every eligible image in the list, in int64 and sorted
    (``ShaList.rows_of``), held about 25 bytes an image while they were found, twice a view (bench/README.md, run 37).
    """
    indexed = np.zeros(n, dtype=bool)
    for start in range(0, len(at), ROW_FLAGS):
        block = at[start:start + ROW_FLAGS]
        indexed[block[block >= 0]] = True
    return np.flatnonzero(~indexed)


def _folds(unindexed: int, indexed: int) -> bool:
    """Whether the index takes in its delta now: always into an empty index (a first curation builds it from every
    eligible image), else once the delta is more than ``FOLD_SHARE`` of the indexed rows (the exact search of the
    delta grows with it: queries x delta rows)."""
    return unindexed > 0 and (indexed == 0 or unindexed > FOLD_SHARE * indexed)


class _Delta:
    """The eligible rows the index lacks, searched exactly (their vectors gathered once: at most ``FOLD_SHARE`` of
    the index's rows)."""

    def __init__(self, matrix: Any, positions: np.ndarray) -> None:
        self.positions = positions
        self.vectors = np.asarray(matrix[positions], dtype=np.float32) if len(positions) else None

    def nearest(self, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(eligible positions, cosines) of each query's ``k`` nearest delta rows other than itself (-1, -inf where
        fewer), in blocks of queries whose scratch is at most ``DELTA_SCRATCH`` floats."""
        width = 0 if self.vectors is None else min(k, len(self.positions))
        ids = np.full((len(rows), width), -1, dtype=np.int64)
        sims = np.full((len(rows), width), -np.inf, dtype=np.float32)
        if not width:
            return ids, sims
        step = max(1, min(SEARCH_BLOCK, DELTA_SCRATCH // len(self.positions)))
        itself = np.searchsorted(self.positions, rows)  # a query in the delta (a new image) is not its own neighbour
        itself = np.where((itself < len(self.positions)) &
                          (self.positions[np.minimum(itself, len(self.positions) - 1)] == rows), itself, -1)
        for start in range(0, len(rows), step):
            block = slice(start, start + step)
            s = np.asarray(queries[block], dtype=np.float32) @ self.vectors.T
            mine = np.flatnonzero(itself[block] >= 0)
            s[mine, itself[block][mine]] = -np.inf
            np.negative(s, out=s)  # in place: the nearest first, no second scratch
            top = np.argpartition(s, width - 1, axis=1)[:, :width] if width < s.shape[1] else \
                np.broadcast_to(np.arange(s.shape[1]), s.shape).copy()
            top_s = -np.take_along_axis(s, top, axis=1)
            real = np.isfinite(top_s)
            ids[block] = np.where(real, self.positions[top], -1)
            sims[block] = np.where(real, top_s, -np.inf)
        return ids, sims


def _positions(at: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The eligible position of each index hit (-1: a missing hit or a row not eligible now)."""
    found = ids >= 0
    return np.where(found, at[np.where(found, ids, 0)], -1)


def _ranked(at: np.ndarray, q: np.ndarray, ids: np.ndarray, sims: np.ndarray, k: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` eligible hits of each query other than itself, nearest first, ties by position (``ids``: index
    rows, ``at`` their eligible positions)."""
    return _ranked_positions(q, _positions(at, ids), sims, k)


def _ranked_positions(q: np.ndarray, p: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``_ranked`` of hits given as eligible positions ``p`` (-1: none)."""
    hit = (p >= 0) & (p != q[:, None])
    order = np.lexsort((p, -sims, ~hit), axis=1)[:, :k]  # hits first, then (-cosine, position)
    ranked_hit = np.take_along_axis(hit, order, axis=1)
    out_ids = np.full((len(q), k), -1, dtype=np.int32)
    out_sims = np.full((len(q), k), -np.inf, dtype=np.float32)
    width = order.shape[1]
    out_ids[:, :width] = np.where(ranked_hit, np.take_along_axis(p, order, axis=1), -1)
    out_sims[:, :width] = np.where(ranked_hit, np.take_along_axis(sims, order, axis=1), -np.inf)
    return out_ids, out_sims


class ShaIndex:
    """A faiss HNSW inner-product index whose ids are positions in a stored list of sha256s.

    A stored index is opened memory-mapped and read-only (``IO_FLAG_MMAP_IFC``: its vectors and its graph stay pages
    of the file, which the kernel may drop and concurrent curations share, not the process's own memory: at a million
    images about 0.5 GB a view); only ``extend`` reads it whole, to grow it. A search of the mapped index gives the
    same neighbours as of the index read whole.
    """

    def __init__(self, path: Path, index, shas: ShaList, mapped: bool = False) -> None:
        self.path, self.index, self.shas, self.mapped = path, index, shas, mapped

    @classmethod
    def open(cls, folder: Path, version: str, dim: int) -> ShaIndex:
        import faiss

        name = hashlib.sha256(version.encode()).hexdigest()[:16]
        path = folder / f"{name}.faiss"
        shas_path = path.with_suffix(".shas")
        if path.exists() and shas_path.exists():
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
            shas = ShaList.read(shas_path)
            if index.ntotal == len(shas) and index.d == dim:
                return cls(path, index, shas, mapped=True)
            log.warning("curate: neighbour index %s does not match its sha list: rebuilt", path.name)
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        return cls(path, index, ShaList.of([]))

    def extend(self, shas: Sequence[str], matrix: Any, asked: Keys) -> int:
        """Add the rows of ``shas`` (``asked``: their ``Keys``) not indexed yet (sha256 order, one thread) and
        store the index; how many."""
        import faiss

        new = np.flatnonzero(self.shas.rows_of(asked) < 0).tolist()  # positions, in sha256 order: no tuples
        new.sort(key=shas.__getitem__)
        if not new:
            return 0
        vectors = np.ascontiguousarray(matrix[np.asarray(new, dtype=np.int64)], dtype=np.float32)
        if self.mapped:  # the file's pages are read-only: grown, the index is read whole first
            self.index, self.mapped = faiss.read_index(str(self.path)), False
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)  # HNSW insertion in parallel depends on thread timing
        try:
            self.index.add(vectors)
        finally:
            faiss.omp_set_num_threads(threads)
        self.shas = self.shas.extended([shas[r] for r in new])
        self._store()
        return len(new)

    def search(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.index.hnsw.efSearch = max(HNSW_EF_SEARCH, 2 * k)
        sims, ids = self.index.search(np.ascontiguousarray(rows, dtype=np.float32), min(k, self.index.ntotal))
        return ids, sims

    def _store(self) -> None:
        """Index then sha list, each written aside and renamed: a crash leaves a pair that mismatches or none."""
        import faiss

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".faiss.{os.getpid()}.tmp")
        faiss.write_index(self.index, str(tmp))
        os.replace(tmp, self.path)
        tmp_shas = self.path.with_suffix(f".shas.{os.getpid()}.tmp")
        self.shas.write(tmp_shas)
        os.replace(tmp_shas, self.path.with_suffix(".shas"))


def candidate_pairs(graph: NeighbourGraph, k: int) -> np.ndarray:
    """Rows (i, j), i < j, sorted and unique: each query and its ``k`` nearest images in every view.

    An int64 array, not a set of tuples: a million queries give about 13 million pairs.
    """
    n = 1 + max([int(graph.queries.max(initial=-1))] + [int(ids.max(initial=-1)) for ids in graph.ids])
    codes = [_candidate_codes(graph.queries, ids, k, n) for ids in graph.ids]
    return _decoded(np.unique(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64), n)


def _candidate_codes(queries: np.ndarray, ids: np.ndarray, k: int, n: int) -> np.ndarray:
    """``lo * n + hi`` of each (query, one of its ``k`` nearest) pair, itself and missing neighbours left out."""
    b = ids[:, :k].astype(np.int64)
    a = np.broadcast_to(queries.astype(np.int64)[:, None], b.shape)
    found = b >= 0
    lo, hi = np.minimum(a, b)[found], np.maximum(a, b)[found]
    pair = lo != hi
    return lo[pair] * n + hi[pair]


def _decoded(codes: np.ndarray, n: int) -> np.ndarray:
    return np.stack([codes // max(n, 1), codes % max(n, 1)], axis=1)


def similar_pairs(graph: NeighbourGraph, k: int, threshold: float) -> list[tuple[int, int, float]]:
    """(i, j, cosine), i < j: each query and its ``k`` nearest images of the first view at ``threshold`` or above.

    A pair found from both sides counts once, in the order first found (query by query, nearest first). In
    arrays: a Python list of every query's neighbours held about 2 GB at a million images (32 a query).
    """
    if not graph.ids:
        return []
    lo, hi, cos = _similar_edges(graph.queries, graph.ids[0], graph.sims[0], k, threshold)
    first = _first_found(lo, hi)
    return list(zip(lo[first].tolist(), hi[first].tolist(), cos[first].tolist()))


def _similar_edges(queries: np.ndarray, ids: np.ndarray, sims: np.ndarray, k: int, threshold: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, cosine) of each query's ``k`` nearest (``ids``, ``sims``: one view) at ``threshold`` or above, query
    by query, nearest first (a pair found from both sides is there twice)."""
    ids, sims = ids[:, :k], sims[:, :k]
    # A float32 superset first (no float64 copy of every cosine), then the test as the Python floats compared.
    rows, cols = np.nonzero((ids >= 0) & (sims >= np.nextafter(np.float32(threshold), np.float32(-np.inf))))
    cos = sims[rows, cols]
    exact = cos.astype(np.float64) >= threshold
    rows, cols, cos = rows[exact], cols[exact], cos[exact]
    a, b = queries.astype(np.int64)[rows], ids[rows, cols].astype(np.int64)
    return np.minimum(a, b), np.maximum(a, b), cos


def _first_found(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Where each pair (lo, hi) is first found, in order: the rows that keep each pair once."""
    n = 1 + max(int(hi.max(initial=-1)), 0)
    _, first = np.unique(lo * n + hi, return_index=True)
    first.sort()
    return first
