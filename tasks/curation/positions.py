"""The integer type a position among ``n`` items is held in: int32 below 2**31 items (half the memory of int64, 4 bytes
an image less in every array of positions or codes a table's size), int64 past them."""

from __future__ import annotations

import numpy as np

WIDE_FROM = 2**31  # items from which a position no longer fits int32


def position_dtype(n: int) -> type[np.signedinteger]:
    """numpy's type for a position among ``n`` items."""
    return np.int32 if n < WIDE_FROM else np.int64


def position_code(n: int) -> str:
    """The ``array`` module's type code for a position among ``n`` items (``position_dtype``'s)."""
    return "i" if n < WIDE_FROM else "q"


FLAT_BLOCK = 1 << 16  # mask entries read at a time by ``flat_positions`` (their hits are int64 until placed)


def flat_positions(mask: np.ndarray, block: int = FLAT_BLOCK) -> np.ndarray:
    """``np.flatnonzero(mask)`` in ``position_dtype(len(mask))``, filled a block of ``mask`` at a time: no int64
    array of every hit first (8 bytes a hit, at a million images the width of the table)."""
    out = np.empty(int(np.count_nonzero(mask)), dtype=position_dtype(len(mask)))
    filled = 0
    for start in range(0, len(mask), block):
        hits = np.flatnonzero(mask[start:start + block])
        out[filled:filled + len(hits)] = hits + start
        filled += len(hits)
    return out
