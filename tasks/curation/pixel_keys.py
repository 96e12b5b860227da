"""Each image's pixel key: the digest of its decoded pixels, or its sha256 when it has none (it did not decode).

Two images with one pixel key are exact duplicates whatever their encoding. The grouping and the walk read the key of
every image of the raw version, so a batch holds all of them. As a map from sha256 to a 64-character string they took
about 190 bytes an image (the string 114, the map's entry the rest); here they are 32 bytes an image by the raw rows'
positions (``tables.RawRows``, whose map from sha256 to position they share), and a lookup gives the string back.
A key that is not a sha256's 64 lowercase hex digits (a test's name) is kept as it is, beside its sha256 in the
array: equal arrays' rows are equal keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np

from tasks.curation.by_position import ByPosition

DIGEST_BYTES = 32


def _packed(key: str) -> bytes | None:
    """The 32 bytes of a sha256 hex digest, or None for any other key."""
    if len(key) != 2 * DIGEST_BYTES or key != key.lower():
        return None
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        return None
    return raw if len(raw) == DIGEST_BYTES else None


def token(key: str) -> bytes | str:
    """A key as a map holds it: the 32 bytes of a sha256 hex digest (65 bytes an object against 114 a string), any
    other key as it is. Two keys are equal exactly when their tokens are."""
    return _packed(key) or key


class PixelKeys(ByPosition[str]):
    """sha256 -> its pixel key, held as 32 bytes by position (the module's docstring)."""

    def __init__(self, at: Mapping[str, int], buffer: bytes, odd: dict[str, str]) -> None:
        self.at = at  # sha256 -> position (the raw rows' map, shared)
        self.buffer = buffer  # 32 bytes a position (a slice of it is a lookup's fastest read)
        self.packed = np.frombuffer(buffer, dtype=np.uint8).reshape(-1, DIGEST_BYTES)  # the same bytes, (positions, 32)
        self.odd = odd  # sha256 -> a key that is no sha256 hex digest (its row holds the key's own sha256)

    @classmethod
    def of(cls, at: Mapping[str, int], keys: Iterable[str]) -> PixelKeys:
        """``keys``: each image's key, in ``at``'s order."""
        buffer = bytearray(len(at) * DIGEST_BYTES)
        odd: dict[str, str] = {}
        for (sha, i), key in zip(at.items(), keys, strict=True):
            raw = _packed(key)
            if raw is None:
                odd[sha] = key
                raw = hashlib.sha256(key.encode()).digest()
            buffer[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES] = raw
        return cls(at, bytes(buffer), odd)

    def first_alike(self, positions: np.ndarray) -> np.ndarray:
        """For each of ``positions``, the index (into ``positions``) of the first one with the same key."""
        rows = np.ascontiguousarray(self.packed[positions]).view(np.dtype((np.void, DIGEST_BYTES))).ravel()
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        return first[inverse.ravel()]

    def token(self, sha: str) -> bytes | str:
        """``token(self[sha])``, read without making the string."""
        i = self.at[sha] * DIGEST_BYTES
        odd = self.odd.get(sha) if self.odd else None
        return odd if odd is not None else self.buffer[i:i + DIGEST_BYTES]

    def __getitem__(self, sha: str) -> str:
        held = self.token(sha)
        return held if isinstance(held, str) else held.hex()
