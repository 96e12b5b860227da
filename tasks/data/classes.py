"""The class set of a dataset whose settings say ``ingest.allowed_labels: discover``.

The first version that passes validation names the classes: its labels are written to the
``classes`` Delta table (label, first_raw_version, how it was added, run id). Later versions are
validated against that set, so a class that appears later is a validation finding with its
count, not a silent change of the model's head. A person accepts a new class on purpose with
``cd4ml classes --accept LABEL`` (appended with ``added_by: accepted`` and ``actor``: who, as an
authenticated identity), or lists the classes in ``ingest.allowed_labels``.

An accepted label is typed by a person or handed in as a DAG Param: hostile input, checked by
``tasks/data/labels.py`` before anything is written.
"""

from __future__ import annotations

import pyarrow as pa

from tasks.data import lake
from tasks.data.labels import check_labels
from tasks.errors import DataError
from tasks.settings import Settings

CLASSES_TABLE = "classes"
SCHEMA = pa.schema([
    pa.field("label", pa.string(), nullable=False),
    pa.field("first_raw_version", pa.int64(), nullable=True),
    pa.field("added_by", pa.string(), nullable=False),  # discovered | accepted
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("actor", pa.string(), nullable=True),  # accepted: who (cli:<account>, or the signed-in Airflow user)
])
class NotDiscoveringError(DataError, ValueError):
    """The settings list the classes (``ingest.allowed_labels``): a new class is added there, not accepted."""


def discovering(settings: Settings) -> bool:
    return settings.ingest.allowed_labels == "discover"


def known(settings: Settings) -> list[str] | None:
    """The recorded class names (sorted), or None before the first validated version."""
    uri = settings.table_uri(CLASSES_TABLE)
    version = lake.current_version(uri)
    if version is None:
        return None
    return sorted({str(v) for v in lake.read(uri, version, columns=["label"])["label"].to_pylist()})


def allowed(settings: Settings, present: list[str]) -> tuple[list[str], str]:
    """The labels a version may hold and where that list comes from (for reports and messages)."""
    if not discovering(settings):
        return list(settings.ingest.allowed_labels), "ingest.allowed_labels"
    recorded = known(settings)
    if recorded is None:
        return sorted(set(present)), "discovered in this version (the first validated one)"
    return recorded, f"the classes table {settings.table_uri(CLASSES_TABLE)}"


def accept(settings: Settings, labels: object, run_id: str, actor: str) -> int:
    """A person accepts new classes: checked (module doc), then recorded with who accepted them; returns how many were new."""
    if not discovering(settings):
        raise NotDiscoveringError("ingest.allowed_labels is a list in this environment's settings: add the class there")
    return record(settings, check_labels(labels), None, run_id, "accepted", actor=actor)


def record(settings: Settings, labels: list[str], raw_version: int | None, run_id: str, added_by: str,
           actor: str | None = None) -> int:
    """Add labels not recorded yet; returns how many were new (a re-run adds nothing)."""
    rows = pa.Table.from_pylist(
        [{"label": str(label), "first_raw_version": raw_version, "added_by": added_by, "run_id": run_id, "actor": actor}
         for label in sorted(set(labels))],
        schema=SCHEMA,
    )
    # merge_schema: a classes table written before the actor column gains it (older rows: null)
    _, inserted = lake.merge_new_rows(settings.table_uri(CLASSES_TABLE), rows, "label",
                                      {"step": "classes", "added_by": added_by, "run_id": run_id}, merge_schema=True)
    return inserted
