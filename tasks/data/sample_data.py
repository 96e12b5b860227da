"""Real sample images without a download, written into a landing folder (label = folder name).

* ``digits``: scikit-learn's 1,797 handwritten digits as 8x8 grey PNGs,
  ``<landing>/<digit>/digit_<index>.png``.
* ``photos``: real colour photos shipped in packages (scikit-learn's ``china`` and ``flower``,
  scikit-image's ``astronaut``, ``coffee``, ``rocket``, ``immunohistochemistry`` and
  ``motorcycle``) cut into non-overlapping 64x64 tiles at two scales (1 and 0.7), saved as JPEG
  (quality 90); the class is the photo a tile comes from, so colour carries much of the signal
  (a grey model loses most of it: bench/README.md). ``<landing>/<photo>/tile_s<scale>_r<row>_c<col>.jpg``.
  Tiles of one photo at two scales show the same scene, not the same pixels; the splits are
  still per image, so the two scales of a region can land in different splits.

The encoding is deterministic, and a file already holding the same bytes is not rewritten, so
a second ``make demo`` finds an unchanged landing zone.
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


PHOTO_TILE = 64
PHOTO_SCALES = (1.0, 0.7)


def photo_sources() -> dict[str, np.ndarray]:
    """The packaged colour photos (uint8 RGB), by class name."""
    import skimage.data as ski
    from sklearn.datasets import load_sample_image

    return {
        "astronaut": ski.astronaut(),
        "china": load_sample_image("china.jpg"),
        "coffee": ski.coffee(),
        "flower": load_sample_image("flower.jpg"),
        "ihc": ski.immunohistochemistry(),
        "motorcycle": ski.stereo_motorcycle()[0],
        "rocket": ski.rocket(),
    }


def photo_tiles(tile: int = PHOTO_TILE, scales: tuple[float, ...] = PHOTO_SCALES) -> list[tuple[str, str, np.ndarray]]:
    """(class, file stem, RGB tile) for every non-overlapping tile of every photo at every scale."""
    out = []
    for label, photo in photo_sources().items():
        for scale in scales:
            img = Image.fromarray(photo)
            if scale != 1.0:
                img = img.resize((round(img.width * scale), round(img.height * scale)), Image.BILINEAR)
            pixels = np.asarray(img)
            for r in range(0, pixels.shape[0] - tile + 1, tile):
                for c in range(0, pixels.shape[1] - tile + 1, tile):
                    out.append((label, f"tile_s{int(scale * 100)}_r{r:04d}_c{c:04d}", pixels[r : r + tile, c : c + tile]))
    return out


def write_photos(landing: str | Path, limit: int | None = None, with_bad_files: bool = False) -> int:
    """Write the colour photo tiles into ``landing``; returns how many image files it wrote."""
    root = Path(landing)
    tiles = photo_tiles()[:limit]
    for label, stem, pixels in tiles:
        buffer = io.BytesIO()
        Image.fromarray(pixels, mode="RGB").save(buffer, format="JPEG", quality=90)
        _write_if_changed(root / label / f"{stem}.jpg", buffer.getvalue())
    if with_bad_files:
        _write_if_changed(root / "china" / "not_really_an_image.jpg", b"this is a text file with an image extension\n")
        _write_if_changed(root / "flower" / "panorama_1px.png", _png(np.full((1, 300, 3), 200, np.uint8), "RGB"))
    return len(tiles)


def _png(pixels: np.ndarray, mode: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


def write_scoring_sample(scoring: str | Path, feedback: str | Path, n: int = 300, labelled_share: float = 0.6) -> int:
    """A day of production traffic for the demo: ``n`` digits as a scanner would send them, and later labels.

    Unlabelled files (``<scoring>/scan_<index>.jpg``: 32 px JPEG, quality 85, so their bytes are
    new to the model) plus one file that is not an image, and ``<feedback>/labels.csv`` with the
    true labels of the first ``labelled_share`` of them (path, label), as a labelling team would
    return them. Deterministic; unchanged files are not rewritten.
    """
    images, labels = digits_arrays()
    order = np.random.default_rng(2026).permutation(len(images))[:n]
    rows = []
    for j, i in enumerate(order.tolist()):
        buffer = io.BytesIO()
        Image.fromarray(images[i], mode="L").resize((32, 32), Image.BILINEAR).save(buffer, format="JPEG", quality=85)
        path = Path(scoring) / f"scan_{j:04d}.jpg"
        _write_if_changed(path, buffer.getvalue())
        if j < labelled_share * n:
            rows.append(f"{path.resolve()},{int(labels[i])}")
    _write_if_changed(Path(scoring) / "scan_damaged.jpg", b"\xff\xd8\xff\xe0 not a whole JPEG")
    _write_if_changed(Path(feedback) / "labels.csv", ("path,label\n" + "\n".join(rows) + "\n").encode())
    return n


SAMPLES = {"digits": write_digits, "photos": write_photos}


def _write_if_changed(path: Path, data: bytes) -> None:
    """Leave an identical file untouched: its mtime is what lets the next ingest skip it unread."""
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
