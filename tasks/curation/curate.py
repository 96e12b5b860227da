"""Curate one raw version into the ``curated_images`` snapshot: bad images, duplicates, conflicts, splits.

What happens to each image of the raw version, in order (the first rule that applies wins):

1. No features: it does not decode (``undecodable``) or fastdup refuses the exported copy
   (``fastdup_invalid``).
2. Bad image, from the project's own image statistics (``tasks.curation.image_stats``) and
   ``curation.outliers`` (``tasks.curation.outliers``): ``too_small`` (a side below
   ``min_training_side``, or far below the data's own sizes), constant images (``too_dark``,
   ``too_bright``, ``flat``), then brightness, contrast and blur far outside this raw version's
   own bulk (``tasks.curation.bulk_limits``; absolute overrides replace them when set). Bad
   images are left out of the duplicate graph: a black frame is "similar" to every other
   black frame whatever its label.
3. Components (grouping, generous): exact duplicates (same decoded pixels, ``pixel_digest``),
   near-duplicates (cosine of the embeddings at or above ``near_duplicate_threshold``) and copies
   (below) are edges; connected components are built with union-find. A component decides a
   split, so near-copies never straddle splits; it drops nothing by itself. Features are
   computed once per image and kept in ``curation_embeddings`` (``tasks.curation.curation_features``);
   only images that have no component yet are compared, against all eligible images of the raw
   version, through their ``similar_neighbours`` nearest images (``tasks.curation.neighbours``: an
   exact search below ``exact_search_below`` eligible images, a stored faiss index above).
4. Copies (``tasks.curation.copy_pairs``): each new image's ``copy_candidates`` nearest neighbours in the same
   graph, by the embedding (and, for pixels, by the blurred embedding), get the copy score
   (``tasks.curation.copy_score``: alignment-, blur- and brightness-tolerant correlation); a pair at or
   above ``copy_similarity`` is a copy. Scores are cached in ``curation_pairs``.
5. Inside a component (dropping, precise: ``dedupe_component``): members are walked first
   assigned first (lowest ``first_raw_version``, then smallest sha256), so a new copy never
   displaces an image that is already kept. A member is dropped only when it is a copy of an
   image already KEPT with its label (same pixels: ``exact_duplicate``; copy score at or above
   ``copy_similarity``: ``near_duplicate``, the detail giving that score), never through a
   chain A~B~C. A member that is a copy of a member with another label is quarantined with
   it (``label_conflict``): nobody can tell which label is right. Everything else is kept,
   in the component's split. Precision first: a ``near_duplicate`` is dropped only in a class
   whose copies stand out from its bulk (``tasks.curation.separation``) and within the class's
   budget (``tasks.curation.class_guard``: at most ``max_class_drop_share`` of a class as
   near-duplicates plus bad images); otherwise the class abstains, keeps them and lists them as
   possible copies in the report's ``decisions``. ``copy_similarity`` (0.9974) is calibrated on planted copies
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
Writes are ordered so that a crash anywhere can be re-run: the caches (features, pair scores, the
nearest-score summary ``tasks.curation.nearest``), then the record (the rows added or renamed), then
the curated snapshot (the batch's kept rows appended when no row of the current version changes,
else whole), then the report rows, JSON report and galleries.

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

Bad-image rules are relative to the data by default (docs/curation.md#bad-image-rules, calibrated by
bench/outlier_calibration.py); the size test uses the decoded size.

Idempotent: the commit carries the raw version and the curation config hash; a re-run with
both unchanged returns the existing version and commits nothing anywhere.

Where it lives: this module is the entry point (``curate``) and the order of the writes;
``tasks.curation.plan`` decides (features, the component graph), with ``outliers`` (bad
images), ``assignments`` (the record, keys and splits) and ``dedupe`` (inside a component);
``report`` is the result and the report rows, JSON and log; ``reuse`` answers a curation
that already ran; ``tables`` names the tables and their schemas.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.curation.assignments import store_record
from tasks.curation.curation_features import feature_config, write_galleries
from tasks.curation.heap import map_large_blocks
from tasks.curation.kept_facts import KeptFacts
from tasks.curation.plan import Plan, gallery_shas, plan_in_workdir, snapshot_batches, store_caches
from tasks.curation.report import (
    CurateResult,
    count_reasons,
    log_result,
    report_body,
    report_path_for,
    run_dir,
    write_report_rows,
)
from tasks.curation.report_html import pictured, write_page
from tasks.curation.reuse import reuse_prior
from tasks.curation.tables import (
    COMPONENTS_TABLE,
    CURATED_SCHEMA,
    EMBEDDINGS_TABLE,
    REPORT_TABLE,
    CurationError,
)
from tasks.data import lake
from tasks.files import write_json
from tasks.settings import Settings

log = logging.getLogger(__name__)

# What callers outside the package use (DAGs, bench, tests); the rest has its own module.
__all__ = ["CURATED_SCHEMA", "REPORT_TABLE", "CurateResult", "CurationError", "curate"]


def curate(settings: Settings, raw_version: int, run_id: str, logical_date: str) -> CurateResult:
    """Curate ``raw_version`` exactly (never "latest"); reuse an identical earlier curation.

    Writes in crash-safe order: caches, the assignment record, the snapshot, then its reports.
    """
    map_large_blocks()  # what a phase frees goes back before the next one reads (tasks.curation.heap)
    logical = lake.normalise_logical_date(logical_date)
    config_hash = settings.section_hash("curation")
    prior = lake.find_commit(settings.curated_table, raw_version=str(raw_version), config_hash=config_hash,
                             step="curate")
    if prior is not None:
        return reuse_prior(settings, raw_version, config_hash, prior, run_id, logical)

    base_meta = {"run_id": run_id, "logical_date": logical, "raw_version": str(raw_version),
                 "config_hash": config_hash}
    plan = plan_in_workdir(settings, raw_version, run_id, base_meta)  # refuses an embedding not installed first
    store_caches(settings, plan, {**base_meta, "feature_config": feature_config(settings.curation)})
    if plan.curated.num_rows == 0:
        raise CurationError(
            f"curating {settings.raw_table} version {raw_version} dropped every image ({count_reasons(plan.dropped)}): "
            "nothing to write"
        )
    components_version = _record_assignments(settings, plan, base_meta)
    metadata = {
        **base_meta,
        "raw_table": settings.raw_table,
        "step": "curate",
        "kept": plan.curated.num_rows,
        "dropped": len(plan.dropped),
        "dropped_by_reason": json.dumps(count_reasons(plan.dropped), sort_keys=True),
        "components_version": str(components_version),
        "new_images": plan.new_images,
        "embedded": plan.embedded,
        # The classes whose near-duplicates were kept: the next batch reuses this curation's walk where nothing changed.
        "near_duplicate_abstained": json.dumps(sorted({a["label"] for a in plan.info["decisions"]["abstained"]
                                                       if a["rule"] == "near_duplicate"})),
    }
    version = _write_snapshot(settings, plan, metadata)
    write_report_rows(settings, raw_version, config_hash, version, plan.dropped, run_id, logical)
    galleries = _galleries(settings, plan, raw_version, config_hash)
    report = report_path_for(settings, raw_version, config_hash)
    by_split, by_label = plan.curated.counts()
    body = report_body(settings, raw_version, config_hash, version, (plan.curated.num_rows, by_split, by_label),
                       plan.dropped, metadata,
                       {**plan.info, "galleries": galleries, "components_version": components_version})
    write_json(report, body)
    page = write_page(run_dir(settings, raw_version, config_hash), body, plan.images.held_bytes(pictured(body)), report)
    result = CurateResult(
        curated_table=settings.curated_table, curated_version=version, raw_table=settings.raw_table,
        raw_version=raw_version, committed=True, kept=plan.curated.num_rows, counts_by_split=by_split,
        counts_by_split_and_label=by_label, dropped_by_reason=count_reasons(plan.dropped), report_path=str(report),
        run_id=run_id, logical_date=logical, galleries=galleries, report_table=settings.table_uri(REPORT_TABLE),
        components_table=settings.table_uri(COMPONENTS_TABLE), components_version=components_version,
        embeddings_table=settings.table_uri(EMBEDDINGS_TABLE), new_images=plan.new_images,
        embedded=plan.embedded, report_html=str(page),
    )
    log_result(result)
    return result


def _record_assignments(settings: Settings, plan: Plan, base_meta: dict[str, Any]) -> int | None:
    """The assignment record version this curation uses; a changed record is written first.

    Before the snapshot: a retry after a crash re-plans against this record. Only the rows this
    curation added or renamed are appended (one commit), unless the record is written whole
    (``assignments.store_record``).
    """
    components_uri = settings.table_uri(COMPONENTS_TABLE)
    if not plan.record_changed:
        return lake.current_version(components_uri)
    metadata = {**base_meta, "step": "curate_components", "split_salt": settings.curation.split_salt,
                "new_images": plan.new_images}
    version = store_record(components_uri, plan.assignments, plan.record_changes, metadata)
    return version if version is not None else lake.current_version(components_uri)


def _write_snapshot(settings: Settings, plan: Plan, metadata: dict[str, Any]) -> int:
    """The curated snapshot of this raw version: the newly kept rows appended when every row of the
    current version is kept as it is, else the whole snapshot (a version is always the full snapshot).

    A snapshot written before the component left it (``CURATED_SCHEMA``) is written whole, once.
    """
    uri = settings.curated_table
    table = lake.open_table(uri) if lake.exists(uri) else None
    added = _appended(table, plan.curated) if table is not None else None
    if added is not None and added.num_rows:  # against the version compared: a concurrent commit refuses it
        rows = pa.RecordBatchReader.from_batches(CURATED_SCHEMA, snapshot_batches(added, plan.images))
        version, _ = lake.append_stream(uri, rows, metadata, table)
        if version is not None:
            return version
    return lake.overwrite_stream(uri, CURATED_SCHEMA, lambda: snapshot_batches(plan.curated, plan.images), metadata,
                                 configuration=lake.stats_columns_config(CURATED_SCHEMA))


SNAPSHOT_KEY_COLUMNS = ["sha256", "label", "split", "width", "height"]  # the image follows the sha256


def _appended(table: Any, curated: KeptFacts) -> KeptFacts | None:
    """The rows of ``curated`` (the kept facts) to append to ``table``'s snapshot, or None when a row there
    changes or goes, or the table's columns are not this snapshot's.

    The stored key columns are read ``lake.SEARCH_BLOCK_ROWS`` at a time (read whole, they set a batch's peak at
    100,000 images); each stored row is found among the kept ones by binary search in the eligible images' byte array
    (``KeptFacts.find``: no sort of either side, no hash of every kept sha256 a block), then its key columns compared
    with the kept rows made for the block.
    """
    if pa.schema(table.schema().to_arrow()).names != CURATED_SCHEMA.names:
        return None
    known = np.zeros(curated.num_rows, dtype=bool)
    stored = 0
    for block in lake.scan_blocks(table.table_uri, table.version(), SNAPSHOT_KEY_COLUMNS, lake.SEARCH_BLOCK_ROWS):
        at = curated.find(block.column("sha256"))
        if (at < 0).any():  # a stored row is not kept now
            return None
        staying = curated.table(at)
        if not all(staying.column(c).equals(block.column(c)) for c in SNAPSHOT_KEY_COLUMNS):
            return None
        known[at] = True
        stored += block.num_rows
    if stored == 0 or int(known.sum()) != stored:  # empty, or a sha256 stored twice: the snapshot is rewritten whole
        return None
    return curated.subset(~known)


def _galleries(settings: Settings, plan: Plan, raw_version: int, config_hash: str) -> dict[str, str]:
    """fastdup's HTML galleries of this run's duplicates and bad images (name -> page): the pictured images' bytes and
    labels only (the plan's ``gallery_labels``; a filter of the raw table and a map of every raw row's label were
    proportional to the table, at the end of every batch)."""
    images = plan.images.held_bytes(sorted(gallery_shas(plan)))
    return write_galleries(run_dir(settings, raw_version, config_hash) / "galleries", plan.duplicates,
                           plan.outliers, images, plan.gallery_labels)
