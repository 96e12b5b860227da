"""Rows grouped by a key in numpy arrays: each key's newest row, and whether a column stays the same across a key's rows.

Curation reads the table's rows as arrays a block at a time (the record, the nearest summary, a component's members);
these are the two questions it asks of them, answered by one sort and no Python loop over the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def newest_rows(keys: np.ndarray, written: np.ndarray, later_wins: bool) -> np.ndarray:
    """The row of each key with the highest ``written``, ascending by key; of two written at once the later row
    (``later_wins``) or the earlier. Row numbers into ``keys``."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    rows = np.arange(len(keys))
    order = np.lexsort((rows if later_wins else -rows, written, keys))  # by key, then written, then row
    ordered = keys[order]
    return order[np.r_[ordered[1:] != ordered[:-1], True]]  # each key's last: its newest


class Runs(NamedTuple):
    """``keys`` sorted stably (``order``) in runs of one key (``start``: each run's first place in ``order``), with
    the lowest and highest value of a column in each run."""

    order: np.ndarray
    start: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @property
    def end(self) -> np.ndarray:
        return np.r_[self.start[1:], len(self.order)] if len(self.start) else self.start

    @property
    def same(self) -> np.ndarray:
        """Whether the column is one value across each run."""
        return self.low == self.high


def runs_of(keys: np.ndarray, values: np.ndarray) -> Runs:
    """The runs of equal ``keys`` and the range of ``values`` (one a key's row) in each."""
    order = np.argsort(keys, kind="stable")
    if not len(order):
        empty = np.zeros(0, dtype=np.int64)
        return Runs(order, empty, values[:0], values[:0])
    ordered = keys[order]
    start = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    by_key = values[order]
    return Runs(order, start, np.minimum.reduceat(by_key, start), np.maximum.reduceat(by_key, start))
