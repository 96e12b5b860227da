"""The raw version's image bytes, read for the images a step needs, never held whole.

A curation reads the raw version's facts (sha256, label, size: ``tables.read_raw``) and leaves the
bytes in the table. Each step that decodes images reads the ones it needs in one scan of the
version (``lake.scan_keyed``: the ``sha256`` column marks the wanted rows, then only the row groups
holding one are read), in blocks of at most ``BLOCK_ROWS`` rows or ``BLOCK_BYTES`` bytes:

* the features of the images not embedded yet (``blocks``: a batch reads its own images' bytes);
* the copy signatures of the pairs to score (``blocks_holding``: signed as scanned; the bytes are kept
  for the snapshot and the report while they fit ``HOLD_BUDGET``, as a batch's do; a first curation's
  every image does not, and those steps scan again);
* the curated snapshot (``plan.snapshot_batches``: the kept rows' bytes streamed to the writer);
* the report's thumbnails and the galleries (a few hundred images).

Why: at a million 32x32 images the column is about 1 GB, the size of the dataset for real photos;
held for the whole curation it sat beside the neighbour indexes and the scoring. Each scan costs a
read of the column (the version is explicit, so every scan sees the same rows); the bytes held are
those of the step at hand. The rows are kept in Arrow (no Python object per image), in chunks:
a column of a million images holds more than a binary array's 2 GB of offsets.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np
import pyarrow as pa

from tasks.data import lake

BLOCK_ROWS = 1 << 18  # rows a scan block at most
BLOCK_BYTES = 64 << 20  # bytes of images a scan block at most (about: past it by one read of lake.READ_ROWS rows)
TAKE_ROWS = 65_536  # rows gathered at a time from the held chunks
HOLD_BUDGET = 256 << 20  # bytes of images a scan for the signatures may leave held for the later steps


class RawImages:
    """The encoded images of one raw version by sha256; only those held (``hold``) answer ``__call__``."""

    def __init__(self, uri: str, version: int) -> None:
        self.uri, self.version = uri, version
        self.release()

    def blocks(self, wanted: Collection[str] | pa.Array | None = None, position: str | None = None
               ) -> Iterator[pa.Table]:
        """(sha256, image) tables of the wanted rows (None: every row), in the table's order: one scan. With
        ``position`` (and ``wanted`` an array), a third column of that name: each row's index in ``wanted``."""
        columns = ["sha256", "image"]
        if wanted is None:
            blocks = lake.scan_blocks(self.uri, self.version, columns, BLOCK_ROWS, BLOCK_BYTES)
        else:
            value_set = wanted if isinstance(wanted, pa.Array) else pa.array(sorted(wanted), pa.string())
            blocks = lake.scan_keyed(self.uri, self.version, "sha256", value_set, columns, BLOCK_ROWS, BLOCK_BYTES,
                                     position)
        for block in blocks:
            if block.num_rows:
                yield block.set_column(1, "image", block.column("image").cast(pa.binary()))
        # An allocator keeps what a scan freed for reuse (``lake.scan_batches``): under mimalloc, at a million images, a
        # scan for the features left 0.8 GB resident with nothing allocated, beside the bytes held next (0.2 GB after).
        pa.default_memory_pool().release_unused()

    def hold(self, shas: Collection[str]) -> None:
        """Keep the bytes of ``shas`` (beside those already held) until ``release``: one scan when any is new."""
        new = {s for s in shas if s not in self._row}
        for block in self.blocks(new) if new else ():
            self._keep(block)
        self._images = pa.chunked_array(self._chunks, type=pa.binary())

    def blocks_holding(self, wanted: Collection[str], budget: int = HOLD_BUDGET) -> Iterator[pa.Table]:
        """``blocks(wanted)``, holding their bytes as they pass while those held stay within ``budget`` bytes: one
        scan for a step that reads the images once (the copy signatures) and the later steps that read them again
        (a batch's snapshot rows, its report's pictures). Past the budget nothing is held, and those steps scan:
        at a million 32x32 images, held for the scoring, the bytes were 0.85 GB of the full run's plateau."""
        holding = True
        for block in self.blocks(wanted):
            if holding:
                self._keep(block)
                holding = sum(c.nbytes for c in self._chunks) <= budget
                if not holding:
                    self.release()
            yield block
        self._images = pa.chunked_array(self._chunks, type=pa.binary())

    def _keep(self, block: pa.Table) -> None:
        """Hold a scanned block's bytes (those not held yet): row i of the held chunks is the i-th sha256 added."""
        if self._row:
            block = block.filter(pa.array([s not in self._row for s in block.column("sha256").to_pylist()]))
        first = sum(len(c) for c in self._chunks)
        self._chunks += block.column("image").chunks
        shas = block.column("sha256").to_pylist()
        self._row.update((sha, first + i) for i, sha in enumerate(shas))

    def release(self) -> None:
        self._chunks: list[pa.Array] = []
        self._row: dict[str, int] = {}
        self._images = pa.chunked_array([], type=pa.binary())

    def held_bytes(self, shas: Sequence[str]) -> dict[str, bytes]:
        """The bytes of ``shas`` found in the version (held first: at most one scan), by sha256."""
        self.hold(shas)
        return {sha: self(sha) for sha in shas if sha in self._row}

    def rows_within(self, budget: int) -> int:
        """How many held images of their mean size fit in ``budget`` bytes (at least one)."""
        held = sum(c.nbytes for c in self._chunks)
        return max(1, budget * len(self._row) // held) if held else 1

    def holds(self, shas: Sequence[str]) -> bool:
        return all(s in self._row for s in shas)

    def __call__(self, sha: str) -> bytes:
        return self._images[self._row[sha]].as_py()

    def column(self, shas: Sequence[str]) -> pa.ChunkedArray:
        """The held images of ``shas``, in that order, ``TAKE_ROWS`` at a time."""
        rows = np.fromiter((self._row[s] for s in shas), dtype=np.int64, count=len(shas))
        return pa.chunked_array([self._gather(rows[i:i + TAKE_ROWS]) for i in range(0, len(rows), TAKE_ROWS)],
                                type=pa.binary())

    def _gather(self, rows: np.ndarray) -> pa.Array:
        """The held images at ``rows``, taken from each held chunk on its own, then put in the order asked.

        Not ``ChunkedArray.take``: Arrow (25.0) joins every chunk into one array before taking (measured: +1 GB
        for 65,536 rows of a 1 GB held column, on each call), which set the full run's peak at a million images.
        """
        starts = np.cumsum([0] + [len(c) for c in self._chunks])
        chunk = np.searchsorted(starts, rows, side="right") - 1
        order = np.argsort(chunk, kind="stable")
        bounds = np.searchsorted(chunk[order], np.arange(len(self._chunks) + 1))
        parts = [self._chunks[c].take(pa.array(rows[order[lo:hi]] - starts[c]))
                 for c, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])) if hi > lo]
        gathered = pa.concat_arrays(parts) if parts else pa.array([], pa.binary())
        back = np.empty(len(order), dtype=np.int64)
        back[order] = np.arange(len(order))
        return gathered.take(pa.array(back)).cast(pa.binary())
