"""Curation test material: real digits, planted files, and what a curation decided for each image."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

from PIL import Image

from tasks.curation.tables import COMPONENTS_TABLE, REPORT_TABLE
from tasks.data import lake
from tasks.data.sample_data import digits_arrays

IMAGES, LABELS = digits_arrays()


def pair_rule_only(settings):
    """Settings whose curation drops by the pair rules alone: no separation test, no class guard.

    For tests of what the pair rules decide (copies, chains, conflicts, bad images, splits) on
    samples too small for the class tests, which would abstain there (tests/tasks/curation/test_abstention.py).
    """
    cur = settings.curation.model_copy(update={"copy_min_separation": 0.0, "copy_min_class_images": 3,
                                                "max_class_drop_share": 1.0})
    return settings.model_copy(update={"curation": cur})


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def digit(i: int) -> Image.Image:
    return Image.fromarray(IMAGES[i], mode="L")


def noise_pngs(n: int, side: int, seed: int = 0) -> list[bytes]:
    """``n`` grey PNGs of uniform noise, ``side`` px: distinct images that are no copies of each other."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [encode(Image.fromarray(rng.integers(0, 255, (side, side)).astype(np.uint8), mode="L"), "PNG")
            for _ in range(n)]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plant(landing: Path, name: str, label: int, data: bytes) -> str:
    (landing / str(label)).mkdir(parents=True, exist_ok=True)
    (landing / str(label) / name).write_bytes(data)
    return sha(data)


def components(settings, version: int) -> dict[str, dict]:
    """sha256 -> assignment row of the curation_components table at ``version``."""
    from tasks.curation.assignments import read_record

    return {r["sha256"]: r for r in read_record(settings.table_uri(COMPONENTS_TABLE), version).to_pylist()}


def outcome(settings, result) -> dict[str, dict]:
    """sha256 -> {"kept", "component", "split", "reason", "kept_sha256"} from the snapshot, the assignment record at
    the version its commit names (a kept image's component) and the report table."""
    table = lake.read(result.curated_table, result.curated_version).to_pylist()
    record = components(settings, result.components_version)
    out = {r["sha256"]: {"kept": True, "component": record[r["sha256"]]["component"], "split": r["split"],
                         "reason": None, "kept_sha256": None} for r in table}
    uri = settings.table_uri(REPORT_TABLE)
    if not lake.exists(uri):  # nothing was ever dropped
        return out
    rows = lake.read(uri, lake.current_version(uri), filter=[("curated_version", "=", result.curated_version)])
    for d in rows.to_pylist():
        assert d["sha256"] not in out, d
        out[d["sha256"]] = {"kept": False, "component": d["component"], "split": None, "reason": d["reason"],
                            "kept_sha256": d["kept_sha256"]}
    return out


def photo_crops(per_class: int = 150, seed: int = 0) -> list[tuple[str, Image.Image]]:
    """(class, RGB image): a team's colour photos of 48-150 px in 2 classes (``china``, ``flower``).

    Square crops of random sides 48-150 px at random places of scikit-learn's two real photos at
    scales 1, 0.75 and 0.5; crops may overlap (another framing and size: not copies).
    """
    import numpy as np
    from sklearn.datasets import load_sample_image

    rng = np.random.default_rng(seed)
    out = []
    for label in ("china", "flower"):
        photo = Image.fromarray(load_sample_image(f"{label}.jpg"))
        scaled = [photo.resize((round(photo.width * s), round(photo.height * s)), Image.BILINEAR) for s in (1, 0.75, 0.5)]
        while sum(1 for c, _ in out if c == label) < per_class:
            src = scaled[int(rng.integers(len(scaled)))]
            side = int(rng.integers(48, 151))
            if side <= min(src.size):
                x, y = int(rng.integers(src.width - side + 1)), int(rng.integers(src.height - side + 1))
                out.append((label, src.crop((x, y, x + side, y + side))))
    return out


def files_removed(uri: str, version: int) -> int:
    """How many data files the commit of ``version`` removed from a local Delta table (0: it only added)."""
    log = Path(uri) / "_delta_log" / f"{version:020d}.json"
    return sum(1 for line in log.read_text().splitlines() if json.loads(line).get("remove") is not None)
