"""Curate one raw version into the ``curated_images`` snapshot: bad images, duplicates, conflicts, splits.

What happens to each image of the raw version, in order (the first rule that applies wins):

1. No features: it does not decode (``undecodable``) or fastdup refuses the exported copy
   (``fastdup_invalid``).
2. Bad image, from fastdup's image statistics and ``curation.outliers`` (``outlier_reason``):
   ``too_small`` (decoded width or height below ``min_training_side``), ``too_dark`` (mean below
   ``min_mean``), ``too_bright`` (mean above ``max_mean``), ``blurry`` (variance of the
   Laplacian below ``min_blur``). Bad images are left out of the duplicate graph: a black
   frame is "similar" to every other black frame whatever its label.
3. Components (grouping, generous): exact duplicates (same decoded pixels, ``pixel_digest``),
   near-duplicates (cosine of the embeddings at or above ``near_duplicate_threshold``) and copies
   (below) are edges; connected components are built with union-find. A component decides a
   split, so near-copies never straddle splits; it drops nothing by itself. Features are
   computed once per image and kept in ``curation_embeddings`` (``tasks.curation.curation_features``);
   only images that have no component yet are compared, against all eligible images of the raw
   version.
4. Copies (``tasks.curation.copy_pairs``): each new image's ``copy_candidates`` nearest neighbours by the
   embedding (and, for pixels, by the blurred embedding) get the copy score
   (``tasks.curation.copy_score``: alignment-, blur- and brightness-tolerant correlation); a pair at or
   above ``copy_similarity`` is a copy. Scores are cached in ``curation_pairs``.
5. Inside a component (dropping, precise: ``dedupe_component``): members are walked first
   assigned first (lowest ``first_raw_version``, then smallest sha256), so a new copy never
   displaces an image that is already kept. A member is dropped only when it is a copy of an
   image already KEPT with its label (same pixels: ``exact_duplicate``; copy score at or above
   ``copy_similarity``: ``near_duplicate``, the detail giving that score), never through a
   chain A~B~C. A member that is a copy of a member with another label is quarantined with
   it (``label_conflict``): nobody can tell which label is right. Everything else is kept,
   in the component's split. ``copy_similarity`` (0.9974) is calibrated on planted copies
   against the most similar distinct images of the same class (``bench/dedup_calibration.py``)
   and measured end to end on curations of planted copies (``bench/curation_quality.py``).

Stable component keys and splits (the ``curation_components`` table, the assignment record):
every image that ever got a component keeps a row (sha256, component, split,
first_raw_version). A curation reads its newest version and only adds to it:

* An image already recorded keeps its component and split. Grouping of recorded images is
  never recomputed, so a new threshold or embedding applies to images seen from then on.
* A component of images none of which is recorded is new: its key is the smallest sha256 in it
  and its split is ``split_for(key)``, the salted hash of the key cut by ``split_ratios``.
* New images that join exactly one recorded component inherit its key and split.
* New images that join several recorded components of the SAME split merge them under the
  smallest of their keys; the split does not change for anyone.
* New images that would join recorded components of DIFFERENT splits are quarantined
  (``split_bridge``) and recorded nowhere; the recorded components stay apart and unmoved.

So a component's split is always ``split_for`` of its key (under the ratios in force when it
was first seen), near-duplicates never straddle splits, and adding data never moves an
image between splits: not test -> train, not any other way. Changing ``split_salt`` starts a
fresh record (and reshuffles every split): the record is only read when its salt matches.
Writes are ordered so that a crash anywhere can be re-run: features, then the record, then the
curated snapshot, then the report rows, JSON report and galleries.

Every dropped or quarantined image is a row of the ``curation_report`` Delta table (reason,
detail, component, kept representative, label, raw version, config hash, curated version, run
id), keyed by (raw_version, config_hash, sha256) so a re-run adds nothing; the same rows are in
the JSON report. fastdup's HTML galleries of the run's duplicates and bad images sit under the
reports folder and are returned in ``CurateResult.galleries``.

Why pixels are the default embedding (the facts): fastdup ignores images under 10x10 pixels
and the sample digits are 8x8. Upscaled copies are accepted, but fastdup's built-in model
saturates on them: on the 1,797 digits (upscaled to 32, 64 or 128 px, with or without
``high_accuracy``) nearly every k-NN edge scores >= 0.97, thousands of them between different
digits. The grey pixels at ``feature_size`` px, mean-centred and L2-normalised (cosine = pixel
correlation, which ignores brightness/contrast shifts and survives JPEG re-encoding at
~0.996+), give no cross-label pair at 0.97 on the digits. ``embedding: fastdup`` uses fastdup's
model for real photos.

Outlier defaults, tuned on the exported copies of the 1,797 digits (8x8 upscaled bilinear to
32x32): their blur is >= 90 (median 247), a Gaussian blur of 0.8 px already gives ~33 and of 1 px
~15, and a flat image 0, so ``min_blur`` is 50; their mean grey is 54..108, so 10 and 245 only
catch frames that are (nearly) black or white; ``min_training_side`` is 8, ingest's own floor, because 8x8
is simply the size of this dataset (for photos, raise it). The size test uses the decoded size,
not fastdup's, because fastdup only ever sees the upscaled copy.

Idempotent: the commit carries the raw version and the curation config hash; a re-run with
both unchanged returns the existing version and commits nothing anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.curation.copy_pairs import (
    PAIRS_TABLE,
    CopyScores,
    blurred,
    candidate_pairs,
    load_scores,
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
    feature_config,
    link_similar,
    load_features,
    merge_features,
    store_features,
    write_galleries,
)
from tasks.data import lake
from tasks.errors import DataError
from tasks.files import write_json
from tasks.settings import OutlierSettings, Settings

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
EMBEDDINGS_TABLE = "curation_embeddings"
COMPONENTS_TABLE = "curation_components"
REPORT_TABLE = "curation_report"

CURATED_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("image", pa.binary(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("component", pa.string(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
    ]
)

COMPONENTS_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("component", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("first_raw_version", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),  # the curation that first assigned it
    ]
)

REPORT_SCHEMA = pa.schema(
    [
        pa.field("raw_version", pa.int64(), nullable=False),
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=True),
        pa.field("component", pa.string(), nullable=False),
        pa.field("kept_sha256", pa.string(), nullable=True),
        pa.field("label", pa.string(), nullable=False),
        pa.field("curated_version", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("logical_date", pa.string(), nullable=False),
    ]
)
WALK_SCORED_MEMBERS = 64  # components up to this size score each member against every kept member
_DROP_FIELDS = ("sha256", "reason", "detail", "component", "kept_sha256", "label")


class OutlierRuleError(DataError, ValueError):
    """A bad-image rule would drop a large share of the images (``curation.outliers.max_share``)."""


class CurationError(DataError, RuntimeError):
    """Curation cannot produce a snapshot; the message says which input and why."""


@dataclass(frozen=True)
class CurateResult:
    curated_table: str
    curated_version: int
    raw_table: str
    raw_version: int
    committed: bool  # False when an identical curation (same raw_version + config hash) was reused
    kept: int
    counts_by_split: dict[str, int]
    counts_by_split_and_label: dict[str, dict[str, int]]
    dropped_by_reason: dict[str, int]
    report_path: str
    run_id: str
    logical_date: str
    galleries: dict[str, str] = field(default_factory=dict)  # name -> fastdup HTML gallery
    report_table: str = ""
    components_table: str = ""
    components_version: int | None = None  # the assignment record this version was curated with
    embeddings_table: str = ""
    new_images: int = 0  # images that got their component and split in this curation
    embedded: int = 0  # images whose features were computed in this curation (the rest were stored)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Assignment:
    """One row of the assignment record: where an image went when curation first saw it."""

    component: str
    split: str
    first_raw_version: int
    run_id: str


@dataclass
class _Plan:
    """Everything a curation decides, before anything is written (pure given its inputs)."""

    curated: pa.Table
    dropped: list[dict[str, Any]]
    assignments: dict[str, Assignment]  # the whole record after this curation
    record_changed: bool
    new_images: int
    feature_rows: pa.Table  # features computed now, to store
    pair_rows: pa.Table  # copy scores computed now, to store
    duplicates: list[tuple[str, str, float]] = field(default_factory=list)
    outliers: list[tuple[str, str, str, ImageFeatures]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- pure helpers


def split_for(component_key: str, salt: str, ratios: dict[str, float]) -> str:
    """train/val/test from the salted hash of the component key alone: stable across runs."""
    digest = hashlib.sha256(f"{salt}:{component_key}".encode()).hexdigest()
    u = int(digest, 16) / float(1 << 256)  # uniform in [0, 1)
    edge = 0.0
    for name in SPLITS:
        edge += ratios[name]
        if u < edge:
            return name
    return SPLITS[-1]  # float rounding when u is just below 1.0


def outlier_reason(width: int, height: int, stats: ImageFeatures, limits: OutlierSettings) -> tuple[str, str] | None:
    """(reason, detail) when an image is too small, too dark, too bright or blurry, else None."""
    if min(width, height) < limits.min_training_side:
        return "too_small", f"{width}x{height} has a side below min_training_side {limits.min_training_side}"
    if stats.mean is not None and stats.mean < limits.min_mean:
        return "too_dark", f"mean {stats.mean:.1f} < min_mean {limits.min_mean:g}"
    if stats.mean is not None and stats.mean > limits.max_mean:
        return "too_bright", f"mean {stats.mean:.1f} > max_mean {limits.max_mean:g}"
    if stats.blur is not None and stats.blur < limits.min_blur:
        return "blurry", f"blur {stats.blur:.1f} < min_blur {limits.min_blur:g}"
    return None


def _drop(row: dict[str, Any], reason: str, component: str, kept: str | None, detail: str | None) -> dict[str, Any]:
    return {"sha256": row["sha256"], "reason": reason, "component": component, "kept_sha256": kept,
            "label": row["label"], "detail": detail}


# ---------------------------------------------------------------- the assignment record


def read_assignments(settings: Settings) -> tuple[dict[str, Assignment], int | None]:
    """The newest assignment record for this salt (empty for another salt), and its version."""
    uri = settings.table_uri(COMPONENTS_TABLE)
    version = lake.current_version(uri)
    if version is None:
        return {}, None
    head = next(c for c in lake.history(uri) if c.version == version)
    if head.metadata.get("split_salt") != settings.curation.split_salt:
        log.warning("curate: %s was written with another split_salt: starting a fresh assignment record", uri)
        return {}, version
    t = lake.read(uri, version).to_pydict()
    return {
        s: Assignment(c, sp, int(v), r)
        for s, c, sp, v, r in zip(t["sha256"], t["component"], t["split"], t["first_raw_version"], t["run_id"])
    }, version


def _record_table(assignments: dict[str, Assignment]) -> pa.Table:
    shas = sorted(assignments)
    rows = [assignments[s] for s in shas]
    return pa.table(
        {"sha256": shas, "component": [a.component for a in rows], "split": [a.split for a in rows],
         "first_raw_version": [a.first_raw_version for a in rows], "run_id": [a.run_id for a in rows]},
        schema=COMPONENTS_SCHEMA,
    )


# ---------------------------------------------------------------- planning


def _plan(settings: Settings, raw: pa.Table, raw_version: int, run_id: str, work: Path) -> _Plan:
    """Decide what is kept, dropped and where it goes; writes only ``work`` (fastdup's folder)."""
    cfg = settings.curation
    rows = sorted(raw.to_pylist(), key=lambda r: r["sha256"])
    by_sha = {r["sha256"]: r for r in rows}
    config = feature_config(cfg)

    stored = load_features(settings.table_uri(EMBEDDINGS_TABLE), config, set(by_sha))
    missing = [s for s in by_sha if s not in stored.by_sha]
    fresh = (compute_features([(s, by_sha[s]["image"]) for s in missing], cfg, work, run_id) if missing
             else FEATURES_SCHEMA.empty_table())
    features: Features = merge_features(stored, fresh)
    record, record_version = read_assignments(settings)

    eligible, dropped, outliers = _screen(by_sha, features, record, cfg.outliers)

    # Graph over eligible images: recorded components as they are, plus edges from unrecorded images.
    pos = {sha: i for i, sha in enumerate(eligible)}  # eligible is sorted: the root is the smallest sha256
    sets = UnionFind(len(eligible))
    first_of_component: dict[str, int] = {}
    for sha in eligible:
        if sha in record:
            sets.union(pos[sha], first_of_component.setdefault(record[sha].component, pos[sha]))
    pending = [pos[s] for s in eligible if s not in record]
    first_of_pixels: dict[str, int] = {}
    for sha in eligible:
        first_of_pixels.setdefault(_digest(features, sha), pos[sha])
    for i in pending:
        sets.union(i, first_of_pixels[_digest(features, eligible[i])])
    matrix = features.matrix[[features.row_of[s] for s in eligible]] if eligible else features.matrix[:0]
    found, best = link_similar(matrix, pending, cfg.near_duplicate_threshold, sets)
    duplicates = [(eligible[a], eligible[b], s) for a, b, s in best]
    scores = CopyScores(lambda sha: by_sha[sha]["image"],
                        load_scores(settings.table_uri(PAIRS_TABLE), set(eligible)))
    candidates, copy_edges = _link_copies(cfg, eligible, matrix, pending, scores, sets)

    members: dict[int, list[str]] = {}
    for sha in eligible:
        members.setdefault(sets.find(pos[sha]), []).append(sha)
    assignments, groups, renamed, new_images, bridges = _assign(
        list(members.values()), record, features, by_sha, scores, cfg, raw_version, run_id)
    dropped.extend(bridges)

    kept_rows: list[dict[str, Any]] = []
    for key in sorted(groups):
        order = sorted(groups[key], key=lambda s: (assignments[s].first_raw_version, s))
        kept, removed = dedupe_component(order, features, {s: by_sha[s]["label"] for s in order}, scores,
                                         cfg.copy_similarity)
        dropped.extend(_drop(by_sha[s], reason, key, rep, detail) for s, reason, rep, detail in removed)
        for sha in kept:
            r = by_sha[sha]
            kept_rows.append({"sha256": sha, "image": r["image"], "label": r["label"],
                              "split": assignments[sha].split, "component": key, "width": int(r["width"]),
                              "height": int(r["height"])})

    kept_rows.sort(key=lambda r: r["sha256"])
    dropped.sort(key=lambda d: (d["component"], d["sha256"]))
    outliers.sort(key=lambda o: (o[1], o[3].blur if o[1] == "blurry" else o[3].mean or 0.0, o[0]))
    info = {
        "features": {"config": config, "method": cfg.embedding, "computed": fresh.num_rows,
                     "stored_before": len(stored.by_sha)},
        "similarity": {"queries": len(pending), "corpus": len(eligible), "pairs_at_or_above_threshold": found,
                       "search": "exact cosine, new images against all eligible images (numpy)"},
        "copies": {"candidates": len(candidates), "copy_edges": copy_edges, "pairs_scored": len(scores.fresh),
                   "pairs_stored_before": len(scores.known) - len(scores.fresh), "score": score_config(),
                   "threshold": cfg.copy_similarity},
        "assignments": {"table": settings.table_uri(COMPONENTS_TABLE), "read_version": record_version,
                        "recorded_before": len(record), "new": new_images, "merged_keys": len(renamed)},
    }
    return _Plan(
        pair_rows=scores.fresh_rows(run_id),
        curated=pa.Table.from_pylist(kept_rows, schema=CURATED_SCHEMA),
        dropped=dropped,
        assignments=assignments,
        record_changed=new_images > 0 or bool(renamed),
        new_images=new_images,
        feature_rows=fresh,
        duplicates=duplicates,
        outliers=outliers,
        info=info,
    )


def _screen(by_sha: dict[str, dict[str, Any]], features: Features, record: dict[str, Assignment],
            limits: OutlierSettings) -> tuple[list[str], list[dict[str, Any]], list[tuple[str, str, str, ImageFeatures]]]:
    """(eligible shas in order, drop rows, outliers): images without features and bad images are set aside."""
    dropped: list[dict[str, Any]] = []
    outliers: list[tuple[str, str, str, ImageFeatures]] = []
    eligible: list[str] = []
    for sha, r in by_sha.items():
        f = features.by_sha[sha]
        home = record[sha].component if sha in record else sha  # bad images are not grouped
        if f.error is not None:
            reason = "undecodable" if f.error.startswith("undecodable") else "fastdup_invalid"
            dropped.append(_drop(r, reason, home, None, f.error))
            continue
        bad = outlier_reason(int(r["width"]), int(r["height"]), f, limits)
        if bad is not None:
            dropped.append(_drop(r, bad[0], home, None, bad[1]))
            outliers.append((sha, bad[0], bad[1], f))
            continue
        eligible.append(sha)
    _check_outlier_share(outliers, features, len(by_sha), limits)
    return eligible, dropped, outliers


_STATISTIC = {"blurry": ("blur", "min_blur"), "too_dark": ("mean", "min_mean"), "too_bright": ("mean", "max_mean")}


def _check_outlier_share(outliers: list[tuple[str, str, str, ImageFeatures]], features: Features, total: int,
                         limits: OutlierSettings) -> None:
    """Stop before dropping when one bad-image rule flags a large share: the threshold does not fit this data."""
    counts: dict[str, int] = {}
    for _, reason, _, _ in outliers:
        counts[reason] = counts.get(reason, 0) + 1
    for reason, n in sorted(counts.items()):
        if n < 10 or n / max(total, 1) <= limits.max_share:
            continue
        detail = ""
        if reason in _STATISTIC:
            stat, setting = _STATISTIC[reason]
            values = [getattr(f, stat) for f in features.by_sha.values() if getattr(f, stat) is not None]
            detail = (f" ({setting} {getattr(limits, setting):g}; this data's median {stat} "
                      f"{float(np.median(values)):.1f})" if values else f" ({setting} {getattr(limits, setting):g})")
        raise OutlierRuleError(
            f"curation.outliers: {reason} would drop {n} of {total} images ({n / total:.1%}, more than max_share "
            f"{limits.max_share:g}){detail}: the rule does not fit this dataset. Look at some of them, then set "
            f"the threshold for this data (e.g. in conf/datasets/<name>.yaml) or raise max_share; nothing was written"
        )


def _link_copies(cfg: Any, eligible: list[str], matrix: np.ndarray, pending: list[int], scores: CopyScores,
                 sets: UnionFind) -> tuple[set[tuple[int, int]], int]:
    """Score the new images' candidate pairs; a copy joins its original's component (copies never straddle splits).

    Returns (candidate pairs, how many were copies).
    """
    candidates = _copy_candidates(cfg, matrix, pending)
    scores.score_many((eligible[i], eligible[j]) for i, j in candidates)
    copy_edges = 0
    for i, j in candidates:
        if scores.get(eligible[i], eligible[j]) >= cfg.copy_similarity:
            sets.union(i, j)
            copy_edges += 1
    return candidates, copy_edges


def _assign(
    components: list[list[str]], record: dict[str, Assignment], features: Features, by_sha: dict[str, dict[str, Any]],
    scores: CopyScores, cfg: Any, raw_version: int, run_id: str,
) -> tuple[dict[str, Assignment], dict[str, list[str]], dict[str, str], int, list[dict[str, Any]]]:
    """Keys and splits for this curation's components (the rules in the module doc).

    Returns (the whole record after it, final component key -> eligible members, merged key -> key,
    images assigned now, drop rows of new images that would bridge splits).
    """
    dropped: list[dict[str, Any]] = []
    assignments = dict(record)
    renamed: dict[str, str] = {}
    groups: dict[str, list[str]] = {}  # final component key -> eligible members
    new_images = 0
    for group in components:
        recorded = sorted({record[s].component for s in group if s in record})
        split_of = {record[s].component: record[s].split for s in group if s in record}
        newcomers = [s for s in group if s not in record]
        if len(set(split_of.values())) > 1:
            named = ", ".join(f"{k} ({split_of[k]})" for k in recorded[:4])
            more = f" and {len(recorded) - 4} more" if len(recorded) > 4 else ""
            detail = f"would join recorded components {named}{more} in different splits"
            for s in newcomers:
                copied = _recorded_original(s, [m for m in group if m in record], features, by_sha, scores,
                                            cfg.copy_similarity)
                if copied is None:
                    dropped.append(_drop(by_sha[s], "split_bridge", recorded[0], None, detail))
                else:  # a copy needs no split: dropped as such, never kept across splits
                    reason, original, how = copied
                    dropped.append(_drop(by_sha[s], reason, record[original].component, original,
                                         f"{how} to the recorded image (it also {detail})"))
            for s in group:
                if s in record:
                    groups.setdefault(record[s].component, []).append(s)
            continue
        key = recorded[0] if recorded else min(group)
        split = split_of[key] if recorded else split_for(key, cfg.split_salt, dict(cfg.split_ratios))
        for other in recorded[1:]:
            renamed[other] = key
        for s in newcomers:
            assignments[s] = Assignment(key, split, raw_version, run_id)
            new_images += 1
        groups[key] = group
    if renamed:  # a merge relabels every recorded member, also those outside this raw version
        assignments = {s: replace(a, component=renamed.get(a.component, a.component)) for s, a in assignments.items()}

    return assignments, groups, renamed, new_images, dropped


def _digest(features: Features, sha: str) -> str:
    return features.by_sha[sha].pixel_digest or sha


def _by_digest(shas: list[str], features: Features) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in shas:
        out.setdefault(_digest(features, s), []).append(s)
    return out


def _copies_of(sha: str, among: Mapping[str, Any] | set[str], by_digest: dict[str, list[str]], features: Features,
               scores: CopyScores, threshold: float) -> list[tuple[str, str]]:
    """Images of ``among`` known now to be copies of ``sha``: (image, how), same pixels first, then scored pairs.

    ``by_digest`` groups ``among`` by decoded-pixel digest; a scored pair is a copy at ``threshold`` or above.
    """
    digest = _digest(features, sha)
    same = [(o, "same pixels") for o in by_digest.get(digest, ()) if o != sha]
    return same + [(o, f"copy score {v:.4f}") for o, v in scores.partners(sha).items()
                   if v >= threshold and o in among and _digest(features, o) != digest]


def _strongest(sha: str, copies: list[tuple[str, str]], scores: CopyScores, rank: Mapping[str, int]) -> tuple[str, str]:
    """The copy ``sha`` is most surely a copy of: same pixels, then the highest score, then the first in ``rank``."""
    return max(copies, key=lambda c: (c[1] == "same pixels", scores.get(sha, c[0]) or 0.0, -rank[c[0]]))


def _recorded_original(sha: str, recorded: list[str], features: Features, by_sha: dict[str, dict[str, Any]],
                       scores: CopyScores, threshold: float) -> tuple[str, str, str] | None:
    """(reason, recorded image, how) when a new image is a copy of a recorded image with its label, else None."""
    same_label = [r for r in recorded if by_sha[r]["label"] == by_sha[sha]["label"]]
    rank = {r: i for i, r in enumerate(same_label)}
    copies = _copies_of(sha, rank, _by_digest(same_label, features), features, scores, threshold)
    if not copies:
        return None
    original, how = _strongest(sha, copies, scores, rank)
    if how == "same pixels":
        return "exact_duplicate", original, "same decoded pixels"
    return "near_duplicate", original, how


def _copy_candidates(cfg: Any, matrix: np.ndarray, pending: list[int]) -> set[tuple[int, int]]:
    """Candidate pairs (eligible indices) of the new images: nearest neighbours by the embedding (and blurred)."""
    views = [matrix]
    if cfg.embedding == "pixels" and len(matrix) and matrix.shape[1] == cfg.feature_size ** 2:
        views.append(blurred(matrix, cfg.feature_size))
    return candidate_pairs(views, pending, cfg.copy_candidates)


def dedupe_component(order: list[str], features: Features, labels: dict[str, str], scores: CopyScores,
                     threshold: float) -> tuple[list[str], list[tuple[str, str, str | None, str]]]:
    """Which members of one component are kept: drop precisely, never through a chain.

    ``order`` is the component's members, first assigned first. Two members are copies when
    their decoded pixels are identical or their copy score (``tasks.curation.copy_score``) is at least
    ``threshold`` (``curation.copy_similarity``, calibrated on planted copies against distinct
    images). Walking in order, a member is dropped only when it is a copy of a member already
    KEPT with its label (not of something that was itself dropped, nor of a chain A~B~C), as
    ``exact_duplicate`` or ``near_duplicate`` of that image, with the score in the detail;
    otherwise it is kept. Pairs that are not scored yet are scored against the kept members in
    components of up to ``WALK_SCORED_MEMBERS`` members (larger ones use the candidate pairs'
    scores only). A member that is a known copy of a member with another label is quarantined
    (``label_conflict``) with that member: nobody can tell which label is right. Members only
    linked through the component (grouped generously for split assignment) are all kept.

    Returns (kept shas, [(sha, reason, kept sha or None, detail)]).
    """
    if len(order) == 1:
        return list(order), []
    index = {s: i for i, s in enumerate(order)}
    by_digest = _by_digest(order, features)
    label = [labels[s] for s in order]

    def known_copies(i: int) -> list[tuple[int, str]]:
        """Members that are copies of member i by what is known now (same pixels, or a scored pair)."""
        return [(index[o], how) for o, how in _copies_of(order[i], index, by_digest, features, scores, threshold)]

    clash: dict[int, tuple[int, str]] = {}  # member -> a known copy of it with another label
    for i in range(len(order)):
        other = next(((k, how) for k, how in known_copies(i) if label[k] != label[i]), None)
        if other is not None:
            clash[i] = other
    kept: list[int] = []
    kept_set: set[int] = set()
    removed: list[tuple[str, str, str | None, str]] = []
    for i, sha in enumerate(order):
        if i in clash:
            k, how = clash[i]
            removed.append((sha, "label_conflict", None,
                            f"copy ({how}) of {order[k][:12]} labelled {label[k]!r}, this one {label[i]!r}"))
            continue
        if len(order) <= WALK_SCORED_MEMBERS:  # small: score each kept member of its label now
            scores.score_many((sha, order[k]) for k in kept
                              if label[k] == label[i] and _digest(features, order[k]) != _digest(features, sha))
        originals = [(order[k], how) for k, how in known_copies(i) if k in kept_set and label[k] == label[i]]
        if not originals:
            kept.append(i)
            kept_set.add(i)
            continue
        original, how = _strongest(sha, originals, scores, index)
        if how == "same pixels":
            removed.append((sha, "exact_duplicate", original, "same decoded pixels as the kept image"))
        else:
            removed.append((sha, "near_duplicate", original, f"{how} to the kept image (drop at >= {threshold})"))
    return [order[i] for i in kept], removed


# ---------------------------------------------------------------- counts and report


def _counts(table: pa.Table) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    by_split = {s: 0 for s in SPLITS}
    by_label: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
    for split, label in zip(table.column("split").to_pylist(), table.column("label").to_pylist()):
        by_split[split] += 1
        by_label[split][label] = by_label[split].get(label, 0) + 1
    return by_split, {s: dict(sorted(v.items())) for s, v in by_label.items()}


def _reasons(dropped: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dropped:
        out[d["reason"]] = out.get(d["reason"], 0) + 1
    return dict(sorted(out.items()))


def _read_raw(settings: Settings, raw_version: int) -> pa.Table:
    raw = lake.read(settings.raw_table, raw_version, columns=["sha256", "image", "width", "height", "label"])
    if raw.num_rows == 0:
        raise CurationError(f"{settings.raw_table} version {raw_version} has no rows: nothing to curate")
    return raw


def _run_dir(settings: Settings, raw_version: int, config_hash: str) -> Path:
    return settings.reports_path / "curation" / f"raw{raw_version}_{config_hash}"


def report_path_for(settings: Settings, raw_version: int, config_hash: str) -> Path:
    return settings.reports_path / "curation" / f"curation_raw{raw_version}_{config_hash}.json"


def _write_report_rows(
    settings: Settings, raw_version: int, config_hash: str, curated_version: int, dropped: list[dict[str, Any]],
    run_id: str, logical: str,
) -> None:
    """One row per dropped image, keyed by (raw_version, config_hash, sha256): a re-run adds nothing."""
    rows = [{**{k: d[k] for k in _DROP_FIELDS}, "raw_version": raw_version, "config_hash": config_hash,
             "curated_version": curated_version, "run_id": run_id, "logical_date": logical} for d in dropped]
    metadata = {"run_id": run_id, "logical_date": logical, "step": "curate_report", "raw_version": str(raw_version),
                "config_hash": config_hash, "curated_version": str(curated_version)}
    lake.merge_new_rows(settings.table_uri(REPORT_TABLE), pa.Table.from_pylist(rows, schema=REPORT_SCHEMA),
                        ["raw_version", "config_hash", "sha256"], metadata)


def _stored_report_rows(settings: Settings, raw_version: int, config_hash: str) -> list[dict[str, Any]] | None:
    uri = settings.table_uri(REPORT_TABLE)
    version = lake.current_version(uri)
    if version is None:
        return None
    t = lake.read(uri, version, columns=list(_DROP_FIELDS),
                  filter=[("raw_version", "=", raw_version), ("config_hash", "=", config_hash)])
    return sorted(t.to_pylist(), key=lambda d: (d["component"], d["sha256"]))


def _existing_galleries(settings: Settings, raw_version: int, config_hash: str) -> dict[str, str]:
    folder = _run_dir(settings, raw_version, config_hash) / "galleries"
    if not folder.exists():
        return {}
    return {p.parent.name: str(p) for p in sorted(folder.glob("*/*.html"))}


def _report_body(
    settings: Settings, raw_version: int, config_hash: str, version: int, curated: pa.Table,
    dropped: list[dict[str, Any]], metadata: dict[str, Any], extra: dict[str, Any],
) -> dict[str, Any]:
    by_split, by_label = _counts(curated)
    return {
        "step": "curate",
        "raw_table": settings.raw_table,
        "raw_version": raw_version,
        "curated_table": settings.curated_table,
        "curated_version": version,
        "report_table": settings.table_uri(REPORT_TABLE),
        "config_hash": config_hash,
        "curation": settings.curation.model_dump(mode="json"),
        "run_id": metadata.get("run_id"),
        "logical_date": metadata.get("logical_date"),
        "rules": {
            "order": "no features > bad image (too_small, too_dark, too_bright, blurry) > split_bridge > "
                     "label_conflict > duplicate",
            "representative": "the member first assigned to the component (lowest first_raw_version), "
                              "then the smallest sha256",
            "component_key": "recorded in curation_components when first seen; a new component: its smallest sha256",
            "label_conflict": "a copy (same pixels or copy score >= copy_similarity) of an image with another label: "
                              "both are quarantined",
            "duplicate": f"a copy of an image already KEPT with its label: same decoded pixels (exact_duplicate) or "
                         f"copy score >= {settings.curation.copy_similarity} (near_duplicate); never through a chain",
            "split": "recorded split of the component; a new component: sha256(f'{split_salt}:{key}') as a "
                     "fraction of 2**256, cut by split_ratios",
            "split_bridge": "a new image that would join recorded components of different splits is quarantined "
                            "(dropped as a duplicate instead when it is a copy of one of their images)",
            "similarity": f"components (splits): cosine of {settings.curation.embedding} embeddings >= "
                          f"{settings.curation.near_duplicate_threshold}, identical decoded pixels, or a copy; "
                          f"copies: copy score of each new image's {settings.curation.copy_candidates} nearest "
                          f"neighbours (embedding and blurred embedding) >= {settings.curation.copy_similarity}",
        },
        "kept": curated.num_rows,
        "counts_by_split": by_split,
        "counts_by_split_and_label": by_label,
        "dropped_by_reason": _reasons(dropped),
        "dropped": dropped,
        **extra,
    }


# ---------------------------------------------------------------- entry point


def curate(settings: Settings, raw_version: int, run_id: str, logical_date: str) -> CurateResult:
    """Curate ``raw_version`` exactly (never "latest"); reuse an identical earlier curation."""
    logical = lake.normalise_logical_date(logical_date)
    config_hash = settings.section_hash("curation")
    prior = lake.find_commit(settings.curated_table, raw_version=str(raw_version), config_hash=config_hash,
                             step="curate")
    if prior is not None:
        return _reuse(settings, raw_version, config_hash, prior, run_id, logical)

    curated_uri, raw_uri = settings.curated_table, settings.raw_table
    raw = _read_raw(settings, raw_version)
    plan = _plan_in_workdir(settings, raw, raw_version, run_id)
    base_meta = {"run_id": run_id, "logical_date": logical, "raw_version": str(raw_version),
                 "config_hash": config_hash}
    _store_caches(settings, plan, {**base_meta, "feature_config": feature_config(settings.curation)})
    if plan.curated.num_rows == 0:
        raise CurationError(
            f"curating {raw_uri} version {raw_version} dropped every image ({_reasons(plan.dropped)}): nothing to write"
        )
    components_uri = settings.table_uri(COMPONENTS_TABLE)
    components_version = lake.current_version(components_uri)
    if plan.record_changed:  # before the snapshot: a retry after a crash re-plans against this record
        components_version = lake.overwrite(
            components_uri, _record_table(plan.assignments),
            {**base_meta, "step": "curate_components", "split_salt": settings.curation.split_salt,
             "new_images": plan.new_images},
        )
    reasons = _reasons(plan.dropped)
    metadata = {
        **base_meta,
        "raw_table": raw_uri,
        "step": "curate",
        "kept": plan.curated.num_rows,
        "dropped": len(plan.dropped),
        "dropped_by_reason": json.dumps(reasons, sort_keys=True),
        "components_version": str(components_version),
        "new_images": plan.new_images,
        "embedded": plan.feature_rows.num_rows,
    }
    version = lake.overwrite(curated_uri, plan.curated, metadata, configuration=lake.stats_columns_config(CURATED_SCHEMA))
    _write_report_rows(settings, raw_version, config_hash, version, plan.dropped, run_id, logical)
    shown = raw.filter(pc.is_in(raw.column("sha256"), value_set=pa.array(sorted(_gallery_shas(plan)), pa.string())))
    images = dict(zip(shown.column("sha256").to_pylist(), shown.column("image").to_pylist()))
    labels = dict(zip(raw.column("sha256").to_pylist(), raw.column("label").to_pylist()))
    galleries = write_galleries(_run_dir(settings, raw_version, config_hash) / "galleries", plan.duplicates,
                                plan.outliers, images, labels)
    report = report_path_for(settings, raw_version, config_hash)
    write_json(report, _report_body(settings, raw_version, config_hash, version, plan.curated, plan.dropped, metadata,
                                    {**plan.info, "galleries": galleries, "components_version": components_version}))
    by_split, by_label = _counts(plan.curated)
    result = CurateResult(
        curated_table=curated_uri, curated_version=version, raw_table=raw_uri, raw_version=raw_version,
        committed=True, kept=plan.curated.num_rows, counts_by_split=by_split, counts_by_split_and_label=by_label,
        dropped_by_reason=reasons, report_path=str(report), run_id=run_id, logical_date=logical,
        galleries=galleries, report_table=settings.table_uri(REPORT_TABLE), components_table=components_uri,
        components_version=components_version, embeddings_table=settings.table_uri(EMBEDDINGS_TABLE),
        new_images=plan.new_images, embedded=plan.feature_rows.num_rows,
    )
    _log_result(result)
    return result


def _store_caches(settings: Settings, plan: _Plan, metadata: dict[str, Any]) -> None:
    """Features and copy scores computed by this plan (content-addressed caches: a re-run adds nothing)."""
    if plan.feature_rows.num_rows:
        store_features(settings.table_uri(EMBEDDINGS_TABLE), plan.feature_rows, {**metadata, "step": "curate_features"})
    if plan.pair_rows.num_rows:
        store_scores(settings.table_uri(PAIRS_TABLE), plan.pair_rows,
                     {**metadata, "step": "curate_pairs", "score_config": score_config()})


def _plan_in_workdir(settings: Settings, raw: pa.Table, raw_version: int, run_id: str) -> _Plan:
    """Plan with fastdup's exported copies in a private folder that never outlives the call."""
    parent = settings.reports_path / "curation"
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=parent))
    try:
        return _plan(settings, raw, raw_version, run_id, work)
    finally:
        clear_dir(work)


def _gallery_shas(plan: _Plan) -> set[str]:
    shas = {s for a, b, _ in plan.duplicates[:GALLERY_IMAGES] for s in (a, b)}
    return shas | {o[0] for o in plan.outliers}


def _reuse(
    settings: Settings, raw_version: int, config_hash: str, prior: lake.Commit, run_id: str, logical: str
) -> CurateResult:
    """The answer of the curation that already ran; its report is rebuilt if it went missing."""
    curated_uri = settings.curated_table
    table = lake.read(curated_uri, prior.version, columns=["sha256", "label", "split"])
    report = report_path_for(settings, raw_version, config_hash)
    stored = _stored_report_rows(settings, raw_version, config_hash)
    if not stored and int(prior.metadata.get("dropped", "0")) > 0:
        # Crashed between the snapshot and its report rows: re-plan (features are stored) and record them.
        raw = _read_raw(settings, raw_version)
        plan = _plan_in_workdir(settings, raw, raw_version, prior.metadata.get("run_id", run_id))
        _write_report_rows(settings, raw_version, config_hash, prior.version, plan.dropped,
                           prior.metadata.get("run_id", run_id), prior.metadata.get("logical_date", logical))
        _store_caches(settings, plan, {"run_id": run_id, "logical_date": logical})
        stored = plan.dropped
    dropped = stored or []
    galleries = _existing_galleries(settings, raw_version, config_hash)
    if not report.exists():  # reports folder wiped: the Delta report is the record, the JSON its copy
        write_json(report, _report_body(settings, raw_version, config_hash, prior.version, table, dropped,
                                        prior.metadata, {"galleries": galleries, "rebuilt_from": REPORT_TABLE}))
    by_split, by_label = _counts(table)
    reasons = json.loads(prior.metadata.get("dropped_by_reason", "null") or "null") or _reasons(dropped)
    components_version = prior.metadata.get("components_version")
    result = CurateResult(
        curated_table=curated_uri, curated_version=prior.version, raw_table=settings.raw_table,
        raw_version=raw_version, committed=False, kept=table.num_rows, counts_by_split=by_split,
        counts_by_split_and_label=by_label, dropped_by_reason=reasons, report_path=str(report), run_id=run_id,
        logical_date=logical, galleries=galleries, report_table=settings.table_uri(REPORT_TABLE),
        components_table=settings.table_uri(COMPONENTS_TABLE),
        components_version=int(components_version) if components_version not in (None, "None") else None,
        embeddings_table=settings.table_uri(EMBEDDINGS_TABLE),
        new_images=int(prior.metadata.get("new_images", "0")), embedded=int(prior.metadata.get("embedded", "0")),
    )
    log.info("curate: reusing %s version %d for raw version %d", curated_uri, prior.version, raw_version)
    _log_result(result)
    return result


def _log_result(result: CurateResult) -> None:
    log.info("curate: %s v%d kept %d %s, dropped %s", result.curated_table, result.curated_version, result.kept,
             result.counts_by_split, result.dropped_by_reason)
    log.info("curate: report %s (table %s)", result.report_path, result.report_table)
    for name, path in result.galleries.items():
        log.info("curate: fastdup gallery %s: %s", name, path)
