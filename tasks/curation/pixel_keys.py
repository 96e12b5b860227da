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
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.curation.by_position import ByPosition

DIGEST_BYTES = 32
DECODE_ROWS = 65_536  # digests decoded at a time (their scratch arrays: a few MB)
HEAD_BLOCK = 65_536  # positions whose key heads are looked up at a time (``PixelKeys.sharing_heads``)
_NIBBLE = np.full(256, 255, dtype=np.uint8)  # a lowercase hex digit's byte -> its value; any other byte -> 255
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


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


def _hashed(key: str) -> bytes:
    """The 32 bytes an odd key (no sha256 hex digest) is held as: the sha256 of its text."""
    return hashlib.sha256(key.encode()).digest()


def _text(rows: pa.StringArray) -> np.ndarray:
    """The bytes of a string array's values, one after the other (no nulls among them)."""
    if not len(rows):
        return np.zeros(0, dtype=np.uint8)
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=len(rows) + 1, offset=4 * rows.offset)
    return np.frombuffer(rows.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]


class Digests:
    """The stored pixel digests of some images, by position: 32 bytes each (``packed``), whether the image has one
    (``present``: an image that did not decode has none) and the odd ones (no sha256 hex digest: a test's name) as
    they are, by position, their rows holding the text's own sha256. Read from the Arrow column without making a
    Python string an image: at a million images the digests as interned strings were about 155 MB (the strings,
    and the slots they added to Python's table of interned strings, which it keeps once grown)."""

    def __init__(self, packed: np.ndarray, present: np.ndarray, odd: dict[int, str]) -> None:
        self.packed, self.present, self.odd = packed, present, odd

    @classmethod
    def of_column(cls, column: pa.Array | pa.ChunkedArray) -> Digests:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        parts = [cls._of_array(chunk.slice(start, DECODE_ROWS).cast(pa.string()))  # its scratch: a slice's
                 for chunk in chunks for start in range(0, len(chunk), DECODE_ROWS)]
        return cls.concat(parts) if parts else cls.of_values([])

    @classmethod
    def of_values(cls, values: Sequence[str | None]) -> Digests:
        """From strings (tests, small sets)."""
        return cls._of_array(pa.array(values, pa.string()))

    @classmethod
    def concat(cls, parts: Sequence[Digests]) -> Digests:
        starts = np.cumsum([0, *(len(p) for p in parts)])
        odd = {int(start) + i: key for start, p in zip(starts, parts) for i, key in p.odd.items()}
        return cls(np.concatenate([p.packed for p in parts]).reshape(-1, DIGEST_BYTES),
                   np.concatenate([p.present for p in parts]).astype(bool), odd)

    @classmethod
    def _of_array(cls, array: pa.StringArray) -> Digests:
        """Hex rows decoded at once (a byte table: two digits a byte); any other string is odd."""
        present = array.is_valid().to_numpy(zero_copy_only=False)
        hexed = present & (pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False) == 2 * DIGEST_BYTES)
        candidates = np.flatnonzero(hexed)
        nibbles = _NIBBLE[_text(array.filter(pa.array(hexed)))].reshape(-1, 2 * DIGEST_BYTES)
        good = ~(nibbles == 255).any(axis=1)
        packed = np.zeros((len(array), DIGEST_BYTES), dtype=np.uint8)
        packed[candidates[good]] = (nibbles[good, 0::2] << 4) | nibbles[good, 1::2]
        decoded = np.zeros(len(array), dtype=bool)
        decoded[candidates[good]] = True
        odd_at = np.flatnonzero(present & ~decoded)
        odd = dict(zip(odd_at.tolist(), array.take(pa.array(odd_at)).to_pylist(), strict=True))
        for i, key in odd.items():
            packed[i] = np.frombuffer(_hashed(key), dtype=np.uint8)
        return cls(packed, present, odd)

    def __len__(self) -> int:
        return len(self.present)

    def take(self, positions: np.ndarray) -> Digests:
        """These digests in the order of ``positions``."""
        odd = {}
        if self.odd:
            odd = {j: self.odd[i] for j, i in enumerate(positions.tolist()) if i in self.odd}
        return Digests(self.packed[positions], self.present[positions], odd)

    def value(self, i: int) -> str | None:
        """The digest at ``i`` as it was stored (None: the image has none)."""
        if not self.present[i]:
            return None
        return self.odd[i] if i in self.odd else self.packed[i].tobytes().hex()


class PixelKeys(ByPosition[str]):
    """sha256 -> its pixel key, held as 32 bytes by position (the module's docstring).

    The bytes are the stored digests themselves (``Digests.packed``: in a curation the features' facts as stored,
    a mapped file's pages, not a copy of 32 bytes an image held from the grouping to the end); the few images without a
    digest have their key beside them (``own``: their sha256's bytes)."""

    def __init__(self, at: Mapping[str, int], packed: np.ndarray, odd: dict[str, str],
                 own: dict[int, bytes] | None = None) -> None:
        self.at = at  # sha256 -> position (the raw rows' map, shared)
        self.packed = packed  # (positions, 32) uint8; an image without a digest: its row is not read (``own``)
        self._bytes = memoryview(np.ascontiguousarray(packed).reshape(-1))  # uint8: a slice of it is a fast read
        self.odd = odd  # sha256 -> a key that is no sha256 hex digest (its row holds the key's own sha256)
        self.own = own or {}  # position -> the key of an image without a digest (its sha256's 32 bytes)

    @classmethod
    def of(cls, at: Mapping[str, int], keys: Iterable[str]) -> PixelKeys:
        """``keys``: each image's key, in ``at``'s order (packed as ``of_digests`` packs stored digests)."""
        keys = list(keys)
        if len(keys) != len(at):
            raise ValueError(f"{len(keys)} pixel keys for {len(at)} images")
        return cls.of_digests(at, list(at), Digests.of_values(keys))

    @classmethod
    def of_digests(cls, at: Mapping[str, int], shas: Sequence[str], digests: Digests) -> PixelKeys:
        """Each image's digest, or its sha256 where it has none: ``digests`` and ``shas`` in ``at``'s order (the
        digests' own bytes, not a copy)."""
        odd = {shas[i]: key for i, key in digests.odd.items()}
        own = {}
        for i in np.flatnonzero(~digests.present).tolist():  # the few images without pixels: their own sha256
            raw = _packed(shas[i])
            if raw is None:
                odd[shas[i]] = shas[i]
                raw = _hashed(shas[i])
            own[i] = raw
        return cls(at, digests.packed, odd, own)

    def key_at(self, i: int) -> bytes:
        """Position ``i``'s 32 bytes."""
        own = self.own.get(i) if self.own else None
        return own if own is not None else self._bytes[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES].tobytes()

    def heads(self, positions: np.ndarray) -> np.ndarray:
        """Each position's key's first 8 bytes as one number (equal keys, equal heads: a sieve before the whole key)."""
        heads = np.ascontiguousarray(self.packed[positions, :8]).view(np.uint64).ravel()
        if self.own:
            for j in np.flatnonzero(np.isin(positions, list(self.own))).tolist():
                heads[j] = np.frombuffer(self.own[int(positions[j])][:8], dtype=np.uint64)[0]
        return heads

    def sharing_heads(self, positions: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """The indices (ascending) of ``positions`` whose key's first 8 bytes are those of one of ``wanted``
        (positions too: a batch's few), a block of ``HEAD_BLOCK`` positions at a time, by binary search in the wanted
        heads: ``np.isin`` of every position's head sorted them all together (about 45 bytes a position held at
        once: at a million images the grouping's and the assignment's high, bench/README.md, run 37)."""
        heads = np.unique(self.heads(wanted))
        found = [np.zeros(0, dtype=np.int64)]
        for start in range(0, len(positions) if len(heads) else 0, HEAD_BLOCK):
            block = self.heads(positions[start:start + HEAD_BLOCK])
            at = np.minimum(np.searchsorted(heads, block), len(heads) - 1)
            found.append(np.flatnonzero(heads[at] == block) + start)
        return np.concatenate(found)

    def first_alike(self, positions: np.ndarray, among: np.ndarray) -> np.ndarray:
        """For each of ``among`` (indices into ``positions``: a batch's new images), the index (into ``positions``) of
        the first one with the same key.

        Only the positions whose key's first 8 bytes are one of theirs are read whole: a sort of every position's 32
        bytes (``np.unique``) held about 100 MB at a million images."""
        if not len(among):
            return np.zeros(0, dtype=np.int64)

        def keys(rows: np.ndarray) -> list[bytes]:
            return [self.key_at(i) for i in rows.tolist()]

        hits = self.sharing_heads(positions, positions[among])  # ascending: ``among`` among them
        first: dict[bytes, int] = {}
        for i, key in zip(hits.tolist(), keys(positions[hits])):
            first.setdefault(key, i)
        return np.fromiter((first[k] for k in keys(positions[among])), dtype=np.int64, count=len(among))

    def token(self, sha: str) -> bytes | str:
        """``token(self[sha])``, read without making the string."""
        return self.token_at(self.at[sha], sha)

    def token_at(self, i: int, sha: str) -> bytes | str:
        """``token`` of ``sha``, whose position is ``i``."""
        odd = self.odd.get(sha) if self.odd else None
        return odd if odd is not None else self.key_at(i)

    def __getitem__(self, sha: str) -> str:
        held = self.token(sha)
        return held if isinstance(held, str) else held.hex()
