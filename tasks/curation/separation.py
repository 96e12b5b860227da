"""Does the copy threshold separate copies from distinct images in each class, on the data at hand?

``curation.copy_similarity`` was calibrated on some image families; on others (thin single
strokes, repetitive textures) distinct images of one class score as high as copies do, and a
fixed threshold then drops real data. So before a near-duplicate is dropped, the class proves
that its copies stand out from its bulk:

* each image of the class gets its nearest score: its highest copy score to another image of the
  class among the pairs scored so far (the candidate pairs of ``tasks.curation.copy_pairs``; an
  image with identical pixels is not a neighbour here: an exact duplicate is no evidence about
  distinct images), kept per image in the ``curation_nearest`` summary that a batch updates
  (``tasks.curation.nearest``) rather than rescanned;
* scores are compared as ``x = -log(1 - score)`` (the residual on a log scale: 0.99 -> 4.6,
  0.9974 -> 5.95, 0.9993 -> 7.3), where the bulk of distinct images is roughly symmetric;
* the bulk is described by robust statistics of its LOWER half, which copies (at the top) do not
  move: the median and the spread ``(median - q10) / 1.2816`` (a normal's lower half);
* the threshold separates when it lies at least ``copy_min_separation`` spreads above the median
  (``z``). Otherwise distinct images of this class reach the threshold, and the curation abstains
  for the class: no ``near_duplicate`` drop, the would-be copies kept in their component and listed.

A class with fewer than ``copy_min_class_images`` images with a nearest score cannot show it
either way and abstains as well. Exact duplicates are decided outside this test (see
docs/curation.md, "When the rule abstains").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

LOWER_QUANTILE = 0.10
NORMAL_Q10 = 1.2816  # standard normal's median - q10
MIN_SPREAD = 0.05  # log units: a class whose bulk is a single value still gets a finite z
MAX_X = -math.log(1e-6)
RANK = 2


def residual_log(score: float) -> float:
    """-log(1 - score), capped (a score of 1 is not infinitely far)."""
    return min(MAX_X, -math.log(max(1e-6, 1.0 - score)))


@dataclass(frozen=True)
class ClassSeparation:
    """What the data of one class says about the copy threshold."""

    label: str
    images: int  # images of the class with a nearest score
    median_score: float  # nearest scores' median (NaN without images)
    z: float  # the threshold's robust z above the bulk (NaN without enough images)
    at_or_above: int  # images whose nearest score reaches the threshold
    separates: bool
    why: str

    def to_dict(self) -> dict:
        """JSON-ready: NaN (no statistic) becomes None."""
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in asdict(self).items()}


def residual_logs(scores: np.ndarray) -> np.ndarray:
    """``residual_log`` of each score, as one array (math's log a value: the same numbers as the scalar)."""
    return np.fromiter((residual_log(v) for v in scores.tolist()), dtype=np.float64, count=len(scores))


def separation(label: str, nearest: Sequence[float] | np.ndarray, threshold: float, min_z: float, min_images: int
               ) -> ClassSeparation:
    """Whether ``threshold`` lies clear of the bulk of this class's nearest scores (see the module doc)."""
    scores = np.asarray(nearest, dtype=np.float64)
    x = residual_logs(scores)
    above = int((scores >= threshold).sum())
    median_score = float(np.median(scores)) if len(scores) else float("nan")
    if len(x) < min_images:
        return ClassSeparation(label, len(x), median_score, float("nan"), above, False,
                               f"{len(x)} images with a scored neighbour, fewer than copy_min_class_images "
                               f"{min_images}: too few to show that copies stand out")
    median = float(np.median(x))
    spread = max(MIN_SPREAD, (median - float(np.quantile(x, LOWER_QUANTILE))) / NORMAL_Q10)
    z = (residual_log(threshold) - median) / spread
    if z >= min_z:
        return ClassSeparation(label, len(x), median_score, z, above, True,
                               f"threshold {threshold} lies {z:.1f} spreads above the bulk (median nearest score "
                               f"{median_score:.4f} over {len(x)} images; needs {min_z:g})")
    return ClassSeparation(label, len(x), median_score, z, above, False,
                           f"threshold {threshold} lies only {z:.1f} spreads above the bulk (median nearest score "
                           f"{median_score:.4f} over {len(x)} images, {above} at or above the threshold; needs "
                           f"{min_z:g}): distinct images of this class score like copies")


def separation_by_class(labels: Iterable[str], nearest: Mapping[str, np.ndarray], threshold: float, min_z: float,
                        min_images: int) -> dict[str, ClassSeparation]:
    """label -> its ``ClassSeparation`` for every label (``nearest``: label -> its images' nearest scores,
    ``tasks.curation.nearest``; a label without any: too few images)."""
    none = np.zeros(0, dtype=np.float64)
    return {lab: separation(lab, nearest.get(lab, none), threshold, min_z, min_images) for lab in sorted(set(labels))}
