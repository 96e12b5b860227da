"""A day of scans with known labels for the monitoring tests: PNGs (some upside down) and their feedback file."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from PIL import Image


def write_batch(folder: Path, rows: list[dict], flip_every: int = 0) -> dict[str, str]:
    """The rows' images as PNGs in ``folder`` (every ``flip_every``-th turned upside down); path -> true label."""
    folder.mkdir(parents=True, exist_ok=True)
    truth = {}
    for i, row in enumerate(rows):
        img = Image.open(io.BytesIO(row["image"]))
        if flip_every and i % flip_every == 0:
            img = img.rotate(180)
        path = folder / f"{row['sha256'][:16]}_{i}.png"
        img.save(path)
        truth[str(path)] = row["label"]
    return truth


def feedback_csv(path: Path, truth: dict[str, str], extra: list[tuple[str, str]] = ()) -> Path:
    """A feedback CSV (path,label) of ``truth`` and ``extra`` rows; its folder is created."""
    path.parent.mkdir(parents=True, exist_ok=True)  # feedback files lie under storage.feedback_uri
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["path", "label"])
        for image, label in [*truth.items(), *extra]:
            writer.writerow([image, label])
    return path
