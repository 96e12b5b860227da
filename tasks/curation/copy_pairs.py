"""Which pairs of images are copies: candidates from the embedding, the decision from the copy score.

The curation embedding (``tasks.curation.curation_features``) is cheap and searches the whole raw version,
but a cosine cannot tell a shifted or cropped copy from a different image of the same class
(bench/dedup_calibration.py: at the cosine that keeps false drops <= 1%, a pixel embedding finds
12% of 5-10% crops). The copy score (``tasks.curation.copy_score``: alignment-, blur- and
brightness-tolerant correlation, ~0.4 ms a pair) tells them apart but scores one pair at a time.
So:

1. Candidates (``tasks.curation.neighbours.candidate_pairs``): each new image's ``curation.copy_candidates``
   nearest neighbours among the eligible images by the embedding's cosine and, for the pixel embedding,
   also by the cosine of the same pixels blurred (a Gaussian of one embedding pixel: a resized or
   blurred copy is nearer its original there). Measured on the planted copies of the benchmark,
   8 of each find the original of >= 96% of copies in every cell and transformation (a resized
   8 px digit is the hardest) and of >= 98% of all others.
2. Scores (``CopyScores``): every candidate pair gets the copy score, and only those: the scoring
   per image is bounded whatever the size of its component (``tasks.curation.dedupe.dedupe_component``
   decides from these and the stored scores). A pair is a copy at ``curation.copy_similarity`` or
   above (0.9974, calibrated on the benchmark).
3. Scores are a content-addressed cache: the ``curation_pairs`` table holds every pair ever
   scored, keyed by (sha256_a, sha256_b, config) with sha256_a < sha256_b and ``config`` naming
   the score's version, so a curation scores only pairs it has not seen and a re-run scores none.

A large batch is scored in worker processes (``spawn``: no state inherited from the calling
process, which may hold threads of Airflow or delta-rs), one per core, started by
``tasks.worker_pool`` so that they run inside an Airflow task too (a spawned worker that re-ran the
``airflow`` script died on the database URL Airflow 3 gives a task: scoring fell over to one core).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.curation import copy_score
from tasks.curation.pair_store import SCAN_ROWS, StoredPairs, StoredScores, both_keys, joined
from tasks.curation.positions import position_dtype
from tasks.curation.sha_list import Keys
from tasks.data import lake
from tasks.worker_pool import spawn_pool

log = logging.getLogger(__name__)

PAIRS_TABLE = "curation_pairs"
# Pairs: below this, scoring stays in this process. Two spawned workers take ~0.8 s to start (measured on
# the 2 shared cores, numpy and PIL imported), a pair ~0.4 ms: two workers only save wall time from
# ~2 x 0.8 s / 0.4 ms = 4,000 pairs, and always cost their start-up in CPU. A 1% batch (~13 pairs an
# image) stays in-process up to ~30,000 images.
PARALLEL_FROM = 4000
CHUNK = 250  # pairs per worker task
SIGNATURE_CHUNK = 500  # images per worker task when signatures are computed (~0.3 ms each)
SIGN_ROWS = 20_000  # images whose bytes are held at once when the signatures are computed from a scan
SCORE_BLOCK = 50_000  # pairs whose work items are held at once (signatures are cached per image)
STORE_BLOCK = 65_536  # pair rows written at once: only these rows' sha256 strings exist together
BLUR_SIGMA = 1.0  # embedding pixels: the second candidate search's blur

PAIRS_SCHEMA = pa.schema(
    [
        pa.field("sha256_a", pa.string(), nullable=False),  # the smaller sha256 of the pair
        pa.field("sha256_b", pa.string(), nullable=False),
        pa.field("config", pa.string(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
    ]
)


def score_config() -> str:
    """The name of everything that changes a pair's score."""
    return f"{copy_score.VERSION};grid={copy_score.GRID}"


# ---------------------------------------------------------------- candidates


def blurred(matrix: np.ndarray, side: int, sigma: float = BLUR_SIGMA) -> np.ndarray:
    """Unit rows of a ``side`` x ``side`` pixel embedding blurred by a Gaussian (edges repeated), re-centred."""
    g = copy_score.gauss_matrix(side, sigma)
    x = matrix.reshape(-1, side, side).astype(np.float64)
    x = np.einsum("ij,njk,lk->nil", g, x, g).reshape(len(matrix), -1)
    x -= x.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms == 0, 1.0, norms)).astype(np.float32)


# ---------------------------------------------------------------- scores


def _score_chunk(chunk: list[tuple[bytes, bytes]]) -> list[float]:
    """The copy scores of pairs of packed signatures (``copy_score.packed``)."""
    return [copy_score.copy_score(copy_score.unpacked(a), copy_score.unpacked(b)) for a, b in chunk]


def _signature_chunk(chunk: list[bytes]) -> list[tuple[bytes | None, str | None]]:
    """(packed signature, None), or (None, why) for an image whose signature cannot be computed."""
    out: list[tuple[bytes | None, str | None]] = []
    for data in chunk:
        try:
            out.append((copy_score.packed(copy_score.copy_signature(data)), None))
        except Exception as exc:  # any decoder failure: the caller scores the image as no copy
            out.append((None, str(exc)))
    return out


class FreshPairs:
    """The pairs scored in this curation, as integer codes and scores (16 bytes a pair, not 300).

    Rows are added a block at a time (each block in key order); ``partners`` answers from an index of
    them (``StoredPairs``), in the order the rows were added, rebuilt only after rows were added. Once the
    plan has asked its last question, ``seal`` lets the index and the code map go: the rows are what is stored
    (at a million images, 7.7 million pairs: the index is 246 MB, the map about 100 MB, held through the writes).
    """

    def __init__(self) -> None:
        self.shas: list[str] = []
        self._code: dict[str, int] | None = {}
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._index: StoredPairs | None = None
        self.count = 0

    def add(self, pairs: list[tuple[str, str]], scores: list[float]) -> None:
        """Rows (a, b, score) with a < b."""
        if not pairs:
            return
        if self._code is None:
            raise RuntimeError("FreshPairs: sealed (the plan is done), no row is added")
        codes = np.fromiter((self._coded(s) for pair in pairs for s in pair), dtype=np.int64,
                            count=2 * len(pairs)).reshape(-1, 2)
        kind = position_dtype(len(self.shas))
        self._parts.append((codes[:, 0].astype(kind), codes[:, 1].astype(kind), np.asarray(scores, dtype=np.float64)))
        self.count += len(pairs)
        self._index = None

    def seal(self) -> None:
        """No row is added and no partner asked for from here on: the index and the code map go."""
        self._index, self._code = None, None

    def _coded(self, sha: str) -> int:
        code = self._code.get(sha)  # type: ignore[union-attr]  # not sealed: ``add`` checked
        if code is None:
            code = self._code[sha] = len(self.shas)
            self.shas.append(sha)
        return code

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows as added: codes a, b and scores (joined once: a later call does not copy them again)."""
        if not self._parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
        return joined(self._parts)

    def partners(self, sha: str) -> dict[str, float]:
        if self._code is None:
            raise RuntimeError("FreshPairs: sealed (the plan is done), no partner is asked for")
        if sha not in self._code:
            return {}
        if self._index is None:
            self._index = StoredPairs(self.shas, *self._arrays(), code=self._code)
        return self._index.partners(sha)

    def items(self) -> Iterator[tuple[str, str, float]]:
        """(a, b, score) of every row, in the order added."""
        for a, b, v in zip(*self._arrays()):
            yield self.shas[a], self.shas[b], float(v)

    def rows(self, run_id: str) -> pa.Table:
        """The rows to store, sorted by (sha256_a, sha256_b), in one table (``blocks`` streams them)."""
        return pa.Table.from_batches(list(self.blocks(run_id)), PAIRS_SCHEMA)

    def blocks(self, run_id: str, keep: np.ndarray | None = None, block_rows: int = STORE_BLOCK
               ) -> Iterator[pa.RecordBatch]:
        """The rows to store (``keep``: a mask over the rows as added), sorted by (sha256_a, sha256_b), a block at a time.

        The sort is of the images' integer ranks among the sha256s, so only one block's sha256 strings
        exist at once (the million's 7.7 million fresh pairs made one table of 1.4 GB of strings).
        """
        a, b, v = self._arrays()
        shas = pa.array(self.shas, pa.string())
        rank = np.empty(len(self.shas), dtype=np.int64)
        rank[pc.sort_indices(shas).to_numpy()] = np.arange(len(self.shas))
        order = np.argsort(rank[a] * max(1, len(self.shas)) + rank[b], kind="stable")
        if keep is not None:
            order = order[keep[order]]
        config, run = pa.scalar(score_config()), pa.scalar(run_id)
        for start in range(0, len(order), block_rows):
            at = order[start:start + block_rows]
            yield pa.record_batch([shas.take(pa.array(a[at])), shas.take(pa.array(b[at])),
                                   pa.repeat(config, len(at)), pa.array(v[at]), pa.repeat(run, len(at))],
                                  schema=PAIRS_SCHEMA)

    def unstored(self, uri: str, version: int) -> np.ndarray:
        """A mask over the rows as added: True where the table at ``version`` lacks the pair (under this score config).

        The table is read a block at a time, its two sha256 columns coded against this object's images by binary
        search in their byte array (``sha_list.Keys``; a full run's are every image): the pairs found are integers,
        never strings.
        """
        a, b, _ = self._arrays()
        n = max(1, len(self.shas))
        a, b = a.astype(np.int64), b.astype(np.int64)  # a * n overflows int32
        wanted, config = Keys.of(self.shas), score_config()
        found = [np.zeros(0, dtype=np.int64)]
        for block in lake.scan_blocks(uri, version, ["sha256_a", "sha256_b", "config"], SCAN_ROWS):
            codes = wanted.positions(both_keys(block))
            sa, sb = codes[:block.num_rows], codes[block.num_rows:]
            hit = pc.equal(block.column("config"), config).to_numpy(zero_copy_only=False) & (sa >= 0) & (sb >= 0)
            found.append(sa[hit] * n + sb[hit])
        return ~np.isin(a * n + b, np.concatenate(found))


class CopyScores:
    """Copy scores of pairs of images, by sha256: stored ones, and new ones computed on demand.

    ``image_of(sha)`` gives an image's bytes (its signature is computed once a ``score_many``), or ``scan(shas)``
    every image's of the pairs to score, in one pass, as (sha256, image) tables (signed before the first block). ``fresh``
    holds the pairs scored here, to be stored (``FreshPairs``); an image whose signature cannot be computed
    scores 0 against everything (curation has already set aside what does not decode). Stored scores
    (``pair_store.StoredScores``) are read from the table by image, as ``want`` asks for them, and kept as arrays;
    an image's partners are gathered the first time they are asked for.
    """

    def __init__(self, image_of: Callable[[str], bytes],
                 stored: StoredScores | dict[tuple[str, str], float] | None = None, workers: int | None = None,
                 scan: Callable[[list[str]], Iterable[pa.Table]] | None = None) -> None:
        self._image_of = image_of
        self._scan = scan  # (sha256, image) tables of the images asked for, in one pass: signed before the scoring
        self.stored = stored if isinstance(stored, StoredScores) else StoredScores.from_dict(stored or {})
        self.fresh = FreshPairs()
        self._partners: dict[str, dict[str, float]] = {}  # sha -> {scored partner: score}, gathered on demand
        self._none_stored: set[str] = set()  # images found to have no stored partner
        self._sigs: dict[str, bytes | None] = {}  # packed (copy_score.packed): a third of an array's memory
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 1))

    @staticmethod
    def key(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a < b else (b, a)

    def partners(self, sha: str) -> dict[str, float]:
        """Every image ``sha`` has a known score with (stored or scored here), and the score.

        An image with no stored partner answers from the pairs scored here (no copy of them is kept).
        """
        got = self._partners.get(sha)
        if got is None:
            got = {} if sha in self._none_stored else self.stored.partners(sha)
            if not got:
                self._none_stored.add(sha)
                return self.fresh.partners(sha)
            got.update(self.fresh.partners(sha))
            self._partners[sha] = got
        return got

    def get(self, a: str, b: str) -> float | None:
        """The score if known (stored or computed), else None: a score computed here over a stored one, as
        ``partners`` has it; ``a``'s partners are not gathered when they were not already."""
        got = self._partners.get(a)
        if got is not None:
            return got.get(b)
        fresh = self.fresh.partners(a).get(b)
        return fresh if fresh is not None or a in self._none_stored else self.stored.score(a, b)

    def want(self, shas: Iterable[str]) -> None:
        """Read the stored pairs of ``shas`` in one scan, before their partners are asked for (``StoredScores``)."""
        self.stored.want(shas)

    def want_all(self) -> None:
        """Read the stored pairs of every eligible image (a full scan of the nearest map asks for all)."""
        self.stored.want_all()

    def forget_partners(self) -> None:
        """Let the partners gathered so far go (a phase or a component is done with them: at a million images the
        candidates' and a walk's were 50-70 MB of dicts); the pairs stay, a later question gathers them again."""
        self._partners.clear()

    def release_stored(self) -> None:
        """Let the stored pairs read so far and the partners gathered go (``StoredScores.release``): a later question
        reads them again. The pairs scored here stay."""
        self.stored.release()
        self.forget_partners()
        self._none_stored.clear()

    def score_many(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Compute every unknown pair of ``pairs`` (in worker processes when many), a block at a time."""
        listed = list(pairs)
        shas = sorted({s for pair in listed for s in pair})
        at = {s: i for i, s in enumerate(shas)}
        self.score_positions(np.array([(at[a], at[b]) for a, b in listed], dtype=np.int64).reshape(-1, 2), shas)

    def score_positions(self, pairs: np.ndarray, shas: Sequence[str]) -> None:
        """``score_many`` of an (n, 2) array of positions into ``shas`` (sorted, so position order is key order).

        The pairs stay integers (one int64 key each) until a block of them is scored: no Python tuple per pair.
        """
        n = len(shas)
        lo, hi = pairs.min(axis=1).astype(np.int64), pairs.max(axis=1).astype(np.int64)
        keys = np.unique((lo * n + hi)[lo != hi])  # i * n + j, i < j: sorted keys are pairs in key order

        def blocks(of: np.ndarray) -> Iterator[list[tuple[str, str]]]:
            for start in range(0, len(of), SCORE_BLOCK):
                yield [(shas[k // n], shas[k % n]) for k in of[start:start + SCORE_BLOCK].tolist()]

        self.want(shas[i] for i in np.unique(np.concatenate([keys // n, keys % n])).tolist())
        unknown = np.fromiter((self.get(a, b) is None for block in blocks(keys) for a, b in block), dtype=bool,
                              count=len(keys))
        todo = keys[unknown]
        images = np.unique(np.concatenate([todo // n, todo % n])).tolist() if self._scan is not None else []
        self._score(len(todo), blocks(todo), [shas[i] for i in images])

    def _score(self, total: int, blocks: Iterator[list[tuple[str, str]]], signed_first: Sequence[str] = ()) -> None:
        """Score ``total`` unknown pairs, given in blocks in key order; the signatures are dropped at the end.

        ``signed_first``: the images of those pairs, signed from one scan before the first block (``scan``).
        """
        if not total:
            return
        unusable: list[tuple[str, str]] = []
        with _Scorer(self.workers if total >= PARALLEL_FROM else 1, total) as run:
            if signed_first:
                self._sign_scanned(signed_first, run)
            for pairs_now in blocks:
                self._signatures(sorted({s for p in pairs_now for s in p}), run)
                block = [(p, self._sigs[p[0]], self._sigs[p[1]]) for p in pairs_now]
                unusable += [p for p, x, y in block if x is None or y is None]
                work = [(p, x, y) for p, x, y in block if x is not None and y is not None]
                self.fresh.add([p for p, _, _ in work], [float(v) for v in run([(x, y) for _, x, y in work])])
                self._forget_signatures_below(pairs_now[-1][0])
        self.fresh.add(unusable, [0.0] * len(unusable))
        self._partners.clear()  # gathered before these scores
        self._sigs.clear()

    def _forget_signatures_below(self, sha: str) -> None:
        """Drop the signatures no later block needs: blocks come in key order, so every later pair (a, b)
        has a >= this block's last a, and b > a. Held then: the images still ahead, not every image scored."""
        self._sigs = {s: sig for s, sig in self._sigs.items() if s >= sha}

    def _signatures(self, shas: list[str], run: _Scorer) -> None:
        """Compute the signatures of ``shas`` not known yet (in the workers when there are many)."""
        todo = [s for s in shas if s not in self._sigs]
        self._signed(todo, run.signatures([self._image_of(s) for s in todo]))

    def _sign_scanned(self, shas: list[str], run: _Scorer) -> None:
        """The signatures of ``shas`` from one scan of their bytes, ``SIGN_ROWS`` images at a time: no image is held
        for the scoring (a million 32x32 PNGs are about 0.85 GB, their packed signatures about 0.3 GB, let go as
        the scoring passes them)."""
        assert self._scan is not None
        for block in self._scan(shas):
            for start in range(0, block.num_rows, SIGN_ROWS):
                part = block.slice(start, SIGN_ROWS)
                self._signed(part.column("sha256").to_pylist(),  # let go as the scoring passes them
                             run.signatures(part.column("image").to_pylist()))

    def _signed(self, shas: list[str], results: list[tuple[bytes | None, str | None]]) -> None:
        for sha, (sig, error) in zip(shas, results):
            if error is not None:  # decoded once by ingest and by curation: say so, score it as no copy
                log.warning("curate: no copy signature for %s: %s", sha[:12], error)
            self._sigs[sha] = sig

    def fresh_rows(self, run_id: str) -> pa.Table:
        return self.fresh.rows(run_id)


# ---------------------------------------------------------------- the cache table


class _Scorer:
    """Scores lists of signature pairs: in one pool of spawned workers kept for every block, else in this process.

    Workers never re-run the caller's main script (``tasks.worker_pool``); workers that cannot start or die leave the
    rest to this process.
    """

    def __init__(self, workers: int, total: int) -> None:
        self.workers, self.left = workers, total
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Scorer:
        if self.workers >= 2:
            self._pool = spawn_pool(self.workers)
        return self

    def __call__(self, items: list[tuple[bytes, bytes]]) -> list[float]:
        scores = self._mapped(_score_chunk, items, CHUNK, PARALLEL_FROM)
        self.left -= len(items)
        return scores

    def signatures(self, images: list[bytes]) -> list[tuple[bytes | None, str | None]]:
        return self._mapped(_signature_chunk, images, SIGNATURE_CHUNK, SIGNATURE_CHUNK)

    def _mapped(self, fn: Callable[[list[Any]], list[Any]], items: list[Any], chunk: int, parallel_from: int
                ) -> list[Any]:
        if self._pool is None or len(items) < parallel_from:
            return fn(items)
        chunks = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        try:
            return [v for part in self._pool.map(fn, chunks) for v in part]
        except BrokenProcessPool as exc:  # same results, one core
            log.warning("curate: copy-score workers failed (%s): scoring %d pairs in this process", exc, self.left)
            # The failed futures keep the exception, and its traceback every frame up the stack (the whole plan's
            # maps): without this they stayed until Python's next full garbage collection, past the plan's end.
            exc.__traceback__ = None
            self._close()
            return fn(items)

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __exit__(self, *exc: object) -> None:
        self._close()


def store_scores(uri: str, pairs: FreshPairs, run_id: str, metadata: dict) -> int | None:
    """Add the pairs scored here that the table lacks, written a block at a time; a re-run commits nothing.

    The pairs already stored (a retry after its commit, a concurrent curation) are found by integer codes
    (``FreshPairs.unstored``); the rest are appended in one commit against the version read
    (``lake.append_stream``, which creates the table when there is none), and a lost race reads again.
    """
    if not pairs.count:
        return None

    def attempt(_: int) -> int | None:
        table = lake.open_table(uri) if lake.exists(uri) else None
        keep = None if table is None else pairs.unstored(uri, table.version())
        reader = pa.RecordBatchReader.from_batches(PAIRS_SCHEMA, pairs.blocks(run_id, keep))
        version, _ = lake.append_stream(uri, reader, metadata, table, lake.stats_columns_config(PAIRS_SCHEMA))
        return version

    return lake.retry_on_conflict(attempt, f"store copy scores in {uri}")
