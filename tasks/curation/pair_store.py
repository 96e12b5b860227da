"""The stored copy scores, read by key: the pairs of the images a curation asks for, never the whole table.

``curation_pairs`` (``tasks.curation.copy_pairs``) holds every pair ever scored: at a million images, 7.7 million
rows. A batch scores its own images' candidates and walks only the components it touches, so it needs the
stored partners of a few images: read whole, the table set the batch's memory (the codes and scores of every
pair, 3.1 GiB resident at the million) and its cost grew with the table.

``StoredScores.want(shas)`` reads, in one streamed scan of the table's key columns, every stored pair (under
the current score config) that has an image of ``shas`` not read before and whose other image is eligible:
after it, those images' partners are complete. The planner asks at its phase boundaries (the candidate
pairs' images before the scoring, the nearest summary's added and orphaned images, the members of the
components it walks); ``partners`` of an image not asked for reads that image alone first, so an answer is
never partial, and ``scans`` counts the scans (a batch's report says how many).
A scan holds one block of key strings and the rows kept as integer positions among the eligible images.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.curation.by_position import SortedRank
from tasks.curation.positions import position_dtype
from tasks.curation.sha_list import Keys, SortedShas, SortedSubset
from tasks.data import lake

log = logging.getLogger("tasks.curation.curate")

# Rows of the key columns read at a time. Their lookups no longer hash every eligible image (``Keys``), so a block
# need not be large to pay for one: a block of 262,144 rows held about 90 MB while it was read and narrowed, one of
# 65,536 about 16 MB, the walk's high at 100,000 images (bench/README.md, run 39: 16,384, the scan 0.5 s slower).
SCAN_ROWS = 1 << 14
# Rows kept (a batch's, narrowed) before they are coded: a binary search a key has no cost a call, so they are coded
# as soon as a block's worth has gathered. Gathered up to ``lake.LOOKUP_BLOCK_ROWS`` (262,144) they were every stored
# pair a batch reads at once (161,813 at 100,000 images: their two key columns joined and their codes, about 25 MB,
# the copy links' traced high; bench/README.md, run 41).
CODE_ROWS = SCAN_ROWS


class StoredPairs:
    """Scores of pairs as arrays, looked up by image on demand: no Python object per pair.

    ``shas`` are the images the codes refer to (``code`` maps them back, built when first needed);
    each pair is kept from both sides, sorted by its first image, so an image's partners are one
    ``searchsorted`` slice (in the order of the rows, as a dict built row by row had them).
    """

    def __init__(self, shas: Sequence[str], a: np.ndarray, b: np.ndarray, scores: np.ndarray,
                 code: dict[str, int] | None = None) -> None:
        self.shas = shas
        self.count = len(a)
        codes = position_dtype(len(shas))  # int32: 123 MB less at the million's pairs
        first = np.stack([a, b], axis=1).ravel().astype(codes, copy=False)  # row by row: a's side, then b's
        order = np.argsort(first, kind="stable")
        self._first = first[order]
        self._second = np.stack([b, a], axis=1).ravel().astype(codes, copy=False)[order]
        self._scores = np.repeat(np.asarray(scores, dtype=np.float64), 2)[order]
        self._code = code

    def partners(self, sha: str) -> dict[str, float]:
        if self._code is None:
            self._code = {s: i for i, s in enumerate(self.shas)}
        code = self._code.get(sha)
        return {} if code is None else self.partners_of(code)

    def score_of(self, code: int, other: int) -> float | None:
        """The score of the pair of the images coded ``code`` and ``other`` (its last row, as ``partners_of``'s dict
        keeps it), else None: no dict or string made."""
        if not self.count:
            return None
        lo, hi = np.searchsorted(self._first, np.array([code, code + 1], dtype=self._first.dtype))
        hits = np.flatnonzero(self._second[lo:hi] == other)
        return float(self._scores[lo + hits[-1]]) if len(hits) else None

    def partners_of(self, code: int) -> dict[str, float]:
        """The partners of the image coded ``code``."""
        if not self.count:
            return {}
        # The needles in the codes' own dtype: numpy would otherwise cast the whole int32 array to int64 on every
        # call (measured: 15 ms a call against 7 us for 15 million codes; at the million, hours of lookups).
        lo, hi = np.searchsorted(self._first, np.array([code, code + 1], dtype=self._first.dtype))
        return dict(zip([self.shas[j] for j in self._second[lo:hi].tolist()], self._scores[lo:hi].tolist()))


class StoredScores:
    """The stored scores among ``eligible`` (sorted sha256s) under ``config``, read from ``uri`` by image on demand.

    ``uri`` None: no table (``pairs`` given instead, as {(a, b): score}: a test's or a caller's own).
    """

    def __init__(self, uri: str | None, config: str, eligible: Sequence[str],
                 pairs: dict[tuple[str, str], float] | None = None, keys: Keys | None = None) -> None:
        self.eligible = eligible
        self._rank = SortedRank(eligible if isinstance(eligible, (list, SortedShas, SortedSubset)) else list(eligible))
        self._keys = keys  # ``eligible`` as a byte array (the plan's own; else made at the first scan)
        self._uri, self._config = uri, config
        self._version = lake.current_version(uri) if uri is not None else None
        self._read = np.zeros(len(eligible), dtype=bool)  # eligible positions whose pairs are held
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._index: StoredPairs | None = None
        self.count = 0  # pairs held
        self.scans = 0  # scans of the table
        self.seconds = 0.0  # spent scanning
        if pairs:
            self._add_given(pairs)

    @classmethod
    def from_dict(cls, pairs: dict[tuple[str, str], float]) -> StoredScores:
        return cls(None, "", sorted({s for pair in pairs for s in pair}), pairs)

    def _add_given(self, pairs: dict[tuple[str, str], float]) -> None:
        at = {s: i for i, s in enumerate(self.eligible)}
        keys = list(pairs)
        self._held(np.asarray([at[a] for a, _ in keys], dtype=np.int64),
                   np.asarray([at[b] for _, b in keys], dtype=np.int64), np.asarray([pairs[k] for k in keys]))
        self._read[:] = True

    def position(self, sha: str) -> int | None:
        """``sha``'s position among the eligible images, None when not eligible (a bisection: no map of them)."""
        return self._rank.get(sha)

    def want(self, shas: Iterable[str]) -> None:
        """Read the stored pairs of the eligible images of ``shas`` not read yet, in one scan (none when all are)."""
        at = np.fromiter((p for p in map(self.position, shas) if p is not None), dtype=np.int64)
        self._want(np.unique(at[~self._read[at]]) if len(at) else at)

    def want_all(self) -> None:
        """Read the stored pairs of every eligible image not read yet (a full scan's nearest map needs them all)."""
        self._want(np.flatnonzero(~self._read))

    def _want(self, new: np.ndarray) -> None:
        if not len(new):
            return
        if self._version is not None:
            start = time.perf_counter()
            self._scan(new)
            self.seconds += time.perf_counter() - start
        self._read[new] = True

    def _scan(self, new: np.ndarray) -> None:
        """One pass over the key columns: the rows with an image of ``new`` whose other image is eligible and
        has not been read (a pair with a read image was read with it), kept as eligible positions.

        A block's rows are first narrowed to those naming a wanted image (a set lookup of the few wanted); the
        rows left are coded against the eligible images ``CODE_ROWS`` at a time, by binary search in their byte
        array (``sha_list.Keys``: an Arrow lookup hashed its whole value set each time, 0.43 s and about 190 MB held
        a million). When most images are wanted (a full scan) the narrowing is skipped.
        """
        self.scans += 1
        is_new = np.zeros(len(self.eligible), dtype=bool)
        is_new[new] = True
        narrow = pa.array([self.eligible[i] for i in new.tolist()], pa.string()) if 2 * len(new) < len(is_new) else None
        if self._keys is None:
            self._keys = Keys.of(self.eligible)
        pending: list[pa.Table] = []
        for block in lake.scan_blocks(self._uri, self._version, ["sha256_a", "sha256_b", "score", "config"],
                                      SCAN_ROWS):
            keep = pc.equal(block.column("config"), self._config)
            if narrow is not None:
                found = pc.is_in(both_keys(block), value_set=narrow).combine_chunks()
                keep = pc.and_(keep, pc.or_(found.slice(0, block.num_rows), found.slice(block.num_rows)))
            pending.append(block.select(["sha256_a", "sha256_b", "score"]).filter(keep))
            if sum(t.num_rows for t in pending) >= CODE_ROWS:
                self._code_rows(pa.concat_tables(pending), self._keys, is_new)
                pending = []
        if pending:
            self._code_rows(pa.concat_tables(pending), self._keys, is_new)

    def _code_rows(self, rows: pa.Table, eligible: Keys, is_new: np.ndarray) -> None:
        """Hold the pairs of ``rows`` with both images eligible, one of them new and neither read before."""
        codes = eligible.positions(both_keys(rows))
        a, b = codes[:rows.num_rows], codes[rows.num_rows:]
        ok = (a >= 0) & (b >= 0)
        a0, b0 = np.where(ok, a, 0), np.where(ok, b, 0)
        ok &= (is_new[a0] | is_new[b0]) & ~(self._read[a0] | self._read[b0])
        self._held(a[ok], b[ok], rows.column("score").to_numpy()[ok])

    def _held(self, a: np.ndarray, b: np.ndarray, scores: np.ndarray) -> None:
        if len(a):
            self._parts.append((a.astype(np.int32), b.astype(np.int32), np.asarray(scores, dtype=np.float64)))
            self.count += len(a)
            self._index = None

    def release(self) -> None:
        """Let the pairs held go (the walk is done: at a million images, those of the components it walked); an image
        asked for again is read again. ``count``, ``scans`` and ``seconds`` go on counting."""
        self._parts, self._index = [], None
        self._read[:] = False

    def partners(self, sha: str) -> dict[str, float]:
        """Every eligible image ``sha`` has a stored score with (read first when ``sha`` was not asked for)."""
        code = self.position(sha)
        if code is None:
            return {}
        if not self._read[code]:
            log.debug("curate: stored pairs of %s read alone (not asked for before)", sha[:12])
            self.want([sha])
        if not self._parts:
            return {}
        return self._pairs().partners_of(code)

    def score(self, a: str, b: str) -> float | None:
        """The stored score of the pair (a, b) when both are eligible (read first when ``a`` was not asked for), else
        None: ``partners(a).get(b)`` without gathering ``a``'s partners (their strings: a phase that asks for
        single pairs, as the candidates' check, made one an eligible image)."""
        code, other = self.position(a), self.position(b)
        if code is None or other is None:
            return None
        if not self._read[code]:
            log.debug("curate: stored pairs of %s read alone (not asked for before)", a[:12])
            self.want([a])
        return self._pairs().score_of(code, other) if self._parts else None

    def _pairs(self) -> StoredPairs:
        if self._index is None:
            self._index = StoredPairs(self.eligible, *joined(self._parts))
        return self._index


def joined(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``parts`` (codes a, b and scores, added a block at a time; at least one) as one part, left in
    ``parts`` in place of the blocks: a later call copies nothing."""
    if len(parts) > 1:
        parts[:] = [(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                     np.concatenate([p[2] for p in parts]))]
    return parts[0]


def both_keys(rows: pa.Table) -> pa.ChunkedArray:
    """The two key columns of pair rows end to end: one set lookup codes both (the first ``num_rows`` values are
    sha256_a's)."""
    return pa.chunked_array([*rows.column("sha256_a").chunks, *rows.column("sha256_b").chunks], pa.string())
