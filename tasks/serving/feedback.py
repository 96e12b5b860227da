"""True labels that arrive after scoring: CSV or JSONL files joined to the ``predictions`` table.

A feedback file names an image and its label, one row each:

* CSV with a header, or JSONL with one object per line; columns ``label`` and one of
  ``image_key`` (the sha256 the scorer recorded), ``source_uri`` (as recorded), ``path`` (a
  local path, absolute or relative to the feedback file's folder) or ``image`` (any of those);
* files are read in name order from ``storage.feedback_uri`` (or given explicitly: then each must
  lie under ``storage.feedback_uri``, links and ``..`` resolved, and use a scheme
  ``serving.allowed_schemes`` allows, else ``InputRefusedError`` before it is opened).

A file is read a line at a time (``tasks.data.inputs``): a line longer than
``serving.max_feedback_row_bytes`` (skipped unread), not UTF-8, JSON nested too deep, or holding a
NUL or lone surrogate is a ``bad_row`` of its own; the other rows go on.

Every row ends in exactly one place:

* ``feedback`` (keyed by image key; a later file's label for the same image replaces the
  earlier one, an unchanged row writes nothing, so a re-run adds no rows and no versions);
* ``feedback_rejects`` with its reason (merged by file digest and line: a re-run adds nothing):
  ``unknown_image`` (no prediction names it), ``unknown_class`` (not a class of the model that
  predicted it), ``bad_row`` (no label, no image reference, a JSONL line that is not an object,
  a line refused above), ``bad_file`` (line 0: a file found in the folder that cannot be used at
  all, e.g. no ``label`` column, or a link out of the folder).

A file given explicitly that cannot be used at all (missing, no ``label`` column) is a
``FeedbackError``. One found in the folder is a ``bad_file`` reject instead: the scheduled monitor
reads the whole folder every run, and one bad file must not stop every later run. No error or
reject repeats a file's content.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import fsspec
import pyarrow as pa
from fsspec.core import url_to_fs

from tasks.data import inputs, lake
from tasks.errors import DataError
from tasks.settings import Settings

log = logging.getLogger(__name__)

FEEDBACK_TABLE = "feedback"
FEEDBACK_REJECTS_TABLE = "feedback_rejects"
REFERENCE_COLUMNS = ("image_key", "source_uri", "path", "image")
FEEDBACK_SCHEMA = pa.schema([
    pa.field("image_key", pa.string(), nullable=False),
    pa.field("label", pa.string(), nullable=False),
    pa.field("reference", pa.string(), nullable=False),  # what the row said (key, URI or path)
    pa.field("feedback_file", pa.string(), nullable=False),
    pa.field("line", pa.int64(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("logical_date", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("loaded_at", pa.timestamp("us", tz="UTC"), nullable=False),
])
FEEDBACK_REJECTS_SCHEMA = pa.schema([
    pa.field("reject_id", pa.string(), nullable=False),
    pa.field("feedback_file", pa.string(), nullable=False),
    pa.field("line", pa.int64(), nullable=False),
    pa.field("reference", pa.string(), nullable=True),
    pa.field("label", pa.string(), nullable=True),
    pa.field("reason_code", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("logical_date", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("rejected_at", pa.timestamp("us", tz="UTC"), nullable=False),
])


class FeedbackError(DataError, ValueError):
    """A feedback file that cannot be used at all (missing, unreadable format, no label column)."""


@dataclass(frozen=True)
class FeedbackResult:
    files: list[str]
    rows: int
    accepted: int  # rows now in ``feedback`` (new or changed)
    unchanged: int  # rows already there with the same label
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    feedback_table: str = ""
    rejects_table: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FeedbackRow:
    file: str
    line: int
    reference: str | None
    label: str | None
    problem: str | None = None  # bad_row / bad_file detail
    code: str = "bad_row"


FEEDBACK_SUFFIXES = (".csv", ".jsonl")


def check_feedback_file(settings: Settings, path: str) -> None:
    """A named feedback file: a scheme ``serving.allowed_schemes`` allows, under ``storage.feedback_uri``
    (links and ``..`` resolved); else ``InputRefusedError``, before anything is opened."""
    inputs.check_scheme(str(path), settings.serving.allowed_schemes, "serving.allowed_schemes", "a feedback file")
    inputs.confined(str(path), settings.storage.feedback_uri, "the feedback file")


def feedback_files(settings: Settings, files: Sequence[str] | None = None) -> list[str]:
    """The feedback files to load: the ones given, else every *.csv / *.jsonl under ``storage.feedback_uri``.

    Given files are checked first (module doc): a scheme settings do not allow, or a file
    outside the feedback folder, is ``InputRefusedError``.
    """
    allowed, root_uri = settings.serving.allowed_schemes, settings.storage.feedback_uri
    inputs.check_scheme(root_uri, allowed, "serving.allowed_schemes", "storage.feedback_uri")
    if files:
        for f in files:
            check_feedback_file(settings, str(f))
        return [str(f) for f in files]
    fs, root = url_to_fs(root_uri)
    if not fs.exists(root):
        return []
    found = [p for p in fs.find(root) if p.lower().endswith(FEEDBACK_SUFFIXES)]
    return sorted(fs.unstrip_protocol(p) if "://" in settings.storage.feedback_uri else p for p in found)


def _reference(record: dict[str, Any]) -> str | None:
    for name in REFERENCE_COLUMNS:
        value = record.get(name)
        if value not in (None, ""):
            return str(value).strip()
    return None


def _row(path: str, number: int, record: dict[str, Any] | inputs.BadRowError) -> FeedbackRow:
    """One parsed record as a row; what is wrong with it stays in the row (never its content)."""
    if isinstance(record, inputs.BadRowError):
        return FeedbackRow(path, number, None, None, str(record))
    label = record.get("label")
    label = None if label in (None, "") else str(label).strip() or None
    reference = _reference(record)
    text = (reference or "") + (label or "")
    try:
        text.encode("utf-8")  # JSON escapes can spell a lone surrogate, which no table column can hold
    except UnicodeEncodeError:
        return FeedbackRow(path, number, None, None, f"line {number}: image or label is not valid text")
    if "\x00" in text:
        return FeedbackRow(path, number, None, None, f"line {number}: image or label holds a NUL")
    return FeedbackRow(path, number, reference, label)


def feedback_rows(path: str, max_row_bytes: int) -> Iterator[FeedbackRow]:
    """The file's rows, a bounded line at a time (module doc); ``FeedbackError``: the file cannot be used."""
    try:
        handle = fsspec.open(path, "rb").open()
    except FileNotFoundError as exc:
        raise FeedbackError(f"feedback file {path} does not exist") from exc
    except OSError as exc:
        raise FeedbackError(f"feedback file {path} cannot be opened: {exc.strerror or type(exc).__name__}") from exc
    with handle:
        lines = inputs.bounded_lines(handle, max_row_bytes)
        if path.lower().endswith(".jsonl"):
            records = inputs.jsonl_records(lines)
        else:
            header, records = inputs.csv_records(lines)
            if "label" not in header or not set(header) & set(REFERENCE_COLUMNS):
                # the header's own words are not repeated: the "feedback file" may be any file
                raise FeedbackError(f"feedback file {path} needs a header with 'label' and one of "
                                    f"{', '.join(REFERENCE_COLUMNS)}")
        for number, record in records:
            yield _row(path, number, record)


def _file_rows(path: str, settings: Settings, given: bool) -> list[FeedbackRow]:
    """A file's rows; a file found in the folder that cannot be used is one ``bad_file`` row (module doc)."""
    try:
        if not given:  # given files were confined before; a found one may be a link out of the folder
            inputs.confined(path, settings.storage.feedback_uri, "the feedback file")
        return list(feedback_rows(path, settings.serving.max_feedback_row_bytes))
    except (FeedbackError, inputs.InputRefusedError) as exc:
        if given:
            raise
        log.warning("feedback file %s skipped: %s", path, exc)
        return [FeedbackRow(path, 0, None, None, str(exc), code="bad_file")]


def _prediction_index(settings: Settings) -> tuple[dict[str, list[str]], dict[str, str]]:
    """image key -> the classes of the model versions that predicted it; source URI -> image key."""
    uri = settings.predictions_table
    if not lake.exists(uri):
        return {}, {}
    rows = lake.scan(lake.open_table(uri), columns=["image_key", "source_uri", "classes"])
    classes: dict[str, set[str]] = {}
    by_uri: dict[str, str] = {}
    for key, source, names in zip(*(rows.column(c).to_pylist() for c in ("image_key", "source_uri", "classes"))):
        classes.setdefault(key, set()).update(names)
        by_uri[source] = key
    return {k: sorted(v) for k, v in classes.items()}, by_uri


def _image_key(reference: str, file: str, keys: dict[str, list[str]], by_uri: dict[str, str]) -> str | None:
    """The image a reference names: a recorded key, a recorded URI, or a path (relative to the file's folder)."""
    if reference in keys:
        return reference
    if reference in by_uri:
        return by_uri[reference]
    if "://" in reference:
        return None
    folder = posixpath.dirname(file[len("file://"):] if file.startswith("file://") else file)
    path = reference if os.path.isabs(reference) else os.path.join(folder, reference)
    return by_uri.get("file://" + os.path.realpath(path))


def _decide(rows: list[FeedbackRow], keys: dict[str, list[str]], by_uri: dict[str, str]
            ) -> tuple[dict[str, tuple[FeedbackRow, str]], list[tuple[FeedbackRow, str, str]]]:
    """Accepted rows by image key (the last one wins) and rejected rows with (code, reason)."""
    accepted: dict[str, tuple[FeedbackRow, str]] = {}
    rejected: list[tuple[FeedbackRow, str, str]] = []
    for row in rows:
        if row.problem or row.reference is None or row.label is None:
            what = row.problem or ("no image reference (image_key, source_uri, path or image)"
                                   if row.reference is None else "no label")
            rejected.append((row, row.code, what))
            continue
        key = _image_key(row.reference, row.file, keys, by_uri)
        if key is None:
            rejected.append((row, "unknown_image", f"no prediction names {row.reference!r}: score the image first"))
        elif row.label not in keys[key]:
            rejected.append((row, "unknown_class", f"label {row.label!r} is not a class of the model that "
                                                   f"predicted it ({', '.join(keys[key])})"))
        else:
            accepted[key] = (row, row.label)
    return accepted, rejected


def load_feedback(settings: Settings, files: Sequence[str] | None = None, *, run_id: str,
                  logical_date: str | datetime) -> FeedbackResult:
    """Read feedback files, join them to the predictions, store accepted and rejected rows (module doc)."""
    paths = feedback_files(settings, files)
    rows = [row for path in paths for row in _file_rows(path, settings, given=bool(files))]
    keys, by_uri = _prediction_index(settings)
    accepted, rejected = _decide(rows, keys, by_uri)
    when = datetime.fromisoformat(lake.normalise_logical_date(logical_date))
    now = datetime.now(UTC)
    uri, rejects_uri = settings.table_uri(FEEDBACK_TABLE), settings.table_uri(FEEDBACK_REJECTS_TABLE)
    current = {}
    if lake.exists(uri):
        stored = lake.scan(lake.open_table(uri), columns=["image_key", "label"])
        current = dict(zip(stored.column("image_key").to_pylist(), stored.column("label").to_pylist()))
    changed = [{"image_key": key, "label": label, "reference": row.reference, "feedback_file": row.file,
                "line": row.line, "run_id": run_id, "logical_date": when, "loaded_at": now}
               for key, (row, label) in sorted(accepted.items()) if current.get(key) != label]
    metadata = {"run_id": run_id, "step": "feedback", "logical_date": when.isoformat()}
    if changed:
        table = pa.Table.from_pylist(changed, schema=FEEDBACK_SCHEMA)
        lake.upsert_batches(uri, lambda: table.to_batches(), FEEDBACK_SCHEMA, "image_key", metadata)
    if rejected:
        digests = {p: hashlib.sha256(p.encode()).hexdigest()[:16] for p in paths}
        reject_rows = [{"reject_id": f"{digests[row.file]}:{row.line}:{code}", "feedback_file": row.file,
                        "line": row.line, "reference": row.reference, "label": row.label, "reason_code": code,
                        "reason": reason, "run_id": run_id, "logical_date": when, "rejected_at": now}
                       for row, code, reason in rejected]
        lake.merge_new_rows(rejects_uri, pa.Table.from_pylist(reject_rows, schema=FEEDBACK_REJECTS_SCHEMA),
                            "reject_id", metadata)
        for row, code, reason in rejected:
            log.warning("feedback %s line %d rejected: %s (%s)", row.file, row.line, code, reason)
    by_reason: dict[str, int] = {}
    for _, code, _ in rejected:
        by_reason[code] = by_reason.get(code, 0) + 1
    return FeedbackResult(files=paths, rows=len(rows), accepted=len(changed),
                          unchanged=len(accepted) - len(changed), rejected_by_reason=dict(sorted(by_reason.items())),
                          feedback_table=uri, rejects_table=rejects_uri)


def labelled(settings: Settings) -> dict[str, str]:
    """image key -> its true label, from every feedback accepted so far."""
    uri = settings.table_uri(FEEDBACK_TABLE)
    if not lake.exists(uri):
        return {}
    rows = lake.scan(lake.open_table(uri), columns=["image_key", "label"])
    return dict(zip(rows.column("image_key").to_pylist(), rows.column("label").to_pylist()))
