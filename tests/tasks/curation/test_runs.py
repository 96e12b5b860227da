"""Rows grouped by key in arrays: each key's newest row and each run's range, against a loop over the rows."""

import numpy as np
import pytest

from tasks.curation.runs import newest_rows, runs_of


@pytest.mark.parametrize("later_wins", [True, False])
def test_newest_rows_match_a_loop_over_the_rows(later_wins: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        keys, written = rng.integers(0, 6, n), rng.integers(0, 3, n)  # few values: many ties
        best: dict[int, int] = {}
        for r in range(n):
            held = best.get(int(keys[r]))
            if held is None or written[r] > written[held] or (written[r] == written[held] and later_wins):
                best[int(keys[r])] = r
        assert newest_rows(keys, written, later_wins).tolist() == [best[k] for k in sorted(best)]


def test_runs_give_each_keys_range_of_values() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        keys, values = rng.integers(0, 5, n), rng.integers(-1, 3, n)
        runs = runs_of(keys, values)
        assert sorted(keys[runs.order].tolist()) == keys[runs.order].tolist()
        expected = {int(k): values[keys == k] for k in np.unique(keys)}
        for s, e, low, high, same in zip(runs.start, runs.end, runs.low, runs.high, runs.same, strict=True):
            rows = runs.order[s:e]
            assert len(set(keys[rows].tolist())) == 1
            want = expected.pop(int(keys[rows[0]]))
            assert sorted(values[rows].tolist()) == sorted(want.tolist())  # the run is all of the key's rows
            assert (low, high, same) == (want.min(), want.max(), want.min() == want.max())
        assert not expected
