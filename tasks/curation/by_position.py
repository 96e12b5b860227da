"""A read-only map from sha256 to a value held in columns by position (``at``: sha256 -> position).

Curation holds several such maps over every image of a raw version (the raw rows, their features' facts, the pixel
keys); each builds its value from its columns on a lookup, and shares its keys, order and size with ``at`` (the raw
rows' ``SortedRank``: a bisection of their sorted sha256s, no dict).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from itertools import islice
from typing import TypeVar

import numpy as np

from tasks.curation.sha_list import SortedShas, SortedSubset

V = TypeVar("V")


class ByPosition(Mapping[str, V]):
    """Keys, order and size are ``at``'s (set by the subclass); ``__getitem__`` reads the columns."""

    at: Mapping[str, int]

    def __contains__(self, sha: object) -> bool:
        return sha in self.at

    def __iter__(self) -> Iterator[str]:
        return iter(self.at)

    def __len__(self) -> int:
        return len(self.at)

    def positions(self, shas: Iterable[str]) -> np.ndarray:
        """The positions of ``shas``, in that order (int64; ``KeyError`` for one not held)."""
        return np.fromiter((self.at[s] for s in shas), dtype=np.int64,
                           count=len(shas) if isinstance(shas, Sized) else -1)


class SortedRank(Mapping[str, int]):
    """Each of ``members`` (ascending, distinct) -> its place among them, by bisection: no map an entry (the raw
    rows' sha256s; the groups' keys; a component's recorded members, hundreds of thousands where the benchmark's
    augmented digits chain). A lookup is about 0.9 us against a dict's 0.4 at a million keys; the dict took about
    67 bytes a key (at a million, 67 MB held by every curation from the raw rows to the end). ``members`` as
    ``SortedShas`` (the raw rows') or ``SortedSubset`` (the eligible images): their bytes, about 2 us a lookup."""

    def __init__(self, members: Sequence[str]) -> None:
        if isinstance(members, (SortedShas, SortedSubset)):  # checked ascending and distinct where it was made
            self._find: Callable[[str], int | None] = members.index_of
        elif any(a >= b for a, b in zip(members, islice(members, 1, None))):
            raise ValueError("SortedRank: the members must be ascending and distinct")
        else:
            self._find = self._bisect
        self.members = members

    def _bisect(self, sha: str) -> int | None:
        i = bisect_left(self.members, sha)
        return i if i < len(self.members) and self.members[i] == sha else None

    def __getitem__(self, sha: str) -> int:
        i = self.get(sha)
        if i is None:
            raise KeyError(sha)
        return i

    def get(self, sha: object, default: int | None = None) -> int | None:  # type: ignore[override]
        if not isinstance(sha, str):
            return default
        i = self._find(sha)
        return default if i is None else i

    def __contains__(self, sha: object) -> bool:
        return self.get(sha) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)


class PlaceAmong(Mapping[str, int]):
    """Each image of ``positions`` (ascending positions into the images ``rank`` looks up) -> its index among them: a
    bisection of the images, then of the positions (no string held a member: a component's members, hundreds of
    thousands where the benchmark's augmented digits chain)."""

    def __init__(self, rank: SortedRank, positions: np.ndarray) -> None:
        self.rank, self.positions = rank, positions

    def get(self, sha: object, default: int | None = None) -> int | None:  # type: ignore[override]
        p = self.rank.get(sha)
        if p is None:
            return default
        # the needle in the positions' own type: a wider one (an int64 position) cast every position, each call
        i = int(np.searchsorted(self.positions, self.positions.dtype.type(p)))
        return i if i < len(self.positions) and int(self.positions[i]) == p else default

    def __getitem__(self, sha: str) -> int:
        i = self.get(sha)
        if i is None:
            raise KeyError(sha)
        return i

    def __contains__(self, sha: object) -> bool:
        return self.get(sha) is not None

    def __iter__(self) -> Iterator[str]:
        members = self.rank.members
        return (members[p] for p in self.positions.tolist())

    def __len__(self) -> int:
        return len(self.positions)
