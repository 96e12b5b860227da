"""The C heap of a curation's process: a large block gets its own mapping, so what a phase frees goes back at once.

glibc serves an allocation of at least its mmap threshold with a mapping of its own, returned to the system when it
is freed, and smaller ones from its heaps, which give memory back only from their top (or on ``malloc_trim``). The
threshold starts at 128 KiB and is dynamic: each mapped block freed raises it to that block's size, up to 32 MiB. A
curation reads the table a block at a time (Arrow on the system pool, numpy's arrays); once its first blocks were
freed, the next phases' blocks of a few MB came from the heaps, and what one phase freed stayed resident beneath what
the next one held. Fixed (``mallopt(M_MMAP_THRESHOLD)``, which also ends the dynamic rise), a block of 1 MiB or more
is mapped and unmapped: a 1% batch on the 100,000-image table had its plan's anonymous high at 195-197 MB against
238, in as many seconds (bench/README.md, "Curation at scale", run 32).

Only a curation sets it (``curate``): training's tensors are blocks of that size allocated every step, and each
would be a fresh mapping. An explicit ``MALLOC_MMAP_THRESHOLD_`` in the environment wins; elsewhere than glibc
nothing is set.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK = 1 << 20  # bytes: a block this large or larger is a mapping of its own


def map_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; True when it was set."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # another C library (musl): its own allocator, no such option
        return False
    mallopt = getattr(libc, "mallopt", None)
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1
