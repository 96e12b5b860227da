"""Real sample images without a download: scikit-learn's 1,797 handwritten digits as PNGs.

Written to ``<landing>/<digit>/digit_<index>.png`` (label = folder name). The encoding is
deterministic, and a file already holding the same bytes is not rewritten, so a second
``make demo`` finds an unchanged landing zone.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits as uint8 images (N, 8, 8) scaled from 0..16 to 0..255, and their labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images, bunch.target.astype(np.int64)


def write_digits(landing: str | Path, limit: int | None = None, with_bad_files: bool = False) -> int:
    """Write the digits into ``landing``; returns how many image files it wrote.

    ``with_bad_files`` also plants two files the ingest must quarantine (a text file named
    .png and a truncated PNG), so a demo shows the rejects table doing its job.
    """
    root = Path(landing)
    images, labels = digits_arrays()
    n = len(images) if limit is None else min(limit, len(images))
    for i in range(n):
        buffer = io.BytesIO()
        Image.fromarray(images[i], mode="L").save(buffer, format="PNG", optimize=False)
        _write_if_changed(root / str(int(labels[i])) / f"digit_{i:04d}.png", buffer.getvalue())
    if with_bad_files:
        _write_if_changed(root / "3" / "not_really_an_image.png", b"this is a text file with an image extension\n")
        good = (root / str(int(labels[0])) / "digit_0000.png").read_bytes()
        _write_if_changed(root / "7" / "truncated.png", good[: len(good) // 2])
    return n


def _write_if_changed(path: Path, data: bytes) -> None:
    """Leave an identical file untouched: its mtime is what lets the next ingest skip it unread."""
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
