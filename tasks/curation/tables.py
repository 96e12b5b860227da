"""The curation's Delta tables (names and schemas), its error, and the one shape of a drop row."""

from __future__ import annotations

from typing import Any, NamedTuple

import pyarrow as pa

from tasks.data import lake
from tasks.errors import DataError
from tasks.settings import Settings

SPLITS: tuple[str, ...] = ("train", "val", "test")
EMBEDDINGS_TABLE = "curation_embeddings"
COMPONENTS_TABLE = "curation_components"
REPORT_TABLE = "curation_report"

# The curated snapshot holds only what never changes once an image is kept, so a batch appends to it. An image's
# component (whose key a later merge renames) is in the assignment record, at the version the snapshot's commit
# names (``components_version``): joined on sha256 it gives each kept row's component.
CURATED_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("image", pa.binary(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
    ]
)

COMPONENTS_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("component", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("first_raw_version", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),  # the curation that first assigned it
    ]
)

REPORT_SCHEMA = pa.schema(
    [
        pa.field("raw_version", pa.int64(), nullable=False),
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=True),
        pa.field("component", pa.string(), nullable=False),
        pa.field("kept_sha256", pa.string(), nullable=True),
        pa.field("label", pa.string(), nullable=False),
        pa.field("curated_version", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("logical_date", pa.string(), nullable=False),
    ]
)


class CurationError(DataError, RuntimeError):
    """Curation cannot produce a snapshot; the message says which input and why."""


class RawFacts(NamedTuple):
    """One image of the raw version, without its bytes: what the rules read of it (``read_raw``'s columns).

    A named tuple, not a dict: one is held for every image of the raw version through the whole curation (72 bytes
    against 184 a dict: about 105 MiB less at a million images).
    """

    sha256: str
    label: str
    width: int
    height: int


def raw_facts(raw: pa.Table) -> dict[str, RawFacts]:
    """``read_raw``'s rows by sha256, in sha256 order; the sha256 and the label interned (``lake.interned``): the
    features and the record hold the same key objects, and a label is one object however many images carry it."""
    rows = [RawFacts(sha, label, int(w), int(h)) for sha, label, w, h in
            zip(lake.interned(raw.column("sha256")), lake.interned(raw.column("label")),
                raw.column("width").to_pylist(), raw.column("height").to_pylist())]
    return {r.sha256: r for r in sorted(rows)}


def drop_row(row: RawFacts, reason: str, component: str, kept: str | None, detail: str | None) -> dict[str, Any]:
    return {"sha256": row.sha256, "reason": reason, "component": component, "kept_sha256": kept,
            "label": row.label, "detail": detail}


def read_raw(settings: Settings, raw_version: int) -> pa.Table:
    """The raw version's facts (sha256, size, label): the image bytes stay in the table
    (``tasks.curation.raw_images`` reads those a step needs)."""
    raw = lake.read(settings.raw_table, raw_version, columns=["sha256", "width", "height", "label"])
    if raw.num_rows == 0:
        raise CurationError(f"{settings.raw_table} version {raw_version} has no rows: nothing to curate")
    return raw
