"""A curation's plan: everything it decides before anything is written (the rules: ``tasks.curation.curate``).

Features are loaded or computed, bad images set aside (``tasks.curation.outliers``), the
component graph built from the record, pixels, embeddings and copy scores, keys and splits
assigned (``tasks.curation.assignments``) and each component deduplicated
(``tasks.curation.dedupe``). What is written here: fastdup's private work folder, and the features computed
(a content-addressed cache, stored as soon as computed).
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from tasks.curation.assignments import Assignment, Record, RecordAfter, assign, bridge_rows
from tasks.curation.class_guard import guard_outliers, over_budget
from tasks.curation.copy_pairs import (
    PAIRS_TABLE,
    CopyScores,
    FreshPairs,
    blurred,
    score_config,
    store_scores,
)
from tasks.curation.curation_features import (
    FEATURES_SCHEMA,
    GALLERY_IMAGES,
    Features,
    ImageFeatures,
    UnionFind,
    clear_dir,
    compute_features,
    computed_vectors,
    feature_config,
    store_features,
    stored_vectors,
)
from tasks.curation.dedupe import GrownComponent, dedupe_component, extend_component
from tasks.curation.facts_store import open_facts
from tasks.curation.fastdup_optional import require_embedding
from tasks.curation.groups import Groups
from tasks.curation.kept_facts import KEPT_FACTS_SCHEMA, KeptFacts
from tasks.curation.mapped_arrays import mapped_copy
from tasks.curation.nearest import NEAREST_TABLE, NearestMap, nearest_map, store_nearest
from tasks.curation.neighbours import NeighbourPairs, index_dir, neighbour_pairs
from tasks.curation.outliers import constant_images, screen
from tasks.curation.pair_store import StoredScores
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.prior_walk import Grown, PriorWalk, Touched, prior_walk, touched_components
from tasks.curation.raw_images import BLOCK_BYTES, RawImages
from tasks.curation.raw_store import stored_raw
from tasks.curation.record_store import open_record
from tasks.curation.separation import separation_by_class
from tasks.curation.sha_list import Keys, SortedSubset
from tasks.curation.tables import (
    COMPONENTS_TABLE,
    CURATED_SCHEMA,
    EMBEDDINGS_TABLE,
    RawRows,
    drop_row,
)
from tasks.curation.vectors import RowView, stored_views
from tasks.data import lake
from tasks.settings import Settings

log = logging.getLogger("tasks.curation.curate")  # one logger for the whole curation


@dataclass
class Plan:
    """Everything a curation decides, before anything is written (pure given its inputs)."""

    curated: KeptFacts  # the kept rows without their image bytes: ``snapshot_batches`` adds them a block at a time
    images: RawImages  # the raw version's images (those of the scored pairs held): the snapshot's bytes
    dropped: list[dict[str, Any]]
    assignments: RecordAfter  # the whole record after this curation (the record read, this curation's rows over it)
    record_changed: bool
    record_changes: set[str] | None  # record rows added or renamed now; None: the record is written whole
    new_images: int
    embedded: int  # images embedded now (their features are stored as soon as computed)
    pairs: FreshPairs  # copy scores computed now, to store (``store_scores`` writes them a block at a time)
    nearest: NearestMap | None = None  # each eligible image's nearest score (the separation test's input), to store
    duplicates: list[tuple[str, str, float]] = field(default_factory=list)
    outliers: list[tuple[str, str, str, ImageFeatures]] = field(default_factory=list)
    gallery_labels: dict[str, str] = field(default_factory=dict)  # the labels of the images the galleries show
    info: dict[str, Any] = field(default_factory=dict)


def _plan(settings: Settings, raw_version: int, run_id: str, work: Path, cache_meta: dict[str, Any]) -> Plan:
    """Decide what is kept, dropped and where it goes; writes only ``work`` (fastdup's folder) and the features
    it computes (a content-addressed cache, its commit with ``cache_meta`` and the feature config: stored as soon as
    computed, never held while planning, and a retry embeds nothing again).

    Phases: the raw version's facts, features (stored or computed), bad images set aside, the component graph, keys
    and splits, then each component deduplicated.
    """
    cfg = settings.curation
    root = index_dir(settings.storage.lake_uri, settings.reports_path)
    by_sha, folder = stored_raw(settings.raw_table, raw_version, root)  # mapped beside the index: a batch adds its rows
    images = RawImages(settings.raw_table, raw_version)
    features, embedded, stored_before = _features(settings, by_sha, images, run_id, work, cache_meta, folder)
    record, record_version = open_record(settings, by_sha, folder)  # stored beside them too: the rows appended since
    eligible, dropped, outliers, abstained = screen(by_sha, features, record, cfg.outliers)
    eligible, dropped, outliers, kept_bad = guard_outliers(by_sha, eligible, dropped, outliers, cfg.max_class_drop_share)
    eligible = SortedSubset(eligible.base, mapped_copy(eligible.positions, work))  # held to the end: mapped (4 B/image)
    constant = constant_images(features.by_sha)  # outside the class budget (the facts are the raw version's)
    pixels = features.pixel_keys(by_sha)  # all that is read of the facts from here on: they go before the index is built
    vectors = features.vectors()
    del features
    asked = Keys.of(eligible)  # how the stored lists look them up: their own bytes
    raw_at = by_sha.positions_of(eligible)  # each eligible image's raw position (the pixel keys' and the record's)
    views = _views(settings, eligible, asked, vectors, work)
    del vectors  # read from the views' files from here on: not held
    graph = _group(settings, eligible, asked, record, pixels, raw_at, images, views, work)
    del views  # the neighbours are found: each view's row map (mapped in ``work``) is let go
    roots, graph.sets = graph.sets.roots(), None  # the parents jumped to their roots in place (mapped)
    assignments, groups, renamed, new_images, bridges = assign(
        roots, graph.eligible, record, raw_at, pixels, by_sha, graph.scores, cfg, raw_version, run_id, work)
    del roots
    nearest = nearest_map(settings.table_uri(NEAREST_TABLE), settings.table_uri(PAIRS_TABLE), by_sha, pixels,
                          raw_at, graph.scores, work)  # its arrays by table position mapped from files, not held
    graph.scores.forget_partners()  # the summary's images' partners: the walk gathers its own
    prior = prior_walk(settings, record, record_version, nearest)
    reuse = None if prior is None else (prior, touched_components(groups, record, raw_at, renamed, nearest, raw_version))
    decisions = _decide_duplicates(cfg, groups, assignments, pixels, constant, by_sha, graph, nearest, raw_at, dropped, reuse,
                                   {by_sha.names[c] for c in np.unique(by_sha.codes[raw_at]).tolist()})
    graph.scores.release_stored()  # the walk asked its last stored score: not held through the kept facts and writes
    dropped.extend(bridge_rows(bridges, by_sha, record, decisions["abstain"]))
    decisions = _decisions(decisions, kept_bad, by_sha)
    curated = _kept_facts(eligible, asked, raw_at, {d["sha256"] for d in dropped}, by_sha, assignments, work)

    dropped.sort(key=lambda d: (d["component"], d["sha256"]))
    outliers.sort(key=lambda o: (o[1], (o[3].blur if o[1] == "blurry" else o[3].mean) or 0.0, o[0]))
    info = {
        "features": {"config": feature_config(cfg), "method": cfg.embedding, "computed": embedded,
                     "stored_before": stored_before},
        "similarity": {"queries": graph.queries, "corpus": len(eligible),
                       "pairs_at_or_above_threshold": graph.found,
                       "search": graph.search},
        "copies": {"candidates": graph.candidates, "copy_edges": graph.copy_edges,
                   "pairs_scored": graph.scores.fresh.count,
                   "stored_pairs_read": graph.scores.stored.count, "stored_pair_scans": graph.scores.stored.scans,
                   "stored_pair_scan_s": round(graph.scores.stored.seconds, 2),
                   "score": score_config(),
                   "threshold": cfg.copy_similarity},
        "assignments": {"table": settings.table_uri(COMPONENTS_TABLE), "read_version": record_version,
                        "recorded_before": len(record), "new": new_images, "merged_keys": len(renamed)},
        "decisions": decisions,
    }
    # Rules that could not show they separate on this data: they dropped nothing, and say why.
    info.setdefault("decisions", {}).setdefault("abstained", []).extend(abstained)
    graph.scores.fresh.seal()  # the walk asked its last question: what is kept of the pairs is what is stored
    return Plan(
        pairs=graph.scores.fresh,
        curated=curated,
        images=images,
        dropped=dropped,
        assignments=assignments,
        record_changed=new_images > 0 or bool(renamed),
        record_changes=assignments.changed() if record else None,
        new_images=new_images,
        embedded=embedded,
        duplicates=graph.duplicates,
        outliers=outliers,
        gallery_labels={s: by_sha.label(s) for s in _gallery_shas(graph.duplicates, outliers)},
        info=info,
        nearest=nearest,
    )


FEATURE_CHUNK = 20_000  # images decoded per call: their bytes and row dicts are held one chunk at a time
ROW_BLOCK = 65_536  # rows a block: the snapshot's batches, candidate pairs read, this many at once


def _kept_facts(eligible: SortedSubset, asked: Keys, raw_at: np.ndarray, dropped: Collection[str], by_sha: RawRows,
                assignments: RecordAfter, work: Path) -> KeptFacts:
    """Every eligible image (``asked``: their sorted byte array; ``raw_at``: each one's raw position) that was not
    ``dropped`` (the walk's drops and the split bridges), with its split after ``assignments``, by position
    (``tasks.curation.kept_facts``: an Arrow table of every kept row was the end of the plan's high at a million
    images), mapped from ``work`` (held through the writes)."""
    return KeptFacts.of(asked, raw_at, dropped, by_sha, assignments.split_codes(eligible, raw_at, work), work)


def snapshot_batches(facts: KeptFacts, images: RawImages) -> Iterator[pa.RecordBatch]:
    """The curated snapshot's rows, ``ROW_BLOCK`` at a time, each block's image bytes gathered as it goes.

    From the images held for the copy scores when they hold every kept row (a batch's new rows, a full
    run's), else from one scan of the raw version in its own order; a batch holds about ``BLOCK_BYTES`` of images
    at most. The snapshot is never a second copy
    of the dataset's images in memory (at a million images that copy set the curation's peak).
    """
    shas = facts.shas()
    if images.holds(shas):
        step = min(ROW_BLOCK, images.rows_within(BLOCK_BYTES))  # ROW_BLOCK photos would be GBs
        for start in range(0, facts.num_rows, step):
            yield _with_images(facts.table(slice(start, start + step)), images.column(shas[start:start + step]))
        return
    del shas
    for block in images.blocks(facts.sha_column(), position="at"):  # each row's place among the kept: no lookup a block
        rows = facts.table(block.column("at").to_numpy())
        for start in range(0, rows.num_rows, ROW_BLOCK):
            yield _with_images(rows.slice(start, ROW_BLOCK), block.column("image").slice(start, ROW_BLOCK))


def _with_images(facts: pa.Table, images: pa.ChunkedArray) -> pa.RecordBatch:
    columns = [facts.column(name).combine_chunks() for name in KEPT_FACTS_SCHEMA.names]
    columns.insert(CURATED_SCHEMA.get_field_index("image"), images.combine_chunks())
    return pa.RecordBatch.from_arrays(columns, schema=CURATED_SCHEMA)


def _features(settings: Settings, rows: RawRows, images: RawImages, run_id: str, work: Path,
              cache_meta: dict[str, Any], folder: Path) -> tuple[Features, int, int]:
    """(the features of these images, how many were computed now, how many were stored): each image is embedded
    once. The rows computed now are stored before the planning goes on (at a million images, about 0.5 GB
    that were held to the end of the plan). The facts are in the raw rows' order and share their map (``at``), kept
    beside the raw version's stored rows (``folder``: ``tasks.curation.facts_store``) once every image has them."""
    cfg, uri = settings.curation, settings.table_uri(EMBEDDINGS_TABLE)
    kept = open_facts(rows, folder, uri, feature_config(cfg))
    try:
        facts, stored = kept.facts, kept.stored
        missing = np.flatnonzero(~stored)
        fresh = _computed(cfg, images, [rows.shas[i] for i in missing.tolist()], len(rows), work, run_id)
        if fresh.num_rows:
            store_features(uri, fresh, {**cache_meta, "feature_config": feature_config(cfg), "step": "curate_features"})
            at = rows.shas.keys.positions(fresh.column("sha256"))
            facts.fill(at[at >= 0], fresh.filter(pa.array(at >= 0)))
            stored[at[at >= 0]] = True
        if not stored.all():
            raise KeyError(f"{int((~stored).sum())} images have neither stored nor computed features")
        kept.publish(uri)
    finally:
        kept.discard()
    return Features(facts, *computed_vectors(fresh, rows)), fresh.num_rows, len(rows) - len(missing)


def _computed(cfg: Any, images: RawImages, missing: list[str], total: int, work: Path, run_id: str) -> pa.Table:
    """The features of the ``missing`` images (of ``total``: all of them, one scan of the raw version), computed now
    ``FEATURE_CHUNK`` at a time."""
    parts = [FEATURES_SCHEMA.empty_table()]
    for block in images.blocks(None if len(missing) == total else missing) if missing else ():
        for start in range(0, block.num_rows, FEATURE_CHUNK):
            chunk = block.slice(start, FEATURE_CHUNK)
            pairs = zip(chunk.column("sha256").to_pylist(), chunk.column("image").to_pylist())
            parts.append(compute_features(list(pairs), cfg, work, run_id))
    return pa.concat_tables(parts)


@dataclass
class _Graph:
    """The component graph over the eligible images and what building it found."""

    eligible: SortedSubset  # a component's root is its smallest sha256
    sets: UnionFind | None  # None once its roots are taken
    queries: int  # eligible images not in the record yet: the only ones compared
    scores: CopyScores
    found: int = 0  # pairs at or above near_duplicate_threshold
    duplicates: list[tuple[str, str, float]] = field(default_factory=list)
    candidates: int = 0  # candidate pairs scored or found scored
    copy_edges: int = 0
    search: str = ""


def _group(settings: Settings, eligible: SortedSubset, asked: Keys, record: Record, pixels: PixelKeys,
           raw_at: np.ndarray, images: RawImages, views: list[RowView], work: Path) -> _Graph:
    """Recorded components as they are, plus edges from unrecorded images: same pixels, similar, copies (the
    neighbours from ``views``: the embedding's views of ``eligible``, by position; the union-find mapped in ``work``)."""
    cfg = settings.curation
    sets, pending = _known_sets(raw_at, record, pixels, work)
    neighbours = _neighbours(settings, eligible, asked, views, pending)
    for a, b in _rows(neighbours.similar):
        sets.union(a, b)
    best = neighbours.most_similar(GALLERY_IMAGES)
    found, search, candidates = len(neighbours.similar), neighbours.search, neighbours.candidates
    del neighbours  # the similar pairs: not held while scoring
    # The signatures come from one scan of the pairs' images. It leaves their bytes held for the snapshot and the
    # report within a budget (a batch's); past it (a first curation's every image) those steps scan again.
    # The stored scores are read by image as the phases ask (the new images and their candidates first).
    scores = CopyScores(images, StoredScores(settings.table_uri(PAIRS_TABLE), score_config(), eligible, keys=asked),
                        scan=images.blocks_holding)
    scores.want(eligible[i] for i in np.union1d(candidates.ravel(), pending).tolist())
    copy_edges = _link_copies(cfg, eligible, candidates, scores, sets)
    scores.forget_partners()
    return _Graph(eligible, sets, len(pending), scores, found, [(eligible[a], eligible[b], s) for a, b, s in best],
                  len(candidates), copy_edges, search)


def _known_sets(at: np.ndarray, record: Record, pixels: PixelKeys, scratch: Path) -> tuple[UnionFind, np.ndarray]:
    """(the recorded components as they are, each new image joined to the first eligible image of its pixels; the
    new images' positions).

    A recorded image's parent is its component's first eligible image, set for all at once from the components as
    integer codes (a map from each component to its first image, a Python int each, was about 75 MB at a million).
    ``at``: the eligible images' raw positions; ``scratch``: the folder the union-find's parents are mapped from."""
    sets = UnionFind(len(at), scratch)
    codes = record.component_codes(at, scratch)  # mapped: 4 bytes an image
    pending = np.flatnonzero(codes < 0)
    sets.attach_codes(codes, scratch)  # a recorded component's first image: its members' root
    del codes
    for i, first in zip(pending.tolist(), pixels.first_alike(at, pending).tolist()):
        sets.union(i, first)
    return sets, pending


def _views(settings: Settings, eligible: list[str], asked: Keys, features: Features, work: Path) -> list[RowView]:
    """The embedding (and, for pixels, the blurred embedding) of the eligible images, by position (their row maps
    mapped in ``work``).

    Read from their memory-mapped files (``tasks.curation.vectors``), extended first with the images they lack:
    this run's fresh rows (``features``), or the stored rows when a file is rebuilt.
    """
    cfg = settings.curation
    config = feature_config(cfg)

    def vectors_of(shas: list[str]) -> np.ndarray:  # computed now (the batch's own images), else stored
        stored = [s for s in shas if s not in features.row_of]
        older = stored_vectors(settings.table_uri(EMBEDDINGS_TABLE), config, stored) if stored else None
        if older is None:
            return features.matrix[[features.row_of[s] for s in shas]]
        at = {s: i for i, s in enumerate(stored)}
        return np.stack([features.matrix[features.row_of[s]] if s not in at else older[at[s]] for s in shas])

    derived = [lambda m: blurred(m, cfg.feature_size)] if cfg.embedding == "pixels" and eligible else []
    return stored_views(index_dir(settings.storage.lake_uri, settings.reports_path), config, eligible, vectors_of,
                        derived, asked, work)


def _neighbours(settings: Settings, eligible: list[str], asked: Keys, views: list[RowView], pending: np.ndarray
                ) -> NeighbourPairs:
    """The new images' similar pairs and copy candidates from their nearest eligible images in every view (the
    faiss index beside the views' files), found a block of queries at a time."""
    cfg = settings.curation
    return neighbour_pairs(views, eligible, pending, cfg.similar_neighbours, cfg.copy_candidates,
                           cfg.near_duplicate_threshold, cfg.exact_search_below,
                           index_dir(settings.storage.lake_uri, settings.reports_path), feature_config(cfg), asked)


def _decide_duplicates(cfg: Any, groups: Groups, assignments: Mapping[str, Assignment],
                       pixels: PixelKeys, constant: set[str], by_sha: RawRows, graph: "_Graph",
                       nearest: NearestMap, raw_at: np.ndarray,
                       dropped: list[dict[str, Any]], reuse: tuple[PriorWalk, Touched] | None,
                       labels: set[str]) -> dict[str, Any]:
    """The decisions, with the walk's drops added to ``dropped`` (every member not dropped is kept), after the class
    tests (of ``labels``: the eligible images' classes): separation first, then the class guard.

    A class whose copies do not stand out from its bulk (``tasks.curation.separation``) abstains;
    a class that would still lose more than its share (``tasks.curation.class_guard``) abstains
    too, and the components are deduplicated again with it (scores are cached: nothing is re-scored).
    With the previous curation's walk (``reuse``: it and the components touched since), a component
    nothing touched keeps its decisions (``tasks.curation.prior_walk``), one that only gained new images has its
    walk extended with them (``dedupe.extend_component``); the rest are walked.
    """
    seps = separation_by_class(labels, nearest.by_label(), cfg.copy_similarity,
                               cfg.copy_min_separation, cfg.copy_min_class_images)
    abstain = {label: sep.why for label, sep in seps.items() if not sep.separates}
    walk = functools.partial(_dedupe, groups=groups, assignments=assignments, pixels=pixels, by_sha=by_sha,
                             scores=graph.scores, threshold=cfg.copy_similarity, abstain=abstain)

    def of_classes(classes: set[str]) -> set[str]:  # the members' class codes a block at a time: no string a member
        wanted = np.array([n in classes for n in by_sha.names], dtype=bool)
        return groups.keys_where(lambda members: wanted[by_sha.codes[raw_at[members]]])

    prior, grown = None, {}
    if reuse is None:
        keys = sorted(groups)
    else:
        prior, touched = reuse
        keys = prior.to_walk(touched.whole, abstain, of_classes)
        whole = set(keys)
        grown = {k: _Extension(g, prior.outcome(k, g.merged)) for k, g in touched.grown.items() if k not in whole}
    removed, possible, extended = walk(keys, grown=grown, raw_at=raw_at)
    walked_now = (set(keys) | set(grown)) - extended
    if prior is not None:
        for key in sorted(prior.drops):  # the components with drops then (not every key, a string each)
            if key in groups and key not in walked_now and key not in extended:  # as decided then; the rest kept
                removed.extend(prior.outcome(key))
    while True:
        over = {k: v for k, v in over_budget(by_sha, dropped + removed, cfg.max_class_drop_share, constant).items()
                if k not in abstain}
        if not over:
            break
        abstain.update(over)
        # Only components with a member of a newly abstaining class can decide otherwise: they are walked again.
        again = of_classes(set(over))
        rewalked = {s for k in again for s in groups[k]}
        removed_again, possible_again, _ = walk(sorted(again))
        walked_now |= again
        extended -= again
        removed = [d for d in removed if d["component"] not in again] + removed_again
        possible = [p for p in possible if p[0] not in rewalked] + possible_again
    dropped.extend(removed)
    walked = {"walked": len(walked_now), "extended": len(extended),
              "reused": len(groups) - len(walked_now) - len(extended),
              "reused_from_curated_version": prior.curated_version if prior is not None else None}
    return {"abstain": abstain, "possible": possible,
            "separation": {label: sep.to_dict() for label, sep in seps.items()},
            "max_class_drop_share": cfg.max_class_drop_share, "components": walked}


def _decisions(dup: dict[str, Any], kept_bad: list[dict[str, Any]], by_sha: RawRows
               ) -> dict[str, Any]:
    """The report's ``decisions``: where the rules abstained and why, and what was kept because of it."""
    possible = [{"sha256": s, "partner": p, "score": round(v, 6), "label": by_sha.label(s)}
                for s, p, v in sorted(dup["possible"])]
    count: dict[str, int] = {}
    for p in possible:
        count[p["label"]] = count.get(p["label"], 0) + 1
    walked = dup["components"]
    grew = f" and the new images of {walked['extended']} that grew" if walked["extended"] else ""
    where = "" if not (walked["reused"] or walked["extended"]) else (
        f" in the {walked['walked']} components walked now{grew} (the other members as curated version "
        f"{walked['reused_from_curated_version']} decided)")
    abstained = [{"rule": "near_duplicate", "label": label,
                  "why": f"{why}; kept {count.get(label, 0)} possible copies{where}"}
                 for label, why in sorted(dup["abstain"].items())]
    abstained += [{k: d[k] for k in ("rule", "label", "why")} for d in kept_bad]
    outliers = [{**o, "label": d["label"]} for d in kept_bad for o in d["kept"]]
    if abstained:
        log.warning("curate: abstained in %d class(es) (%s): kept %d possible copies and %d possible bad images "
                    "instead of dropping them; see decisions in the report", len(abstained),
                    ", ".join(sorted({a["label"] for a in abstained})), len(possible), len(outliers))
    return {"abstained": abstained, "possible_copies": possible, "possible_outliers": outliers,
            "separation": dup["separation"], "max_class_drop_share": dup["max_class_drop_share"],
            # possible copies are listed for the components walked now and the new members of those extended
            "components": dup["components"]}


class _Extension(NamedTuple):
    """A component that only grew (``prior_walk.Grown``) and the drop rows of its last walks, named after it."""

    grown: Grown
    drops: list[dict[str, Any]]


def _dedupe(keys: list[str], *, groups: Groups, assignments: Mapping[str, Assignment],
            pixels: PixelKeys, by_sha: RawRows, scores: CopyScores, threshold: float,
            abstain: Collection[str] = (), grown: Mapping[str, _Extension] | None = None,
            raw_at: np.ndarray | None = None,
            ) -> tuple[list[dict[str, Any]], list[tuple[str, str, float]], set[str]]:
    """(drop rows, possible copies, the components extended) of the components ``keys``, each walked first assigned
    first (every member not dropped is kept), and of those ``grown``, each extended with its new members (walked
    whole when the extension declines: a clash, or a merge whose parts share a copy)."""
    first_version = lambda s: assignments[s].first_raw_version  # noqa: E731
    before = {key: GrownComponent(key, groups, g.grown.new, raw_at, pixels, by_sha.label, first_version,
                                  [d["sha256"] for d in g.drops], g.grown.parts) for key, g in (grown or {}).items()}
    # the stored pairs of the members walked and of what the extensions read, in one scan
    scores.want([*(s for key in keys for s in groups[key]), *(s for b in before.values() for s in b.to_read())])
    dropped: list[dict[str, Any]] = []
    possible: list[tuple[str, str, float]] = []
    extended: set[str] = set()
    for key, b in before.items():
        removed = extend_component(b, scores, threshold, abstain, possible)
        scores.forget_partners()
        if removed is not None:
            extended.add(key)
            dropped += grown[key].drops + [drop_row(by_sha[s], reason, key, rep, detail)  # type: ignore[index]
                                           for s, reason, rep, detail in removed]
    del before
    declined = set(grown or ()) - extended
    scores.want(s for key in declined for s in groups[key])  # a declined component is walked whole: its pairs
    for key in sorted({*keys, *declined}):
        order = sorted(groups[key], key=lambda s: (assignments[s].first_raw_version, s))
        _, removed = dedupe_component(order, pixels, {s: by_sha.label(s) for s in order}, scores, threshold,
                                      abstain, possible)
        scores.forget_partners()  # a component's members are no other's
        dropped.extend(drop_row(by_sha[s], reason, key, rep, detail) for s, reason, rep, detail in removed)
    return dropped, possible, extended


def _link_copies(cfg: Any, eligible: list[str], candidates: np.ndarray, scores: CopyScores, sets: UnionFind) -> int:
    """Score the new images' candidate pairs; a copy joins its original's component (copies never straddle splits).

    ``candidates``: (n, 2) eligible positions (``neighbours.candidate_pairs``). Returns how many were copies.
    """
    scores.score_positions(candidates, eligible)
    copy_edges = 0
    for i, j in _rows(candidates):
        if scores.get(eligible[i], eligible[j]) >= cfg.copy_similarity:
            sets.union(i, j)
            copy_edges += 1
    return copy_edges


def _rows(pairs: np.ndarray) -> Iterator[list[int]]:
    """The rows of an (n, 2) array as Python ints, a block at a time (no Python list of every pair)."""
    for start in range(0, len(pairs), ROW_BLOCK):
        yield from pairs[start:start + ROW_BLOCK].tolist()


def store_caches(settings: Settings, plan: Plan, metadata: dict[str, Any]) -> None:
    """Copy scores and the nearest summary computed by this plan (content-addressed caches: a re-run adds nothing;
    the features were stored as the plan computed them)."""
    if plan.pairs.count:
        store_scores(settings.table_uri(PAIRS_TABLE), plan.pairs, metadata["run_id"],
                     {**metadata, "step": "curate_pairs", "score_config": score_config()})
    if plan.nearest is not None:  # after the pairs: stamped with the pairs' version it is complete for
        store_nearest(settings.table_uri(NEAREST_TABLE), plan.nearest,
                      lake.current_version(settings.table_uri(PAIRS_TABLE)), metadata)


def plan_in_workdir(settings: Settings, raw_version: int, run_id: str, cache_meta: dict[str, Any]) -> Plan:
    """Plan with fastdup's exported copies in a private folder that never outlives the call.

    Refused before any work when ``curation.embedding`` needs fastdup and it is not installed.
    """
    require_embedding(settings.curation)
    parent = settings.reports_path / "curation"
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=parent))
    try:
        return _plan(settings, raw_version, run_id, work, cache_meta)
    finally:
        clear_dir(work)


def gallery_shas(plan: Plan) -> set[str]:
    """The images the galleries show: the most similar pairs' and the bad images'."""
    return _gallery_shas(plan.duplicates, plan.outliers)


def _gallery_shas(duplicates: list[tuple[str, str, float]], outliers: list[tuple[str, str, str, ImageFeatures]]
                  ) -> set[str]:
    return {s for a, b, _ in duplicates[:GALLERY_IMAGES] for s in (a, b)} | {o[0] for o in outliers}

