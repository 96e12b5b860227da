"""Curate one raw version into the ``curated_images`` snapshot: dedupe, resolve conflicts, split.

Why each step exists:

* Exact duplicates: the raw key is the sha256 of the file bytes, so byte-identical files are
  already one row; files whose *decoded pixels* are identical (a PNG re-saved with other
  settings) are still duplicates and are grouped by a hash of the decoded pixels.
* Near duplicates: fastdup finds pairs whose cosine similarity is at or above
  ``curation.near_duplicate_threshold``. Every pair becomes an edge and the connected
  components are built here with union-find, so the grouping is deterministic.
* One image per component survives (the lexicographically smallest sha256, a rule that
  needs no tie-breaking). A component whose members disagree on the label is dropped whole
  (``label_conflict``): nobody can tell which label is right.
* The split is a pure function of the component key (the smallest sha256 in the component)
  and the salt, so near-copies can never straddle train and test, and an image keeps its
  split when later curations add unrelated images.

Which features fastdup compares (the facts behind the choice): fastdup ignores images under
10x10 pixels, and the sample digits are 8x8. Upscaled copies are accepted, but fastdup's
built-in model saturates on them: on the 1,797 digits (upscaled to 32, 64 or 128 px, with
or without ``high_accuracy``) nearly every k-NN edge scores >= 0.97, thousands of them
between different digits. So fastdup runs on precomputed embeddings instead: the grey
pixels at ``FEATURE_SIZE`` px, mean-centred and L2-normalised (cosine = pixel correlation,
which ignores brightness/contrast shifts and survives JPEG re-encoding at ~0.996+). On the
digits that gives no cross-label pair at 0.97. fastdup still builds the exact (``Flat``)
nearest-neighbour graph, writes ``similarity.csv`` and the galleries.

Idempotent: the commit carries the raw version and the curation config hash; a re-run with
both unchanged returns the existing version and commits nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image, ImageOps

from tasks import lake
from tasks.errors import DataError
from tasks.images import decode_gray
from tasks.reports import write_json
from tasks.settings import Settings

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
FEATURE_SIZE = 8  # px side of the similarity features: the digits' native size (upsampling blurs them together)
EXPORT_SIZE = 32  # px side of the exported copies: fastdup's galleries skip images under 10x10
NEIGHBOURS = 16  # fastdup nearest neighbours per image; components only need connectivity

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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Plan:
    """Everything a curation decides, before anything is written (pure given the raw rows)."""

    curated: pa.Table
    dropped: list[dict[str, Any]]
    fastdup: dict[str, Any] = field(default_factory=dict)


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


def pixel_digest(data: bytes) -> str:
    """Hash of the decoded pixels plus size: equal for files that differ only in encoding."""
    with Image.open(io.BytesIO(data)) as img:
        img = ImageOps.exif_transpose(img)
        if img.mode in ("1", "L", "LA", "P", "RGB", "RGBA"):
            img = img.convert("RGBA")  # lossless for these modes, so L and RGB copies of one image match
        h = hashlib.sha256(f"{img.mode}:{img.size[0]}x{img.size[1]}:".encode())
        h.update(img.tobytes())
        return h.hexdigest()


def feature_vector(data: bytes, size: int = FEATURE_SIZE) -> np.ndarray:
    """Mean-centred, unit-length grey pixels: cosine similarity = pixel correlation."""
    x = np.asarray(decode_gray(data, size), dtype=np.float64).ravel()
    x = x - x.mean()
    norm = float(np.linalg.norm(x))
    if norm == 0.0:  # a flat image: similar to other flat images only
        return np.full(x.shape, 1.0 / np.sqrt(x.size), dtype=np.float32)
    return (x / norm).astype(np.float32)


class _UnionFind:
    """Disjoint sets over strings; the smaller key becomes the root, so the result is order-free."""

    def __init__(self, keys: list[str]) -> None:
        self.parent = {k: k for k in keys}

    def find(self, k: str) -> str:
        root = k
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[k] != root:
            self.parent[k], k = root, self.parent[k]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            lo, hi = sorted((ra, rb))
            self.parent[hi] = lo


# ---------------------------------------------------------------- fastdup


def _run_fastdup(
    names: list[str], features: np.ndarray, image_dir: Path, work_dir: Path, threshold: float
) -> tuple[list[tuple[str, str, float]], dict[str, str], dict[str, Any]]:
    """fastdup's exact k-NN graph over ``features``: (pairs >= threshold, invalid name -> error, paths)."""
    import fastdup
    import pandas as pd

    if work_dir.exists():
        shutil.rmtree(work_dir)  # a crashed earlier attempt must not leak into this one
    fd = fastdup.create(work_dir=str(work_dir), input_dir=str(image_dir))
    fd.run(
        annotations=pd.DataFrame({"filename": names}),
        embeddings=features,
        threshold=threshold,
        cc_threshold=threshold,
        nearest_neighbors_k=max(1, min(NEIGHBOURS, len(names) - 1)),
        nnf_mode="Flat",  # exact search: the same input always gives the same pairs
        distance="cosine",
        num_threads=min(4, os.cpu_count() or 1),
        run_stats=False,
        overwrite=True,
        verbose=False,
    )
    annot = fd.annotations(valid_only=False)
    by_index = dict(zip(annot["fd_index"].astype(int), annot["filename"]))
    invalid_df = fd.invalid_instances()
    invalid = {} if invalid_df is None else dict(zip(invalid_df["filename"], invalid_df["error_code"].astype(str)))
    sim = fd.similarity(data=False)
    pairs: list[tuple[str, str, float]] = []
    if sim is not None and not sim.empty:
        for a, b, s in zip(sim["from"].astype(int), sim["to"].astype(int), sim["distance"].astype(float)):
            if s >= threshold and a != b:
                pairs.append((by_index[a], by_index[b], s))

    paths: dict[str, Any] = {"work_dir": str(work_dir), "similarity_csv": str(work_dir / "similarity.csv")}
    paths["galleries"] = _galleries(fd, work_dir / "galleries", has_pairs=bool(pairs))
    return pairs, invalid, paths


def _galleries(fd: Any, folder: Path, has_pairs: bool) -> dict[str, str]:
    """Best-effort HTML galleries for people; a failure here never fails the curation."""
    out: dict[str, str] = {}
    makers = [("outliers", fd.vis.outliers_gallery)]
    if has_pairs:
        makers.insert(0, ("duplicates", fd.vis.duplicates_gallery))
    for name, make in makers:
        target = folder / name
        try:
            target.mkdir(parents=True, exist_ok=True)
            make(save_path=str(target), num_images=20)
            html = sorted(target.glob("*.html"))
            if html:
                out[name] = str(html[0])
        except Exception as exc:  # galleries are optional decoration
            log.warning("curate: fastdup %s gallery failed: %s", name, exc)
    return out


# ---------------------------------------------------------------- planning


def _work_dir(settings: Settings, raw_version: int, config_hash: str) -> Path:
    return settings.reports_path / "curation" / f"raw{raw_version}_{config_hash}"


def report_path_for(settings: Settings, raw_version: int, config_hash: str) -> Path:
    return settings.reports_path / "curation" / f"curation_raw{raw_version}_{config_hash}.json"


def _plan(settings: Settings, raw: pa.Table, work: Path) -> _Plan:
    """Decide what is kept, dropped and where it goes; writes only fastdup's work folder."""
    cfg = settings.curation
    rows = sorted(raw.to_pylist(), key=lambda r: r["sha256"])
    by_sha = {r["sha256"]: r for r in rows}
    dropped: list[dict[str, Any]] = []

    # Exact duplicates by decoded pixels; one representative per pixel group goes to fastdup.
    pixel_of: dict[str, str] = {}
    first_of_pixels: dict[str, str] = {}
    features: dict[str, np.ndarray] = {}
    for r in rows:
        try:
            digest = pixel_digest(r["image"])
            vec = feature_vector(r["image"])
        except Exception as exc:  # ingest decoded it once; a failure now is still recorded, not fatal
            dropped.append(_drop(r, "undecodable", r["sha256"], None, f"decode failed: {exc}"))
            continue
        pixel_of[r["sha256"]] = digest
        if digest not in first_of_pixels:
            first_of_pixels[digest] = r["sha256"]
            features[r["sha256"]] = vec

    uf = _UnionFind(list(pixel_of))
    for sha, digest in pixel_of.items():
        uf.union(sha, first_of_pixels[digest])

    unique = sorted(features)
    fastdup_info: dict[str, Any] = {"inputs": len(unique), "pairs_at_or_above_threshold": 0}
    invalid: dict[str, str] = {}
    if len(unique) >= 2:
        image_dir = work / "images"
        if image_dir.exists():
            shutil.rmtree(image_dir)
        image_dir.mkdir(parents=True)
        for sha in unique:
            decode_gray(by_sha[sha]["image"], EXPORT_SIZE).save(image_dir / f"{sha}.png")
        names = [str(image_dir / f"{sha}.png") for sha in unique]  # absolute: fastdup's galleries need them
        pairs, invalid_files, paths = _run_fastdup(
            names, np.stack([features[s] for s in unique]), image_dir, work / "fastdup", cfg.near_duplicate_threshold
        )
        for a, b, _ in pairs:
            uf.union(Path(a).stem, Path(b).stem)
        invalid = {Path(name).stem: code for name, code in invalid_files.items()}
        fastdup_info.update(paths, images_dir=str(image_dir))
        fastdup_info["pairs_at_or_above_threshold"] = len({tuple(sorted((a, b))) for a, b, _ in pairs})

    # Components: the key is the smallest sha256 (the union-find root by construction).
    members: dict[str, list[str]] = {}
    for sha in pixel_of:
        members.setdefault(uf.find(sha), []).append(sha)

    kept_rows: list[dict[str, Any]] = []
    for key in sorted(members):
        group = sorted(members[key])
        bad = [s for s in group if first_of_pixels[pixel_of[s]] in invalid]  # fastdup saw the group's first
        for s in bad:
            dropped.append(_drop(by_sha[s], "fastdup_invalid", key, None, invalid[first_of_pixels[pixel_of[s]]]))
        group = [s for s in group if s not in bad]
        if not group:
            continue
        labels = {by_sha[s]["label"] for s in group}
        if len(labels) > 1:
            detail = f"labels {sorted(labels)} in one component of {len(group)}"
            dropped.extend(_drop(by_sha[s], "label_conflict", key, None, detail) for s in group)
            continue
        rep = group[0]  # documented rule: the lexicographically smallest sha256 survives
        for s in group[1:]:
            reason = "exact_duplicate" if pixel_of[s] == pixel_of[rep] else "near_duplicate"
            dropped.append(_drop(by_sha[s], reason, key, rep, None))
        r = by_sha[rep]
        kept_rows.append(
            {
                "sha256": rep,
                "image": r["image"],
                "label": r["label"],
                "split": split_for(key, cfg.split_salt, dict(cfg.split_ratios)),
                "component": key,
                "width": int(r["width"]),
                "height": int(r["height"]),
            }
        )

    kept_rows.sort(key=lambda r: r["sha256"])
    dropped.sort(key=lambda d: (d["component"], d["sha256"]))
    return _Plan(pa.Table.from_pylist(kept_rows, schema=CURATED_SCHEMA), dropped, fastdup_info)


def _drop(row: dict[str, Any], reason: str, component: str, kept: str | None, detail: str | None) -> dict[str, Any]:
    return {
        "sha256": row["sha256"],
        "reason": reason,
        "component": component,
        "kept_sha256": kept,
        "label": row["label"],
        "detail": detail,
    }


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


# ---------------------------------------------------------------- entry point


def curate(settings: Settings, raw_version: int, run_id: str, logical_date: str) -> CurateResult:
    """Curate ``raw_version`` exactly (never "latest"); reuse an identical earlier curation."""
    logical = lake.normalise_logical_date(logical_date)
    config_hash = settings.section_hash("curation")
    curated_uri, raw_uri = settings.curated_table, settings.raw_table
    report = report_path_for(settings, raw_version, config_hash)
    work = _work_dir(settings, raw_version, config_hash)

    prior = lake.find_commit(curated_uri, raw_version=str(raw_version), config_hash=config_hash, step="curate")
    if prior is not None:
        if not report.exists():  # reports folder wiped: the plan is deterministic, so rebuild it
            plan = _plan(settings, _read_raw(settings, raw_version), work)
            write_json(report, _report_body(settings, raw_version, config_hash, prior.version, plan, prior.metadata))
        table = lake.read(curated_uri, prior.version, columns=["sha256", "label", "split"])
        by_split, by_label = _counts(table)
        stored = json.loads(prior.metadata.get("dropped_by_reason", "null") or "null")
        if stored is None:
            stored = _reasons(json.loads(report.read_text())["dropped"])
        result = CurateResult(
            curated_table=curated_uri, curated_version=prior.version, raw_table=raw_uri, raw_version=raw_version,
            committed=False, kept=table.num_rows, counts_by_split=by_split, counts_by_split_and_label=by_label,
            dropped_by_reason=stored, report_path=str(report), run_id=run_id, logical_date=logical,
        )
        log.info("curate: reusing %s version %d for raw version %d", curated_uri, prior.version, raw_version)
        return result

    plan = _plan(settings, _read_raw(settings, raw_version), work)
    if plan.curated.num_rows == 0:
        raise CurationError(
            f"curating {raw_uri} version {raw_version} dropped every image ({_reasons(plan.dropped)}): nothing to write"
        )
    reasons = _reasons(plan.dropped)
    metadata = {
        "run_id": run_id,
        "logical_date": logical,
        "raw_table": raw_uri,
        "raw_version": str(raw_version),
        "config_hash": config_hash,
        "step": "curate",
        "kept": plan.curated.num_rows,
        "dropped": len(plan.dropped),
        "dropped_by_reason": json.dumps(reasons, sort_keys=True),
    }
    version = lake.overwrite(curated_uri, plan.curated, metadata, configuration=lake.stats_columns_config(CURATED_SCHEMA))
    write_json(report, _report_body(settings, raw_version, config_hash, version, plan, metadata))
    by_split, by_label = _counts(plan.curated)
    result = CurateResult(
        curated_table=curated_uri, curated_version=version, raw_table=raw_uri, raw_version=raw_version,
        committed=True, kept=plan.curated.num_rows, counts_by_split=by_split, counts_by_split_and_label=by_label,
        dropped_by_reason=reasons, report_path=str(report), run_id=run_id, logical_date=logical,
    )
    log.info("curate: %s", result)
    return result


def _report_body(
    settings: Settings, raw_version: int, config_hash: str, version: int, plan: _Plan, metadata: dict[str, Any]
) -> dict[str, Any]:
    by_split, by_label = _counts(plan.curated)
    return {
        "step": "curate",
        "raw_table": settings.raw_table,
        "raw_version": raw_version,
        "curated_table": settings.curated_table,
        "curated_version": version,
        "config_hash": config_hash,
        "curation": settings.curation.model_dump(mode="json"),
        "run_id": metadata.get("run_id"),
        "logical_date": metadata.get("logical_date"),
        "rules": {
            "representative": "lexicographically smallest sha256 in the component",
            "component_key": "smallest sha256 in the component",
            "label_conflict": "a component whose members disagree on the label is dropped whole",
            "split": "sha256(f'{split_salt}:{component_key}') as a fraction of 2**256, cut by split_ratios",
            "similarity": f"cosine of mean-centred {FEATURE_SIZE}x{FEATURE_SIZE} grey pixels, fastdup Flat k-NN",
        },
        "kept": plan.curated.num_rows,
        "counts_by_split": by_split,
        "counts_by_split_and_label": by_label,
        "dropped_by_reason": _reasons(plan.dropped),
        "dropped": plan.dropped,
        "fastdup": plan.fastdup,
    }
