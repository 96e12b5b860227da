"""Reuse: a curation of the same raw version under the same config already ran; answer as it did."""

from __future__ import annotations

import json
import logging

from tasks.curation.plan import plan_in_workdir, store_caches
from tasks.curation.report import (
    CurateResult,
    count_by_split,
    count_reasons,
    existing_galleries,
    log_result,
    report_body,
    report_path_for,
    run_dir,
    stored_report_rows,
    write_report_rows,
)
from tasks.curation.report_html import existing_page, write_page
from tasks.curation.tables import COMPONENTS_TABLE, EMBEDDINGS_TABLE, REPORT_TABLE
from tasks.data import lake
from tasks.files import write_json
from tasks.settings import Settings

log = logging.getLogger("tasks.curation.curate")  # one logger for the whole curation, as before the split

def reuse_prior(
    settings: Settings, raw_version: int, config_hash: str, prior: lake.Commit, run_id: str, logical: str
) -> CurateResult:
    """The answer of the curation that already ran; its report is rebuilt if it went missing."""
    curated_uri = settings.curated_table
    table = lake.read(curated_uri, prior.version, columns=["sha256", "label", "split"])
    report = report_path_for(settings, raw_version, config_hash)
    stored = stored_report_rows(settings, raw_version, config_hash)
    if not stored and int(prior.metadata.get("dropped", "0")) > 0:
        # Crashed between the snapshot and its report rows: re-plan (features are stored) and record them.
        cache_meta = {"run_id": run_id, "logical_date": logical}
        plan = plan_in_workdir(settings, raw_version, prior.metadata.get("run_id", run_id), cache_meta)
        write_report_rows(settings, raw_version, config_hash, prior.version, plan.dropped,
                          prior.metadata.get("run_id", run_id), prior.metadata.get("logical_date", logical))
        store_caches(settings, plan, cache_meta)
        stored = plan.dropped
    dropped = stored or []
    galleries = existing_galleries(settings, raw_version, config_hash)
    if not report.exists():  # reports folder wiped: the Delta report is the record, the JSON its copy
        write_json(report, report_body(settings, raw_version, config_hash, prior.version,
                                       (table.num_rows, *count_by_split(table)), dropped,
                                       prior.metadata, {"galleries": galleries, "rebuilt_from": REPORT_TABLE}))
    folder = run_dir(settings, raw_version, config_hash)
    # A missing page is rebuilt without thumbnails: answering a finished curation reads no image.
    page = existing_page(folder) or str(write_page(folder, json.loads(report.read_text()), None, report))
    by_split, by_label = count_by_split(table)
    reasons = json.loads(prior.metadata.get("dropped_by_reason", "null") or "null") or count_reasons(dropped)
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
        report_html=page,
    )
    log.info("curate: reusing %s version %d for raw version %d", curated_uri, prior.version, raw_version)
    log_result(result)
    return result
