"""A read-only map from sha256 to a value held in columns by position (``at``: sha256 -> position).

Curation holds several such maps over every image of a raw version (the raw rows, their features' facts, the pixel
keys); each builds its value from its columns on a lookup, and shares its keys, order and size with ``at``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import TypeVar

import numpy as np

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
