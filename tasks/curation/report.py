"""What a curation reports: its result, the ``curation_report`` rows, the JSON report and the log lines."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tasks.curation.tables import REPORT_SCHEMA, REPORT_TABLE, SPLITS
from tasks.data import lake
from tasks.settings import Settings

log = logging.getLogger("tasks.curation.curate")  # one logger for the whole curation, as before the split

DROP_FIELDS = ("sha256", "reason", "detail", "component", "kept_sha256", "label")


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
    galleries: dict[str, str] = field(default_factory=dict)  # name -> fastdup HTML gallery (when installed)
    report_html: str = ""  # the curation's own page (tasks.curation.report_html), with or without fastdup
    report_table: str = ""
    components_table: str = ""
    components_version: int | None = None  # the assignment record this version was curated with
    embeddings_table: str = ""
    new_images: int = 0  # images that got their component and split in this curation
    embedded: int = 0  # images whose features were computed in this curation (the rest were stored)

    def to_dict(self) -> dict:
        return asdict(self)


def count_by_split(table: pa.Table) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    by_split = {s: 0 for s in SPLITS}
    by_label: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
    for split, label in zip(table.column("split").to_pylist(), table.column("label").to_pylist()):
        by_split[split] += 1
        by_label[split][label] = by_label[split].get(label, 0) + 1
    return by_split, {s: dict(sorted(v.items())) for s, v in by_label.items()}


def count_reasons(dropped: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dropped:
        out[d["reason"]] = out.get(d["reason"], 0) + 1
    return dict(sorted(out.items()))


def run_dir(settings: Settings, raw_version: int, config_hash: str) -> Path:
    return settings.reports_path / "curation" / f"raw{raw_version}_{config_hash}"


def report_path_for(settings: Settings, raw_version: int, config_hash: str) -> Path:
    return settings.reports_path / "curation" / f"curation_raw{raw_version}_{config_hash}.json"


def write_report_rows(
    settings: Settings, raw_version: int, config_hash: str, curated_version: int, dropped: list[dict[str, Any]],
    run_id: str, logical: str,
) -> None:
    """One row per dropped image, keyed by (raw_version, config_hash, sha256): a re-run adds nothing."""
    rows = [{**{k: d[k] for k in DROP_FIELDS}, "raw_version": raw_version, "config_hash": config_hash,
             "curated_version": curated_version, "run_id": run_id, "logical_date": logical} for d in dropped]
    metadata = {"run_id": run_id, "logical_date": logical, "step": "curate_report", "raw_version": str(raw_version),
                "config_hash": config_hash, "curated_version": str(curated_version)}
    lake.merge_new_rows(settings.table_uri(REPORT_TABLE), pa.Table.from_pylist(rows, schema=REPORT_SCHEMA),
                        ["raw_version", "config_hash", "sha256"], metadata)


def stored_report_rows(settings: Settings, raw_version: int, config_hash: str) -> list[dict[str, Any]] | None:
    uri = settings.table_uri(REPORT_TABLE)
    version = lake.current_version(uri)
    if version is None:
        return None
    t = lake.read(uri, version, columns=list(DROP_FIELDS),
                  filter=[("raw_version", "=", raw_version), ("config_hash", "=", config_hash)])
    return sorted(t.to_pylist(), key=lambda d: (d["component"], d["sha256"]))


def existing_galleries(settings: Settings, raw_version: int, config_hash: str) -> dict[str, str]:
    folder = run_dir(settings, raw_version, config_hash) / "galleries"
    if not folder.exists():
        return {}
    return {p.parent.name: str(p) for p in sorted(folder.glob("*/*.html"))}


def report_body(
    settings: Settings, raw_version: int, config_hash: str, version: int,
    kept: tuple[int, dict[str, int], dict[str, dict[str, int]]],
    dropped: list[dict[str, Any]], metadata: dict[str, Any], extra: dict[str, Any],
) -> dict[str, Any]:
    """The report's JSON; ``kept``: (images kept, by split, by split and label)."""
    kept_rows, by_split, by_label = kept
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
            "order": "no features > bad image (too_small, too_dark, too_bright, flat, blurry) > split_bridge > "
                     "label_conflict > duplicate",
            "representative": "the member first assigned to the component (lowest first_raw_version), "
                              "then the smallest sha256",
            "component_key": "recorded in curation_components when first seen; a new component: its smallest sha256",
            "label_conflict": "a copy (same pixels or copy score >= copy_similarity) of an image with another label: "
                              "both are quarantined",
            "duplicate": f"a copy of an image already KEPT with its label: same decoded pixels (exact_duplicate) or "
                         f"copy score >= {settings.curation.copy_similarity} (near_duplicate); never through a chain; "
                         f"near_duplicate only where the class's copies stand out from its bulk (z >= "
                         f"{settings.curation.copy_min_separation}) and within max_class_drop_share "
                         f"{settings.curation.max_class_drop_share} of the class with its bad images, else kept and "
                         f"listed (decisions)",
            "split": "recorded split of the component; a new component: sha256(f'{split_salt}:{key}') as a "
                     "fraction of 2**256, cut by split_ratios",
            "split_bridge": "a new image that would join recorded components of different splits is quarantined "
                            "(named a duplicate instead when it is a copy of one of their images with its label: "
                            "same pixels, or a near copy in a class that does not abstain; outside the class "
                            "budget either way)",
            "similarity": f"components (splits): cosine of {settings.curation.embedding} embeddings >= "
                          f"{settings.curation.near_duplicate_threshold} to one of a new image's "
                          f"{settings.curation.similar_neighbours} nearest neighbours, identical decoded pixels, "
                          f"or a copy; "
                          f"copies: copy score of each new image's {settings.curation.copy_candidates} nearest "
                          f"neighbours (embedding and blurred embedding) >= {settings.curation.copy_similarity}",
        },
        "kept": kept_rows,
        "counts_by_split": by_split,
        "counts_by_split_and_label": by_label,
        "dropped_by_reason": count_reasons(dropped),
        "dropped": dropped,
        **extra,
    }


def log_result(result: CurateResult) -> None:
    log.info("curate: %s v%d kept %d %s, dropped %s", result.curated_table, result.curated_version, result.kept,
             result.counts_by_split, result.dropped_by_reason)
    log.info("curate: report %s (table %s)", result.report_path, result.report_table)
    if result.report_html:
        log.info("curate: page %s", result.report_html)
    for name, path in result.galleries.items():
        log.info("curate: fastdup gallery %s: %s", name, path)
