"""The bisection map from sha256 to position (``SortedRank``) answers as a dict of the same keys would."""

from __future__ import annotations

import hashlib

import pytest

from tasks.curation.by_position import SortedRank


def _shas(n: int) -> list[str]:
    return sorted(hashlib.sha256(str(i).encode()).hexdigest() for i in range(n))


def test_sorted_rank_answers_as_a_dict() -> None:
    shas = _shas(500)
    rank, as_dict = SortedRank(shas), {s: i for i, s in enumerate(shas)}
    absent = [hashlib.sha256(f"x{i}".encode()).hexdigest() for i in range(50)] + ["", "0" * 64, "g" * 64]
    for sha in shas + absent:
        assert rank.get(sha) == as_dict.get(sha)
        assert rank.get(sha, -1) == as_dict.get(sha, -1)
        assert (sha in rank) == (sha in as_dict)
    assert [rank[s] for s in shas] == list(range(len(shas)))
    assert list(rank) == shas and len(rank) == len(shas)
    with pytest.raises(KeyError):
        rank[absent[0]]


def test_sorted_rank_other_types_are_absent() -> None:
    rank = SortedRank(_shas(3))
    assert rank.get(None) is None and rank.get(7, -1) == -1  # type: ignore[arg-type]
    assert None not in rank and 7 not in rank


@pytest.mark.parametrize("members", [["b", "a"], ["a", "a"]])
def test_sorted_rank_refuses_unsorted_or_repeated(members: list[str]) -> None:
    with pytest.raises(ValueError, match="ascending and distinct"):
        SortedRank(members)
