"""Positions in their narrow type: ``flat_positions`` is ``np.flatnonzero`` filled a block at a time."""

import numpy as np
import pytest

from tasks.curation.positions import flat_positions, position_dtype


@pytest.mark.parametrize("block", [1, 2, 3, 64, 1 << 20])
@pytest.mark.parametrize("share", [0.0, 0.01, 0.5, 1.0])
def test_flat_positions_equal_flatnonzero(block: int, share: float) -> None:
    mask = np.random.default_rng(7).random(1_000) < share
    got = flat_positions(mask, block)
    assert got.dtype == np.int32
    assert np.array_equal(got, np.flatnonzero(mask))


def test_flat_positions_of_nothing() -> None:
    got = flat_positions(np.zeros(0, dtype=bool))
    assert got.dtype == np.int32 and len(got) == 0


def test_position_type_widens_past_int32() -> None:
    assert position_dtype(2**31 - 1) is np.int32
    assert position_dtype(2**31) is np.int64
