"""median.median gives np.median's number without a copy of its input: every order, size, tie, NaN and infinity."""

import numpy as np
import pytest

from tasks.curation import median as median_module
from tasks.curation.median import median_of


def _cases(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = 70_001
    normal = rng.normal(size=n)
    return {
        "normal, odd": normal,
        "normal, even": normal[:-1],
        "sorted": np.sort(normal),
        "sorted descending": np.sort(normal)[::-1].copy(),
        "ties": rng.integers(0, 5, size=n).astype(np.float64),
        "constant": np.full(n, 3.25),
        "heavy tails": rng.standard_cauchy(size=n),
        "two clusters": np.concatenate([rng.normal(-50, 1, n // 2), rng.normal(50, 1, n - n // 2)]),
        "strided order unlike the values": np.where(np.arange(n) % 2 == 0, 1e6, rng.normal(size=n)),
        "infinities": np.concatenate([np.full(40_000, -np.inf), normal[:30_000], np.full(5, np.inf)]),
        "one NaN": np.concatenate([normal[:-1], [np.nan]]),
        "periodic with the sample's stride": np.tile(np.arange(2.0), n // 2),
        "logit of a grey mean": np.log(np.clip(rng.normal(120, 30, n), 0, 255) + 2.0),
    }


@pytest.mark.parametrize("absolute", [False, True])
def test_median_is_numpys_number(absolute: bool) -> None:
    for name, values in _cases(np.random.default_rng(7)).items():
        expected = np.median(np.abs(values) if absolute else values)
        got = median_of(values, absolute=absolute)
        assert (np.isnan(expected) and np.isnan(got)) or got == expected, name


def test_median_leaves_its_input_as_it_was() -> None:
    values = np.random.default_rng(1).normal(size=100_000)
    before = values.copy()
    median_of(values)
    median_of(values, absolute=True)
    assert np.array_equal(values, before)


@pytest.mark.parametrize("small", [1, 2, 3, 1 << 16])
def test_median_at_any_size_once_past_small(monkeypatch: pytest.MonkeyPatch, small: int) -> None:
    monkeypatch.setattr(median_module, "SMALL", small)
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 5, 17, 1000, 65_537, 131_072):
        values = rng.normal(size=n)
        assert median_of(values) == np.median(values)
        assert median_of(values, absolute=True) == np.median(np.abs(values))


def test_median_of_nothing_is_numpys() -> None:
    with pytest.warns(RuntimeWarning):
        assert np.isnan(median_of(np.array([], dtype=np.float64)))


def test_the_bracket_answers_without_numpys_copy() -> None:
    """The bracket holds the middle on a family's kind of values (the saving is real), and gives way where the
    sample cannot see the values (the number is still np.median's, above)."""
    rng = np.random.default_rng(5)
    n = 200_000
    for values in (rng.normal(size=n), np.full(n, np.log(32.0)), np.sort(rng.normal(size=n)),
                   rng.integers(0, 4, size=n).astype(np.float64)):
        for absolute in (False, True):
            ranks = (n // 2 - 1, n // 2)
            bracket = median_module._bracket(values, ranks, absolute)
            assert median_module._middle(values, ranks, *bracket, absolute) is not None
    alternating = np.where(np.arange(n) % 2 == 0, 1e6, rng.normal(size=n))  # the sample sees only the 1e6
    assert median_module._middle(alternating, (n // 2 - 1, n // 2),
                                 *median_module._bracket(alternating, (n // 2 - 1, n // 2), False), False) is None
