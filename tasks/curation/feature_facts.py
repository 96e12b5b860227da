"""The stored facts of a raw version's images, a column each (``curation_embeddings``' columns but the embedding).

Every batch reads the facts of every image of its raw version: the bad-image screen's relative rules compare an image
with its version's bulk, and the grouping reads every pixel key. Held as one named tuple an image with its numbers as
Python floats, they took 431 bytes an image in a batch of a 100,000-image table, and the screen that read them set
the Python high of a million-image batch (bench/README.md, runs 21 and 22). Here they are columns by position: the
statistics as float64 arrays (``NaN`` where the row has none), the pixel digests packed, 32 bytes an image
(``pixel_keys.Digests``; as interned strings they were most of the 296 bytes an image of run 22's columns), the mode
family a byte code an image and the errors a map of the few images that have one (lists of interned strings, nearly
all None and two values, were 16 bytes an image until run 33), and a map from sha256 to position: in a curation the
raw rows' own (``blank`` given their sha256s and map), not one of their own. ``FeatureFacts`` is still a read-only
mapping sha256 -> ``ImageFeatures``: a lookup builds that one image's tuple (the tests, the few bad images listed),
while the screen reads the columns. Only what a curation reads is held: not the grey minimum and maximum (stored,
read by no step: 16 bytes an image).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from tasks.curation.by_position import ByPosition
from tasks.curation.name_codes import encode
from tasks.curation.pixel_keys import DIGEST_BYTES, Digests
from tasks.data.lake import interned


class ImageFeatures(NamedTuple):
    """One image's stored features (the embedding lives in ``Features.matrix``)."""

    pixel_digest: str | None
    blur: float | None
    mean: float | None
    min: float | None
    max: float | None
    error: str | None
    contrast: float | None = None  # grey standard deviation
    family: str | None = None  # "grey" | "colour" (tasks.curation.image_stats)


NUMBERS = ("blur", "mean", "contrast")  # the statistics a curation reads (the screen's); min and max are stored only
FACT_COLUMNS = ("pixel_digest", *NUMBERS, "error", "family")  # the stored columns a curation reads of every image


class FeatureFacts(ByPosition[ImageFeatures]):
    """sha256 -> its stored facts, kept as columns by position (see the module's docstring)."""

    def __init__(self, shas: list[str], digests: Digests, errors: dict[int, str], family: np.ndarray,
                 families: list[str], numbers: dict[str, np.ndarray], at: Mapping[str, int] | None = None) -> None:
        self.shas = shas  # each position's sha256
        # sha256 -> its position (a key twice: the later row); given: another map of the same positions, shared
        self.at = {sha: i for i, sha in enumerate(shas)} if at is None else at
        self.digests = digests  # the pixel digests, packed (``pixel_keys.Digests``)
        self.errors = errors  # position -> its error: nearly every image has none (a list of Nones was 8 bytes each)
        self.family = family  # int8: a code into ``families``, -1 where the row has none
        self.families = families
        self.numbers = numbers  # NUMBERS: float64, NaN where the row has none

    @classmethod
    def empty(cls) -> FeatureFacts:
        return cls.blank([])

    @classmethod
    def of_table(cls, table: pa.Table) -> FeatureFacts:
        """From ``curation_embeddings`` rows (``sha256`` and the fact columns it has: an older table lacks some), in
        their order, with a map of their own."""
        facts = cls.blank(interned(table.column("sha256")))
        facts.fill(np.arange(table.num_rows), table)
        return facts

    @classmethod
    def blank(cls, shas: list[str], at: Mapping[str, int] | None = None) -> FeatureFacts:
        """Every image of ``shas`` (``at``: their map, shared; None: one of their own) without facts yet: ``fill``
        sets them a block of rows at a time (no table of every image's facts held beside the columns they fill)."""
        n = len(shas)
        digests = Digests(np.zeros((n, DIGEST_BYTES), dtype=np.uint8), np.zeros(n, dtype=bool), {})
        return cls(shas, digests, {}, np.full(n, -1, dtype=np.int8), [], {c: np.full(n, np.nan) for c in NUMBERS}, at)

    def fill(self, positions: np.ndarray, table: pa.Table) -> None:
        """The facts of ``table``'s rows at ``positions``, each still blank (``blank``: a position is filled once, so
        only the values present are set; a fact column an older table lacks stays missing)."""
        have = table.column_names
        if "pixel_digest" in have:
            digests = Digests.of_column(table.column("pixel_digest"))
            self.digests.packed[positions], self.digests.present[positions] = digests.packed, digests.present
            self.digests.odd.update({int(positions[j]): key for j, key in digests.odd.items()})
        if "error" in have:  # nearly all None: only the values present are set
            valid = np.flatnonzero(table.column("error").is_valid().to_numpy(zero_copy_only=False))
            errors = interned(table.column("error").take(pa.array(valid, pa.int64())))
            self.errors.update(zip(positions[valid].tolist(), errors))
        if "family" in have:
            self.family[positions] = self._family_codes(table.column("family"))
        for c in (c for c in NUMBERS if c in have):
            self.numbers[c][positions] = np.asarray(table.column(c).to_numpy(), dtype=np.float64)

    @classmethod
    def of(cls, rows: Mapping[str, ImageFeatures]) -> FeatureFacts:
        """From tuples (tests, small sets)."""
        values = list(rows.values())
        digests = Digests.of_values([f.pixel_digest for f in values])
        numbers = {c: np.array([np.nan if getattr(f, c) is None else getattr(f, c) for f in values], dtype=np.float64)
                   for c in NUMBERS}
        facts = cls(list(rows), digests, {i: f.error for i, f in enumerate(values) if f.error is not None},
                    np.full(len(values), -1, dtype=np.int8), [], numbers)
        facts.family[:] = facts._family_codes(pa.array([f.family for f in values], pa.string()))
        return facts

    def _family_codes(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each value's code into ``families`` (added as first seen), -1 for a null (int8: a few mode families)."""
        try:
            return encode(column, self.families, np.int8, most=127)
        except ValueError as err:
            raise ValueError(f"FeatureFacts: {err} (mode families)") from err

    def failed(self) -> np.ndarray:
        """By position: True where the image has an error (it did not decode, or fastdup refused it)."""
        failed = np.zeros(len(self.shas), dtype=bool)
        failed[list(self.errors)] = True
        return failed

    def family_of(self, i: int) -> str | None:
        return None if self.family[i] < 0 else self.families[self.family[i]]

    def __getitem__(self, sha: str) -> ImageFeatures:
        i = self.at[sha]
        number = {c: None if np.isnan(self.numbers[c][i]) else float(self.numbers[c][i]) for c in NUMBERS}
        return ImageFeatures(pixel_digest=self.digests.value(i), error=self.errors.get(i), family=self.family_of(i),
                             min=None, max=None, **number)  # min and max: not held
