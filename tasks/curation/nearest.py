"""The stored nearest-score summary: each eligible image's nearest copy score, updated by a batch.

The class separation test (``tasks.curation.separation``) needs, for every eligible image, its
highest copy score to another eligible image of its label with other pixels (its "nearest"). Found
by scanning every image's scored partners, that is a cost per table on every batch. So the
``curation_nearest`` table keeps one row per eligible image of the last curation (sha256, label,
pixel key, nearest score, the partner that gave it), and a curation only applies what can change it:

* images that became eligible get their nearest from their own scored partners (stored or new);
* their pairs, and every pair scored now, raise the nearest of the other image when higher;
* an image whose nearest partner is no longer eligible is recomputed from its own partners.

The maximum over a grown set of pairs is the old maximum or one of the new pairs, so this gives the
same map as the full scan (``full_nearest``), and the same decisions. The summary is used only when
it was written against the current version of ``curation_pairs`` under the same score config (both
in its commit's metadata); otherwise (first run, a crash between the two writes, another writer,
a known image whose label or pixels changed) the map is computed in full and the table rewritten.
A batch upserts only the rows that changed (one MERGE commit, ``lake.upsert_rows``); a retry finds the summary
already at the pairs' version with nothing to add, and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from tasks.curation.copy_pairs import CopyScores, score_config
from tasks.curation.pixel_keys import key_of, token
from tasks.data import lake

NEAREST_TABLE = "curation_nearest"
WRITE_ROWS = 65_536  # rows built and written at a time when the summary is rewritten

NEAREST_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("pixel_key", pa.string(), nullable=False),
        pa.field("nearest", pa.float64(), nullable=True),  # None: no scored partner of its label
        pa.field("partner", pa.string(), nullable=True),
    ]
)

# (label, pixel key, nearest score, partner); the pixel key as ``pixel_keys.token`` holds it, a sha256 digest as its
# 32 bytes (the stored rows' 64-character strings were about 150 bytes an image with Python's table of interned ones)
Row = tuple[str, bytes | str, float | None, str | None]


@dataclass
class NearestMap:
    """Every eligible image's row, and what a store must write: ``changed`` rows, or all (``full``)."""

    rows: dict[str, Row]
    changed: set[str]  # empty after a full scan: every row is written
    full: bool
    pairs_version: int | None  # the curation_pairs version the stored summary was checked against
    # Updated from the stored summary: the images eligible now and not then, then and not now, and the
    # run that wrote it ({"run_id", "raw_version"}). None after a full scan: the earlier state is unknown.
    added: set[str] | None = None
    gone: set[str] | None = None
    written_by: dict[str, str | None] | None = None

    def by_label(self) -> dict[str, list[float]]:
        """label -> the nearest scores of its images that have one (what ``separation`` tests)."""
        out: dict[str, list[float]] = {}
        for label, _, score, _ in self.rows.values():
            if score is not None:
                out.setdefault(label, []).append(score)
        return out


class _Best:
    """Row builders over the current eligible images, labels, pixel keys and scores."""

    def __init__(self, eligible: set[str], label_of: Callable[[str], str], pixels_of: Callable[[str], bytes | str],
                 scores: CopyScores) -> None:
        self.eligible, self.label_of, self.pixels_of, self.scores = eligible, label_of, pixels_of, scores

    def row(self, sha: str) -> Row:
        """``sha``'s nearest among its scored partners (the full scan, for one image)."""
        label, pixels = self.label_of(sha), self.pixels_of(sha)
        best: tuple[float, str] | None = None
        for other, v in self.scores.partners(sha).items():
            if other in self.eligible and self.label_of(other) == label and self.pixels_of(other) != pixels:
                if best is None or v > best[0] or (v == best[0] and other < best[1]):
                    best = (v, other)
        return (label, pixels, None, None) if best is None else (label, pixels, best[0], best[1])

    def raised(self, row: Row, other: str, v: float) -> Row | None:
        """``row`` raised to the pair (its image, other) when the pair counts and is higher, else None."""
        label, pixels, current, _ = row
        if (other in self.eligible and self.label_of(other) == label and self.pixels_of(other) != pixels
                and (current is None or v > current)):
            return (label, pixels, v, other)
        return None


class _Changes:
    """The rows, updated in place, and what each changed row was before (``None``: a row added now)."""

    def __init__(self, rows: dict[str, Row]) -> None:
        self.rows, self._before = rows, {}

    def set(self, sha: str, row: Row) -> None:
        self._before.setdefault(sha, self.rows.get(sha))
        self.rows[sha] = row

    def raise_to(self, best: _Best, sha: str, other: str, v: float) -> None:
        row = best.raised(self.rows[sha], other, v)
        if row is not None:
            self.set(sha, row)

    def changed(self) -> set[str]:
        return {s for s, before in self._before.items() if before != self.rows[s]}


def full_nearest(eligible: Sequence[str], label_of: Callable[[str], str], pixels_of: Callable[[str], bytes | str],
                 scores: CopyScores, pairs_version: int | None = None) -> NearestMap:
    """Every eligible image's nearest from all its scored partners."""
    best = _Best(set(eligible), label_of, pixels_of, scores)
    scores.want_all()
    rows = {sha: best.row(sha) for sha in eligible}
    return NearestMap(rows, set(), True, pairs_version)


def update_nearest(prior: dict[str, Row], eligible: Sequence[str], label_of: Callable[[str], str],
                   pixels_of: Callable[[str], bytes | str], scores: CopyScores
                   ) -> tuple[dict[str, Row], set[str], set[str], set[str]] | None:
    """(rows, changed, added, gone) from the stored rows, the newly eligible images and the pairs scored now.

    ``prior`` is updated in place and returned as ``rows`` (a copy was a second map of the table's images, about
    0.1 GB at a million). None when a known image's label or pixels changed: the caller computes in full (from
    ``prior`` as it was: it is changed only after that check).
    """
    now = set(eligible)
    best = _Best(now, label_of, pixels_of, scores)
    if any(prior[s][0] != label_of(s) or prior[s][1] != pixels_of(s) for s in eligible if s in prior):
        return None
    gone = {s for s in prior if s not in now}
    for s in gone:
        del prior[s]
    rows = _Changes(prior)
    orphans = [s for s, row in prior.items() if row[3] in gone] if gone else []
    added = [s for s in eligible if s not in prior]
    scores.want([*orphans, *added])  # their stored partners, in one scan
    for s in orphans:  # nearest partners that left: recompute those images from their own partners
        rows.set(s, best.row(s))
    for s in added:
        rows.set(s, best.row(s))
    for s in added:
        for other, v in scores.partners(s).items():
            if other in prior:
                rows.raise_to(best, other, s, v)
    for a, b, v in scores.fresh.items():
        if a in prior and b in prior:
            rows.raise_to(best, a, b, v)
            rows.raise_to(best, b, a, v)
    return prior, rows.changed(), set(added), gone


def nearest_map(uri: str, pairs_uri: str, eligible: Sequence[str], label_of: Callable[[str], str],
                pixels_of: Callable[[str], bytes | str], scores: CopyScores) -> NearestMap:
    """The nearest map of this curation: the stored summary updated when it is current, else the full scan."""
    pairs_version = lake.current_version(pairs_uri)
    stored = _stored(uri, pairs_version)
    updated = None if stored is None else update_nearest(stored[0], eligible, label_of, pixels_of, scores)
    if stored is None or updated is None:
        return full_nearest(eligible, label_of, pixels_of, scores, pairs_version)
    rows, changed, added, gone = updated
    return NearestMap(rows, changed, bool(gone), pairs_version, added, gone, stored[1])


def _stored(uri: str, pairs_version: int | None) -> tuple[dict[str, Row], dict[str, str | None]] | None:
    """(the stored rows, the run that wrote them) when written against ``pairs_version`` under this score config."""
    version = lake.current_version(uri)
    if version is None or pairs_version is None:
        return None
    head = lake.commit_at(uri, version)
    if head is None or head.metadata.get("score_config") != score_config() \
            or head.metadata.get("pairs_version") != str(pairs_version):
        return None
    t = lake.read(uri, version, columns=["sha256", "label", "pixel_key", "nearest", "partner"])
    # Interned: the keys, labels and partners are the objects the plan's other maps hold; the pixel keys as tokens.
    rows = dict(zip(lake.interned(t.column("sha256")),
                    zip(lake.interned(t.column("label")), [token(k) for k in t.column("pixel_key").to_pylist()],
                        t.column("nearest").to_pylist(), lake.interned(t.column("partner")))))
    return rows, {k: head.metadata.get(k) for k in ("run_id", "raw_version")}


def store_nearest(uri: str, nearest: NearestMap, pairs_version: int | None, metadata: dict) -> None:
    """Write the changed rows (all of them after a full scan or a removal), stamped with the pairs' version."""
    meta = {**metadata, "step": "curate_nearest", "score_config": score_config(), "pairs_version": str(pairs_version)}
    if nearest.full:
        _overwrite(uri, nearest.rows, meta)
        return
    current = lake.current_version(uri)
    head = lake.commit_at(uri, current) if current is not None else None
    if not nearest.changed and head is not None and head.metadata.get("pairs_version") == str(pairs_version):
        return  # a retry: already stored against these pairs
    rows = _table(nearest.rows, sorted(nearest.changed))
    if rows.num_rows == 0:  # nothing changed but the pairs moved on: stamp the new version
        _overwrite(uri, nearest.rows, meta)
        return
    lake.upsert_rows(uri, rows, "sha256", meta)  # one commit: a crash leaves the old stamp or the new rows


def _overwrite(uri: str, rows: dict[str, Row], meta: dict) -> None:
    """Every row, in sha256 order, written ``WRITE_ROWS`` at a time (at a million images, the table's strings
    built at once were about 0.3 GB beside the plan)."""
    shas = sorted(rows)

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(shas), WRITE_ROWS):
            yield from _table(rows, shas[start:start + WRITE_ROWS]).to_batches()

    lake.overwrite_stream(uri, NEAREST_SCHEMA, batches, meta)


def _table(rows: dict[str, Row], shas: list[str]) -> pa.Table:
    picked = [rows[s] for s in shas]
    return pa.table({"sha256": shas, "label": [r[0] for r in picked], "pixel_key": [key_of(r[1]) for r in picked],
                     "nearest": [r[2] for r in picked], "partner": [r[3] for r in picked]}, schema=NEAREST_SCHEMA)
