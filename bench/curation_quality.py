"""End to end: what the product's curation drops when planted copies arrive after their originals.

``bench/dedup_calibration.py`` scores pairs that are given (a copy and its original, an original and
its most similar distinct image). This runs the product itself on the same real images: for each
cell (scikit-learn digits at 8, 32 and 64 px; tiles of 15 bundled photos at 32, 64 and 128 px;
``dedup_calibration.build_cells``) a fresh lake, then

1. the pool of distinct images lands and is ingested and curated (raw v1, ``tasks.curation.curate.curate``),
2. one copy of each sampled original per transformation (resize, rescale, JPEG, brightness,
   shift, crop; 6 per original) lands, and the raw version holding both is curated again:
   candidate search, copy scores, components and drops exactly as in production.

Bad-image rules are switched off (absolute overrides ``min_blur`` 0, ``min_mean`` 0, ``max_mean``
255 that never fire, and no relative rule: ``relative_min_images`` above any pool): this measures
duplicates only. Counted from the ``curation_report`` rows of the
second curation:

* recall: copies dropped as ``near_duplicate``/``exact_duplicate`` of an image of their own family
  (the original or another copy of it), over all copies; per transformation;
* false drops: distinct images (the pool) dropped as a duplicate, over the pool: this is "good
  data lost"; precision: correct duplicate drops over all duplicate drops;
* ``label_conflict`` rows (a copy of an image with another label: both are quarantined).

Usage: FASTDUP_PRODUCTION=1 PYTHONPATH=.:plugins python bench/curation_quality.py [--quick] [--seed 0]
(prints a Markdown table, writes bench/results/curation_quality.json)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("FASTDUP_PRODUCTION", "1")

from bench.dedup_calibration import MODES, TRANSFORMS, Cell, _stdout_to_stderr, build_cells  # noqa: E402

RESULTS = REPO / "bench" / "results" / "curation_quality.json"
DUPLICATE = ("near_duplicate", "exact_duplicate")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _land(folder: Path, items: list[tuple[str, str, bytes]]) -> None:
    for name, label, data in items:
        (folder / label).mkdir(parents=True, exist_ok=True)
        (folder / label / name).write_bytes(data)


def _settings(home: Path, labels: list[str]):
    from tasks.settings import load_settings

    s = load_settings("sit", home=home)
    ingest = s.ingest.model_copy(update={"allowed_labels": tuple(sorted(set(labels)))})
    off = s.curation.outliers.model_copy(update={"min_blur": 0.0, "min_mean": 0.0, "max_mean": 255.0,
                                                 "relative_min_images": 10**9})
    # 6 planted copies per sampled original are far above the class guard's 2%: the guard is measured
    # by bench/curation_families.py, the copy rules here.
    cur = s.curation.model_copy(update={"outliers": off, "max_class_drop_share": 1.0})
    return s.model_copy(update={"ingest": ingest, "curation": cur})


def run_cell(cell: Cell, root: Path) -> dict:
    """Curate the pool, then pool + copies, in a fresh lake; count what the second curation dropped."""
    from tasks.curation.curate import REPORT_TABLE, curate
    from tasks.data import lake
    from tasks.data.ingest import ingest_landing

    home = root / cell.name.replace(" ", "_")
    settings = _settings(home, cell.labels)
    landing = home / "landing"
    pool = [(f"p{i:05d}.png", cell.labels[i], b) for i, b in enumerate(cell.pool)]
    copies = [(f"c{n:05d}.{'jpg' if kind == 'jpeg' else 'png'}", cell.labels[i], data)
              for n, (i, kind, data, _) in enumerate(cell.copies)]
    family = {_sha(b): i for i, b in enumerate(cell.pool)}
    kind_of: dict[str, str] = {}
    for i, kind, data, _ in cell.copies:
        family.setdefault(_sha(data), i)  # a copy identical to another image keeps the first family
        kind_of.setdefault(_sha(data), kind)
    pool_shas = {_sha(b) for b in cell.pool}

    _land(landing, pool)
    raw1 = ingest_landing(settings, run_id="pool", logical_date="2026-11-21", landing=landing).raw_version
    first = curate(settings, raw1, run_id="cur-pool", logical_date="2026-11-21")
    _land(landing, copies)
    raw2 = ingest_landing(settings, run_id="copies", logical_date="2026-11-22", landing=landing).raw_version
    started = time.perf_counter()
    second = curate(settings, raw2, run_id="cur-copies", logical_date="2026-11-22")
    seconds = time.perf_counter() - started
    uri = settings.table_uri(REPORT_TABLE)
    rows = lake.read(uri, lake.current_version(uri), filter=[("curated_version", "=", second.curated_version)]).to_pylist()
    report = json.loads(Path(second.report_path).read_text())

    copy_shas = set(kind_of) - pool_shas
    dropped = {r["sha256"]: r for r in rows}
    dup = [r for r in rows if r["reason"] in DUPLICATE]
    correct = [r for r in dup if r["kept_sha256"] and family.get(r["sha256"]) == family.get(r["kept_sha256"])]
    recall_by_kind = {}
    for kind in TRANSFORMS:
        mine = [s for s in copy_shas if kind_of[s] == kind]
        hit = [s for s in mine if s in dropped and dropped[s]["reason"] in DUPLICATE
               and family.get(dropped[s]["kept_sha256"]) == family[s]]
        recall_by_kind[kind] = len(hit) / len(mine) if mine else float("nan")
    hits = sum(1 for r in correct if r["sha256"] in copy_shas)
    false_pool = [r for r in dup if r["sha256"] in pool_shas]
    return {
        "cell": cell.name, "pool": len(cell.pool), "copies": len(copy_shas), "first_curation_dropped":
            first.dropped_by_reason, "dropped_by_reason": second.dropped_by_reason,
        "recall": hits / len(copy_shas), "recall_by_transform": recall_by_kind,
        "precision": len(correct) / len(dup) if dup else float("nan"),
        "duplicate_drops": len(dup), "wrong_drops": len(dup) - len(correct),
        "pool_dropped_as_duplicate": len(false_pool), "false_drop_rate": len(false_pool) / len(cell.pool),
        "label_conflicts": sum(1 for r in rows if r["reason"] == "label_conflict"),
        "seconds_second_curation": round(seconds, 2), "copies_info": report.get("copies"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    cells = build_cells(MODES["quick" if args.quick else "full"], args.seed)
    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-curation-quality-"))
    try:
        with _stdout_to_stderr(), contextlib.redirect_stdout(sys.stderr):  # fastdup's banners
            results = [run_cell(cell, root) for cell in cells]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    copies = sum(r["copies"] for r in results)
    pool = sum(r["pool"] for r in results)
    dup = sum(r["duplicate_drops"] for r in results)
    pooled = {"recall": sum(r["recall"] * r["copies"] for r in results) / copies,
              "precision": (dup - sum(r["wrong_drops"] for r in results)) / dup if dup else float("nan"),
              "false_drop_rate": sum(r["pool_dropped_as_duplicate"] for r in results) / pool,
              "copies": copies, "pool": pool}
    print(f"# Curation quality (product end to end, {'quick' if args.quick else 'full'}, seed {args.seed})\n")
    print("| cell | pool | copies | recall | " + " | ".join(TRANSFORMS) + " | precision | distinct dropped "
          "| label conflicts | 2nd curation s |")
    print("|---|---:|---:|---:|" + "---:|" * len(TRANSFORMS) + "---:|---:|---:|---:|")
    for r in results:
        kinds = " | ".join(f"{r['recall_by_transform'][k]:.3f}" for k in TRANSFORMS)
        print(f"| {r['cell']} | {r['pool']} | {r['copies']} | {r['recall']:.3f} | {kinds} | {r['precision']:.3f} "
              f"| {r['pool_dropped_as_duplicate']} ({100 * r['false_drop_rate']:.2f}%) | {r['label_conflicts']} "
              f"| {r['seconds_second_curation']} |")
    print(f"| **all** | {pool} | {copies} | **{pooled['recall']:.3f}** | " + " | ".join("" for _ in TRANSFORMS)
          + f" | **{pooled['precision']:.3f}** | **{100 * pooled['false_drop_rate']:.2f}%** | | |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seed": args.seed, "quick": args.quick, "pooled": pooled, "cells": results,
                                    "seconds": round(time.perf_counter() - t0, 1)}, indent=1, default=str))
    print(f"\nwrote {args.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
