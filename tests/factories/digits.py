"""Real digits (scikit-learn's 1,797) as the curated rows and tables the pipeline would write."""

from __future__ import annotations

import hashlib
import io
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image

from tasks.curation.curate import CURATED_SCHEMA


def encode(array: Any, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode="L").save(buffer, format=fmt)
    return buffer.getvalue()


@lru_cache(maxsize=1)
def curated_rows() -> tuple[dict[str, Any], ...]:
    """All real digits as curated rows: PNG bytes, deduplicated by sha256, split 70/15/15 by index."""
    from tasks.data.sample_data import digits_arrays

    images, labels = digits_arrays()
    rows, seen = [], set()
    for i, (image, label) in enumerate(zip(images, labels)):
        data = encode(image)
        sha = hashlib.sha256(data).hexdigest()
        if sha in seen:
            continue
        seen.add(sha)
        bucket = i % 20
        split = "train" if bucket < 14 else "val" if bucket < 17 else "test"
        rows.append(
            {"sha256": sha, "image": data, "label": str(int(label)), "split": split, "width": 8, "height": 8}
        )
    return tuple(rows)


def write_curated_digits(
    uri: str, raw_version: int | None = 3, limit: int | None = None, splits: tuple[str, ...] = ("train", "val", "test")
) -> int:
    """Write a curated snapshot of the digits like tasks.curation.curate would; returns the new version."""
    from tasks.data import lake

    rows = [r for r in curated_rows()[:limit] if r["split"] in splits]
    metadata: dict[str, Any] = {"run_id": "test-curate", "logical_date": "2026-11-21", "step": "curate"}
    if raw_version is not None:
        metadata["raw_version"] = raw_version
    return lake.overwrite(uri, pa.Table.from_pylist(rows, schema=CURATED_SCHEMA), metadata=metadata)


def split_rows(split: str) -> list[dict[str, Any]]:
    return [r for r in curated_rows() if r["split"] == split]


def curated_table(images: np.ndarray, labels: np.ndarray, splits: list[str]) -> pa.Table:
    """A curated-images table of 8x8 grey ``images`` with the given labels and splits."""
    data = [encode(a) for a in images]
    shas = [hashlib.sha256(d).hexdigest() for d in data]
    n = len(data)
    return pa.table({
        "sha256": pa.array(shas, pa.string()), "image": pa.array(data, pa.binary()),
        "label": pa.array([str(int(v)) for v in labels], pa.string()), "split": pa.array(splits, pa.string()),
        "width": pa.array([8] * n, pa.int32()),
        "height": pa.array([8] * n, pa.int32()),
    })


def raw_table(images: np.ndarray, labels: np.ndarray, run_id: str = "test-ingest") -> pa.Table:
    """Raw-table rows (``RAW_SCHEMA``) of 8x8 grey ``images`` as ingest admits them: PNG, one row per sha256."""
    from datetime import UTC, datetime

    from tasks.data.admission import RAW_SCHEMA

    rows, seen = [], set()
    for array, label in zip(images, labels):
        data = encode(array)
        sha = hashlib.sha256(data).hexdigest()
        if sha in seen:
            continue
        seen.add(sha)
        rows.append({"sha256": sha, "image": data, "width": 8, "height": 8, "format": "PNG", "mode": "L",
                     "label": str(int(label)), "source_uri": f"landing/{int(label)}/{sha[:12]}.png",
                     "ingest_run_id": run_id, "logical_date": "2026-11-21", "ingested_at": datetime.now(UTC),
                     "source_format": "PNG", "source_mode": "L", "normalised": None})
    return pa.Table.from_pylist(rows, schema=RAW_SCHEMA)
