"""The project's own per-image statistics for the bad-image rules (Pillow + numpy, no fastdup).

Computed from the image as curation already decodes it (upright, alpha composited on black,
L or RGB: ``tasks.curation.curation_features``), so each image is decoded once; ingest has
already held every image to ``ingest.max_pixels``, which bounds the work here.

* ``family``: ``grey`` (decoded as L) or ``colour`` (RGB): the rules compare an image only
  with images of its own family, since a grey scan and a colour photo have different bulks.
* ``width``, ``height``: decoded size.
* ``mean``, ``contrast``, ``min``, ``max``: mean, standard deviation, minimum and maximum of
  the grey pixels (ITU-R 601 luma, 0..255) at full size.
* ``blur``: variance of the 4-neighbour Laplacian (grey levels squared) of the grey image
  **resized so that its shorter side is** ``NORM_SIDE`` (64) px (longer side capped at
  ``NORM_MAX_SIDE``; Pillow's antialiased bilinear both ways).

Why the normalisation: the variance of a Laplacian is a per-pixel second difference, so the
same scene measures very differently at 8 px and at 1,000 px (downscaling concentrates detail
in fewer pixels and raises it; upscaling spreads it and lowers it). On one fixed grid the
Laplacian sees the same fraction of the image's extent at every size, so an image and its
resized copy measure alike and images of different sizes compare. 64 px is twice the model's
usual input (``training.image_size`` 32): blur the model cannot see at its own input is not
worth dropping an image for, and blur it can see is still two grid pixels wide here.
Dividing by the image's own variance (a contrast-free share of fine detail) was measured and
rejected: it separated heavily blurred images from the bulk worse on the digits and the
textures (bench/outlier_calibration.py, docs/curation.md); contrast has its own rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

NORM_SIDE = 64  # px, shorter side of the grid the blur is measured on
NORM_MAX_SIDE = 256  # px, cap of the longer side on that grid (a panorama is not measured at full length)


@dataclass(frozen=True)
class ImageStats:
    """One image's statistics (grey levels 0..255; ``blur`` in grey levels squared on the 64 px grid)."""

    family: str  # "grey" | "colour"
    width: int
    height: int
    mean: float
    contrast: float
    blur: float
    min: float
    max: float


def family_of(mode: str) -> str:
    """The mode family the rules compare an image within (the decoded, alpha-composited mode)."""
    return "grey" if mode in ("1", "L", "I", "I;16", "F") else "colour"


def image_stats(flat: Image.Image) -> ImageStats:
    """Statistics of one decoded L or RGB image (the curation's one decode)."""
    grey = flat if flat.mode == "L" else flat.convert("L")
    pixels = np.asarray(grey, dtype=np.float64)
    width, height = grey.size
    return ImageStats(
        family=family_of(flat.mode),
        width=width,
        height=height,
        mean=float(pixels.mean()),
        contrast=float(pixels.std()),
        blur=normalised_blur(grey),
        min=float(pixels.min()),
        max=float(pixels.max()),
    )


def normalised_blur(grey: Image.Image) -> float:
    """Variance of the Laplacian on the ``NORM_SIDE`` grid (0 for a flat image)."""
    width, height = grey.size
    scale = NORM_SIDE / min(width, height)
    size = (min(NORM_MAX_SIDE, max(NORM_SIDE, round(width * scale))),
            min(NORM_MAX_SIDE, max(NORM_SIDE, round(height * scale))))
    # BILINEAR in Pillow is antialiased when shrinking (its support grows with the factor), so
    # a large image is averaged rather than sampled, and a small one interpolated.
    g = np.asarray(grey.resize(size, Image.BILINEAR) if size != grey.size else grey, dtype=np.float64)
    lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4.0 * g[1:-1, 1:-1]
    return float(lap.var())
