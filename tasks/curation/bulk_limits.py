"""Data-relative bad-image limits: an image is flagged only when it lies far outside its own data's bulk.

For one statistic and one mode family of one raw version: the bulk is the median and the
robust sigma (1.4826 x MAD) of a transform of the statistic (``RULES``), and an image is a
candidate when it lies more than ``sigmas`` robust sigmas beyond the median on the bad side.
A rule proves it separates before it acts:

* the candidates must stand apart: walking outward from the limit, the cut falls at the first
  gap of at least ``gap`` robust sigmas between neighbouring values; candidates before that gap
  are the bulk's own tail and are kept. No such gap: the rule abstains (a limit that falls in a
  continuum of real images would drop them on a coin toss).
* no class may lose more than ``max_share`` of its images of the family to the rule (at least
  one image is always allowed): otherwise the rule abstains (what it sees is a kind of image,
  not an accident).
* a family with fewer than ``min_images`` images has no bulk to speak of: it abstains.
* an image is flagged only when it is also beyond ``sigmas`` of its own class's bulk (for a
  class of at least ``min_images`` images of the family): a class unlike the rest of its
  family (plain sky among textures) is not an outlier for being itself.

An abstention drops nothing for that statistic and family, and says why. Pure numpy; the
numbers (``sigmas``, ``gap``, ``min_images``) are calibrated by bench/outlier_calibration.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tasks.curation.median import median_of
from tasks.curation.name_codes import encode
from tasks.curation.positions import flat_positions

MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma per median absolute deviation


@dataclass(frozen=True)
class Rule:
    """One relative rule: the statistic it reads, how it is transformed and which tail is bad."""

    reason: str
    statistic: str  # "side" (shorter side), "mean", "contrast" or "blur"
    transform: Callable[[np.ndarray], np.ndarray]
    inverse: Callable[[float], float]  # back to the statistic's units (for the limit a report shows)
    low_is_bad: bool
    min_sigma: float  # floor of the robust sigma (transformed units): a bulk of identical values is no licence


# The transforms work in one new array, in place: at a million images each temporary is 8 MB of a family's values,
# and the expression forms held three at once. The same operations in the same order: the same numbers.


def _log_side(x: np.ndarray) -> np.ndarray:
    t = np.maximum(x, 1.0)
    return np.log(t, out=t)


def _log1p(x: np.ndarray) -> np.ndarray:
    t = np.add(np.asarray(x, dtype=np.float64), 1.0)
    return np.log(t, out=t)


def _expm1(t: float) -> float:
    return math.exp(t) - 1.0


def _brightness_inverse(t: float) -> float:
    return 259.0 / (1.0 + math.exp(-t)) - 2.0


def _brightness(x: np.ndarray) -> np.ndarray:
    # Logit of the mean grey: a step near black or white counts for more than one in the mid-tones,
    # as the eye and an exposure change see it.
    p = np.clip(np.asarray(x, dtype=np.float64), 0.0, 255.0)
    np.add(p, 2.0, out=p)
    np.divide(p, 259.0, out=p)
    q = np.subtract(1.0, p)
    np.divide(p, q, out=p)
    del q
    return np.log(p, out=p)


RULES: tuple[Rule, ...] = (
    Rule("too_small", "side", _log_side, math.exp, True, 0.05),
    Rule("too_dark", "mean", _brightness, _brightness_inverse, True, 0.05),
    Rule("too_bright", "mean", _brightness, _brightness_inverse, False, 0.05),
    Rule("blurry", "blur", _log1p, _expm1, True, 0.05),  # blur and contrast span decades: log, 0 stays finite
    Rule("flat", "contrast", _log1p, _expm1, True, 0.05),  # after blur: a blurred image loses contrast too
)


class Classes:
    """Each image's class, as a code into ``names`` (a family's images: a Python string or pointer an image was 8-16
    bytes of the table at a million, twice over while a rule looked its flagged images' classes up)."""

    def __init__(self, codes: np.ndarray, names: Sequence[str]) -> None:
        self.codes, self.names = codes, list(names)
        self._code = {name: k for k, name in enumerate(self.names)}

    @classmethod
    def of(cls, labels: Sequence[str] | Classes) -> Classes:
        if isinstance(labels, Classes):
            return labels
        names = sorted(set(labels))  # every name there already: the codes follow their order
        return cls(encode(labels, names), names)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> str:
        """Image ``i``'s class."""
        return self.names[self.codes[i]]

    def members(self, label: str) -> np.ndarray:
        """The positions of the images of class ``label``, ascending."""
        code = self._code.get(label)
        return np.zeros(0, dtype=np.int64) if code is None else flat_positions(self.codes == code)


@dataclass(frozen=True)
class Bulk:
    """Where a family's bulk lies for one rule, in the statistic's own units."""

    median: float  # of the statistic (not transformed)
    limit: float | None  # the statistic's value beyond which an image is a candidate; None when abstaining
    cut: float | None  # the value beyond which images were flagged (the gap's far side)


@dataclass(frozen=True)
class Verdict:
    """A rule's decision for one family: the flagged indices, or why it abstains."""

    rule: Rule
    bulk: Bulk
    flagged: list[int]
    abstained: list[tuple[str, str]]  # (label or "*", why)
    tail_kept: int = 0  # candidates beyond the limit kept as the bulk's own tail


def judge(rule: Rule, values: np.ndarray, labels: Sequence[str] | Classes, *, sigmas: float, gap: float, min_images: int,
          max_share: float) -> Verdict:
    """Apply one rule to one family's values (one per image, in ``labels`` order: their classes, ``Classes`` or
    strings)."""
    labels = Classes.of(labels)
    values = np.asarray(values, dtype=np.float64)
    median = median_of(values) if len(values) else math.nan
    if len(values) < min_images:
        why = f"{len(values)} images, fewer than the {min_images} a bulk needs: no relative rule"
        return Verdict(rule, Bulk(median, None, None), [], [("*", why)])
    z, limit = _robust_z(rule, values, sigmas)
    beyond = np.flatnonzero(z < -sigmas)  # the few beyond the limit, ordered by distance: no sort of every image
    candidates = beyond[np.argsort(z[beyond], kind="stable")].tolist()
    if not candidates:
        return Verdict(rule, Bulk(median, limit, None), [], [])
    flagged, tail = _beyond_gap(z, candidates, gap)
    if not flagged:
        why = (f"{len(candidates)} images beyond the limit {limit:.4g} but no gap of {gap:g} robust sigmas "
               f"between them and the bulk (median {median:.4g}): they are its tail, not accidents")
        return Verdict(rule, Bulk(median, limit, None), [], [("*", why)], len(candidates))
    cut = float(values[flagged[-1]])
    flagged = _beyond_own_class(rule, values, labels, flagged, sigmas, min_images)
    crowded = _crowded_classes(flagged, labels, max_share)
    if crowded:
        return Verdict(rule, Bulk(median, limit, cut), [], crowded, tail)
    return Verdict(rule, Bulk(median, limit, cut), sorted(flagged), [], tail)


def _robust_z(rule: Rule, values: np.ndarray, sigmas: float) -> tuple[np.ndarray, float]:
    """Signed robust distances (negative = towards the bad tail) and the limit in the statistic's units."""
    t = rule.transform(values)  # worked in place from here: one array of the family's size, not four
    if np.shares_memory(t, values):  # a transform that returned its input: the caller's values stay as they are
        t = t.copy()
    centre = median_of(t)  # np.median's numbers without its copies (and no array of the absolute deviations)
    np.subtract(t, centre, out=t)
    sigma = max(MAD_TO_SIGMA * median_of(t, absolute=True), rule.min_sigma)
    sign = 1.0 if rule.low_is_bad else -1.0
    np.multiply(t, sign, out=t)  # exact: the distances as ``sign * (t - centre) / sigma`` has them
    np.divide(t, sigma, out=t)
    return t, rule.inverse(centre - sign * sigmas * sigma)


def _beyond_gap(z: np.ndarray, candidates: list[int], gap: float) -> tuple[list[int], int]:
    """(candidates beyond the first gap of ``gap`` sigmas, walking out from the bulk; how many were before it)."""
    chosen = np.zeros(len(z), dtype=bool)
    chosen[candidates] = True
    # The bulk's last image on the bad side (the median is never a candidate), without a copy of the rest's distances.
    previous = float(np.min(z, where=~chosen, initial=np.inf))
    walk = candidates[::-1]  # nearest the bulk first
    for n, i in enumerate(walk):
        if previous - float(z[i]) >= gap:
            return walk[n:][::-1], n
        previous = float(z[i])
    return [], len(walk)


def _beyond_own_class(rule: Rule, values: np.ndarray, labels: Classes, flagged: list[int], sigmas: float,
                      min_images: int) -> list[int]:
    """The flagged images that are also beyond ``sigmas`` of their own class's bulk (where it has ``min_images``).

    A class can be unlike the rest of its family (a sky class among textures): its images are
    judged against their own kind too, and only an image far from both is flagged. Only the classes
    of flagged images are looked at (a few), not every image's class, one at a time: each class's positions and
    distances, held together, were as many again as the family's values (16 bytes an image).
    """
    beyond: set[int] = set()
    for label in dict.fromkeys(labels[i] for i in flagged):  # each class hit, once
        mine = [i for i in flagged if labels[i] == label]
        own = labels.members(label)
        if len(own) < min_images:  # no bulk of its own: the family's verdict stands
            beyond.update(mine)
            continue
        z = _robust_z(rule, values[own], sigmas)[0]
        beyond.update(i for i in mine if z[np.searchsorted(own, i)] < -sigmas)
    return [i for i in flagged if i in beyond]


def _crowded_classes(flagged: list[int], labels: Classes, max_share: float) -> list[tuple[str, str]]:
    """(label, why) of each class that would lose more than ``max_share`` of its images (one is always allowed)."""
    hits: dict[str, int] = {}
    for i in flagged:
        hits[labels[i]] = hits.get(labels[i], 0) + 1
    totals = {label: len(labels.members(label)) for label in hits}  # the classes hit only
    return [(label, f"would drop {n} of {totals[label]} images of class {label!r} ({n / totals[label]:.1%}), "
                    f"more than max_share {max_share:g}: a kind of image, not an accident")
            for label, n in sorted(hits.items()) if n > max(1.0, max_share * totals[label])]
