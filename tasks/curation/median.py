"""The median of a large array without a copy of it: ``np.median``'s number from a bracket of a few values.

``np.median`` partitions a copy of its input: at a million images a family's values, their transform and their
distances from the bulk are 8 MB each, and the copy was one more while a relative rule ran. Here the middle ranks
are bracketed from an evenly strided sample, the values are counted against the bracket a block at a time, and only
the values inside it are partitioned. Where the sample misjudges (the input's order is unlike its values, a NaN, a
bracket too wide), ``np.median`` itself answers: the number is always ``np.median``'s, only the memory differs.
"""

from __future__ import annotations

import math

import numpy as np

SMALL = 1 << 16  # fewer values: np.median (its copy is small)
SAMPLE = 1 << 15  # values the bracket is chosen from
BLOCK = 1 << 16  # values counted at a time
MAX_INSIDE = 8  # the bracket's values at most 1/MAX_INSIDE of all (else np.median)


def median_of(values: np.ndarray, *, absolute: bool = False) -> float:
    """``float(np.median(values))``, or of ``np.abs(values)`` with ``absolute`` (no array of them made): 1-d."""
    n = len(values)
    if n >= SMALL:
        ranks = (n // 2 - 1, n // 2) if n % 2 == 0 else (n // 2,)  # np.median's middle: the mean of these
        lo, hi = _bracket(values, ranks, absolute)
        if (middle := _middle(values, ranks, lo, hi, absolute)) is not None:
            return float(np.mean(middle))
    return float(np.median(np.abs(values) if absolute else values))


def _block(values: np.ndarray, start: int, absolute: bool) -> np.ndarray:
    part = values[start:start + BLOCK]
    return np.abs(part) if absolute else part


def _bracket(values: np.ndarray, ranks: tuple[int, ...], absolute: bool) -> tuple[float, float]:
    """Values below and above which the ``ranks`` most likely lie (a strided sample's quantiles, with a margin
    of four of its standard errors)."""
    strided = values[::max(1, len(values) // SAMPLE)]
    sample = np.sort(np.abs(strided) if absolute else strided)
    m, span = len(sample), max(1, len(values) - 1)
    margin = 4 * int(math.sqrt(m)) + 16
    first, last = ranks[0] * (m - 1) // span, -(-ranks[-1] * (m - 1) // span)
    return float(sample[max(0, first - margin)]), float(sample[min(m - 1, last + margin)])


def _middle(values: np.ndarray, ranks: tuple[int, ...], lo: float, hi: float, absolute: bool) -> np.ndarray | None:
    """The values at ``ranks`` of the sorted values (as an array), when they lie in ``[lo, hi]``; else None.

    Sorted, the values are those below ``lo``, those equal to it, those between, those equal to ``hi`` and those
    above: only the few between are held (ties at the ends, as a constant family's sides, are counted)."""
    counts = np.zeros(5, dtype=np.int64)  # below, at lo, between, at hi (not lo), above
    between: list[np.ndarray] = []
    for start in range(0, len(values), BLOCK):
        part = _block(values, start, absolute)
        inside = (part > lo) & (part < hi)
        between.append(part[inside])
        counts += (np.count_nonzero(part < lo), np.count_nonzero(part == lo), len(between[-1]),
                   0 if hi == lo else np.count_nonzero(part == hi), np.count_nonzero(part > hi))
        if counts[2] > len(values) // MAX_INSIDE:
            return None
    if counts.sum() != len(values):  # a NaN compares false with all: np.median says NaN
        return None
    ends = np.cumsum(counts)
    where = np.searchsorted(ends, ranks, side="right")  # which of the five each rank falls in
    if np.any((where == 0) | (where == 4)):
        return None
    kth = [rank - int(ends[1]) for rank, w in zip(ranks, where) if w == 2]
    inner = iter(np.partition(np.concatenate(between), kth)[kth].tolist() if kth else [])
    return np.array([lo if w == 1 else hi if w == 3 else next(inner) for w in where], dtype=values.dtype)
