"""Validate one raw table version with Great Expectations before anything downstream uses it.

The check reads exactly ``raw_version`` of ``raw_images`` (metadata columns only, never the
image bytes) and runs three GE suites in one ephemeral data context:

* ``raw_rows``: one row per image: keys and facts not null, sha256 unique, label in
  ``ingest.allowed_labels``, width/height within ``ingest.min_side..max_side``, mode in
  ``ingest.stored_modes`` (kept or converted: ``ingest.keep_modes`` and the L/RGB of
  ``ingest.convert_modes``), and at least one row.
* ``raw_class_counts``: a derived frame, one row per allowed label present, whose ``count``
  must be at least ``validation.min_images_per_class``. Unknown labels are reported once, by
  the label-in-set expectation, not again as a tiny class.
* ``raw_batch_summary``: a derived one-row frame: class imbalance (largest class / smallest
  class) at most ``validation.max_class_imbalance``; rejected share (rejected / files seen)
  at most ``validation.max_rejected_share``.

Every check is a GE expectation result. The combined results go to
``<reports>/validation/raw_v<version>.json`` (and GE Data Docs to ``<reports>/validation/docs``)
before a failure is raised, so a failed run always leaves its evidence behind. The report
holds nothing that changes between runs (no run id, no wall-clock time): validating the same
version with the same settings twice writes the same bytes.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from tasks.data import classes, lake
from tasks.data.ingest import META_COLUMNS
from tasks.errors import DataError
from tasks.files import write_json
from tasks.settings import Settings

if TYPE_CHECKING:
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResult,
        ExpectationValidationResult,
    )
    from great_expectations.data_context import EphemeralDataContext

log = logging.getLogger(__name__)

REPORT_FORMAT = 1
ROWS_SUITE = "raw_rows"
COUNTS_SUITE = "raw_class_counts"
SUMMARY_SUITE = "raw_batch_summary"
_REQUIRED_COLUMNS = ("sha256", "label", "width", "height", "mode")
_MAX_LISTED = 10  # values quoted per failure line; the report keeps GE's partial lists


class ValidationFailedError(DataError, RuntimeError):
    """At least one expectation failed. ``str()`` is a summary line, then one line per failure."""

    def __init__(self, message: str, failures: list[str], report_path: str, result: "ValidationResult") -> None:
        super().__init__(message)
        self.failures = failures
        self.report_path = report_path
        self.result = result


@dataclass(frozen=True)
class ValidationResult:
    success: bool
    raw_table: str
    raw_version: int
    rows: int
    rejected_share: float
    expectations: int
    failed: int
    report_path: str
    docs_path: str | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Check:
    """One expectation as the report and the failure message describe it."""

    suite: str
    check: str  # stable short name, e.g. "label_in_set", "min_images_per_class"
    expectation: Any  # a great_expectations.expectations.Expectation


# --------------------------------------------------------------------------- derived frames


def _class_counts(rows: pd.DataFrame, allowed_labels: list[str]) -> pd.DataFrame:
    """One row per allowed label present in the batch, sorted by label: label, count."""
    labels = rows["label"].dropna()
    labels = labels[labels.isin(set(allowed_labels))]
    counts = labels.value_counts()
    frame = pd.DataFrame({"label": [str(k) for k in counts.index], "count": [int(v) for v in counts.values]})
    return frame.sort_values("label", kind="stable").reset_index(drop=True)


def _summary(rows: int, counts: pd.DataFrame, files_seen: int, rejected: int) -> dict[str, Any]:
    """The batch-level facts the dataset checks look at (one row of the summary frame)."""
    if len(counts):
        big = counts.sort_values(["count", "label"], ascending=[False, True], kind="stable").iloc[0]
        small = counts.sort_values(["count", "label"], ascending=[True, True], kind="stable").iloc[0]
        largest, smallest = int(big["count"]), int(small["count"])
        largest_label, smallest_label = str(big["label"]), str(small["label"])
        imbalance = largest / smallest
    else:  # no usable class at all: the row-count expectation already fails the batch
        largest = smallest = 0
        largest_label = smallest_label = ""
        imbalance = 1.0
    return {
        "rows": int(rows),
        "classes": int(len(counts)),
        "largest_class": largest_label,
        "largest_class_count": largest,
        "smallest_class": smallest_label,
        "smallest_class_count": smallest,
        "class_imbalance": float(imbalance),
        "files_seen": int(files_seen),
        "rejected": int(rejected),
        "rejected_share": float(rejected / files_seen) if files_seen > 0 else 0.0,
    }


# --------------------------------------------------------------------------- GE plumbing


def _quiet_ge() -> None:
    for name in ("great_expectations", "great_expectations.core", "great_expectations.data_context"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _context(docs_dir: Path | None) -> "EphemeralDataContext":
    """An in-memory GX context, progress bars and analytics off, one local Data Docs site."""
    _quiet_ge()
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    sites: dict[str, Any] = {}
    if docs_dir is not None:
        sites["cd4ml_validation"] = {
            "class_name": "SiteBuilder",
            "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        }
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites=sites,
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(project_config=config, mode="ephemeral")


def _checks(settings: Settings, labels: list[str]) -> list[_Check]:
    import great_expectations.expectations as gxe

    ing, val = settings.ingest, settings.validation
    checks: list[_Check] = [
        _Check(ROWS_SUITE, "row_count", gxe.ExpectTableRowCountToBeBetween(min_value=1, max_value=None)),
    ]
    for col in _REQUIRED_COLUMNS:
        checks.append(_Check(ROWS_SUITE, f"{col}_not_null", gxe.ExpectColumnValuesToNotBeNull(column=col)))
    checks += [
        _Check(ROWS_SUITE, "sha256_unique", gxe.ExpectColumnValuesToBeUnique(column="sha256")),
        _Check(ROWS_SUITE, "label_in_set", gxe.ExpectColumnValuesToBeInSet(column="label", value_set=list(labels))),
        _Check(ROWS_SUITE, "width_between", gxe.ExpectColumnValuesToBeBetween(column="width", min_value=ing.min_side, max_value=ing.max_side)),
        _Check(ROWS_SUITE, "height_between", gxe.ExpectColumnValuesToBeBetween(column="height", min_value=ing.min_side, max_value=ing.max_side)),
        _Check(ROWS_SUITE, "mode_in_set", gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=list(ing.stored_modes))),
        _Check(COUNTS_SUITE, "min_images_per_class",
               gxe.ExpectColumnValuesToBeBetween(column="count", min_value=val.min_images_per_class, max_value=None)),
        # One-row frame: the column max is the value itself, and GE reports it pass or fail.
        _Check(SUMMARY_SUITE, "max_class_imbalance",
               gxe.ExpectColumnMaxToBeBetween(column="class_imbalance", min_value=None, max_value=val.max_class_imbalance)),
        _Check(SUMMARY_SUITE, "max_rejected_share",
               gxe.ExpectColumnMaxToBeBetween(column="rejected_share", min_value=None, max_value=val.max_rejected_share)),
    ]
    for c in checks:
        c.expectation.meta = {"cd4ml_check": c.check}
        c.expectation.catch_exceptions = True  # an expectation that errors is a failed check, with its reason
    return checks


def _run_suites(
    context: "EphemeralDataContext",
    checks: list[_Check],
    frames: dict[str, pd.DataFrame],
    index_columns: dict[str, list[str]],
    run_name: str,
    run_time: datetime,
) -> tuple[dict[str, "ExpectationSuiteValidationResult"], list[tuple[_Check, "ExpectationValidationResult"]]]:
    """Validate each frame against its suite; results come back in the order of ``checks``."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    source = context.data_sources.add_pandas("cd4ml_raw")
    run_id = RunIdentifier(run_name=run_name, run_time=run_time)
    suite_results: dict[str, ExpectationSuiteValidationResult] = {}
    by_id: dict[str, ExpectationValidationResult] = {}
    ids: dict[int, str] = {}
    for suite_name, frame in frames.items():
        asset = source.add_dataframe_asset(suite_name)
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
        suite = context.suites.add(gx.ExpectationSuite(name=suite_name))
        for i, c in enumerate(checks):
            if c.suite == suite_name:
                added = suite.add_expectation(c.expectation)
                ids[i] = str(added.id)
        vd = context.validation_definitions.add(gx.ValidationDefinition(name=suite_name, data=batch_def, suite=suite))
        result_format: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 20}
        if index_columns.get(suite_name):
            result_format["unexpected_index_column_names"] = index_columns[suite_name]
        res = vd.run(batch_parameters={"dataframe": frame}, result_format=result_format, run_id=run_id)
        suite_results[suite_name] = res
        for r in res.results:
            by_id[str(r.expectation_config.id)] = r
    ordered = [(c, by_id[ids[i]]) for i, c in enumerate(checks)]
    return suite_results, ordered


# --------------------------------------------------------------------------- report


def _plain(value: Any) -> Any:
    """JSON-safe, stable form of a GE result value (numpy scalars, NaN, nested containers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None if math.isnan(value) else str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _observed(check: _Check, result: dict[str, Any]) -> Any:
    """The value a reader wants first for this expectation, pass or fail."""
    if "observed_value" in result:  # table and column-aggregate expectations
        return result["observed_value"]
    if check.check == "min_images_per_class":  # the classes below the bound, as {label, count}
        return result.get("partial_unexpected_index_list") or []
    return result.get("unexpected_count")  # row-level expectations: how many rows broke it


def _entry(check: _Check, res: "ExpectationValidationResult") -> dict[str, Any]:
    cfg = res.expectation_config
    kwargs = {k: v for k, v in dict(cfg.kwargs).items() if k not in ("batch_id", "result_format", "catch_exceptions")}
    result = _plain(dict(res.result or {}))
    entry: dict[str, Any] = {
        "suite": check.suite,
        "check": check.check,
        "expectation_type": cfg.type,
        "kwargs": _plain(kwargs),
        "success": bool(res.success),
        "observed_value": _plain(_observed(check, result)),
        "result": result,
    }
    errors = _exception_messages(res.exception_info)
    if errors:
        entry["exception"] = "; ".join(errors)
    return entry


def _exception_messages(info: Any) -> list[str]:
    """Messages of the errors GE caught: flat ({raised_exception, ...}) or keyed by metric id."""
    if not isinstance(info, dict):
        return []
    if "raised_exception" in info:
        return [str(info.get("exception_message"))] if info.get("raised_exception") else []
    found: list[str] = []
    for key in sorted(info, key=str):
        value = info[key]
        if isinstance(value, dict) and value.get("exception_message"):
            found.append(str(value["exception_message"]))
    return sorted(set(found))


def _num(value: Any) -> str:
    """A bound or observation as a person writes it: 50 not 50.0, 0.111111 not 0.1111111111111111."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


def _bounds(kwargs: dict[str, Any]) -> str:
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    if lo is not None and hi is not None:
        return f"allowed: {_num(lo)}..{_num(hi)}"
    if lo is not None:
        return f"allowed: >= {_num(lo)}"
    return f"allowed: <= {_num(hi)}"


def _short(values: list[Any]) -> str:
    shown = values[:_MAX_LISTED]
    return repr(shown)[:-1] + (", ...]" if len(values) > _MAX_LISTED else "]")


def _failure_lines(entry: dict[str, Any], batch: dict[str, Any]) -> list[str]:
    """Human lines for one failed expectation: name, column, observed value, bound."""
    etype, kw, res, check = entry["expectation_type"], entry["kwargs"], entry["result"], entry["check"]
    column = kw.get("column")
    where = f"{etype}({column or 'table'})"
    if "exception" in entry:
        return [f"{where} [{check}]: raised {entry['exception']}"]
    count = res.get("unexpected_count")
    if check == "min_images_per_class":
        bound = _num(kw.get("min_value"))
        lines = [
            f"min_images_per_class(label={row.get('label')}): observed {row.get('count')} < {bound}"
            for row in entry["observed_value"]
            if isinstance(row, dict)
        ]
        return lines or [f"{where} [{check}]: {count} classes below {bound}"]
    if check == "max_class_imbalance":
        return [
            f"{where} [{check}]: observed {_num(entry['observed_value'])} > {_num(kw.get('max_value'))} "
            f"(largest class {batch['largest_class']!r}: {batch['largest_class_count']}, "
            f"smallest class {batch['smallest_class']!r}: {batch['smallest_class_count']})"
        ]
    if check == "max_rejected_share":
        return [
            f"{where} [{check}]: observed {_num(entry['observed_value'])} > {_num(kw.get('max_value'))} "
            f"({batch['rejected']} of {batch['files_seen']} files rejected)"
        ]
    if etype == "expect_table_row_count_to_be_between":
        return [f"{where}: observed {entry['observed_value']} rows ({_bounds(kw)})"]
    if etype == "expect_column_values_to_not_be_null":
        return [f"{where}: {count} null values"]
    if etype == "expect_column_values_to_be_unique":
        dupes = sorted({str(v) for v in res.get("partial_unexpected_list") or []})
        return [f"{where}: {count} duplicated values {_short(dupes)}"]
    if etype == "expect_column_values_to_be_in_set":
        found = sorted(set(res.get("partial_unexpected_list") or []), key=str)
        return [f"{where}: {count} unexpected values {_short(found)} (allowed: {kw.get('value_set')})"]
    if etype == "expect_column_values_to_be_between":
        found = sorted(set(res.get("partial_unexpected_list") or []), key=str)
        return [f"{where}: {count} values out of range {_short(found)} ({_bounds(kw)})"]
    return [f"{where} [{check}]: observed {entry['observed_value']}"]


def _commit_time(uri: str, version: int) -> datetime:
    """When ``version`` was committed: a run time for GE that does not move between re-runs."""
    for commit in lake.history(uri):
        if commit.version == version and commit.timestamp_ms:
            return datetime.fromtimestamp(commit.timestamp_ms / 1000, tz=UTC)
    return datetime(1970, 1, 1, tzinfo=UTC)


# --------------------------------------------------------------------------- the step


def validate_batch(settings: Settings, raw_version: int, files_seen: int, rejected: int, run_id: str) -> ValidationResult:
    """Validate ``raw_version`` of the raw table; raise ValidationFailedError if any check fails.

    ``files_seen`` and ``rejected`` come from the ingest that produced the batch. The JSON
    report (and Data Docs) are written in both cases; ``run_id`` is only logged, so the report
    of a given version and settings is the same whichever run wrote it.
    Phases: read the batch, run the expectation suites, build the docs, write the report, decide.
    """
    if raw_version < 0:
        raise ValueError(f"raw_version must be >= 0, got {raw_version}")
    if files_seen < 0 or rejected < 0:
        raise ValueError(f"files_seen and rejected must be >= 0, got {files_seen} and {rejected}")
    started = time.perf_counter()
    uri = settings.raw_table
    batch = _read_batch(settings, raw_version, files_seen, rejected)
    read_s = time.perf_counter() - started

    out_dir = settings.reports_path / "validation"
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / f"raw_v{raw_version}.json"
    docs_dir = out_dir / "docs"
    context = _context(docs_dir)
    suite_results, ordered = _run_suites(
        context,
        _checks(settings, batch.labels),
        {ROWS_SUITE: batch.rows, COUNTS_SUITE: batch.counts, SUMMARY_SUITE: pd.DataFrame([batch.summary])},
        {ROWS_SUITE: ["sha256"], COUNTS_SUITE: ["label"]},
        run_name=f"raw_v{raw_version}",
        run_time=_commit_time(uri, raw_version),
    )
    validate_s = time.perf_counter() - started - read_s

    entries = [_entry(c, r) for c, r in ordered]
    failed = [e for e in entries if not e["success"]]
    share = float(batch.summary["rejected_share"])
    docs_path = _build_docs(context, docs_dir)
    result = ValidationResult(
        success=not failed,
        raw_table=uri,
        raw_version=raw_version,
        rows=len(batch.rows),
        rejected_share=share,
        expectations=len(entries),
        failed=len(failed),
        report_path=str(report_path),
        docs_path=docs_path,
    )
    write_json(report_path, _report(settings, result, batch, entries, suite_results))
    total_s = time.perf_counter() - started
    log.info(
        "validate: run %s, %s v%d: %d rows, %d/%d expectations passed, rejected share %.4f "
        "(read %.2fs, GE %.2fs, total %.2fs); report %s",
        run_id, uri, raw_version, len(batch.rows), len(entries) - len(failed), len(entries), share,
        read_s, validate_s, total_s, report_path,
    )
    if failed:
        _raise_failures(settings, result, batch, entries, failed)
    if classes.discovering(settings):
        classes.record(settings, batch.labels, raw_version, run_id, "discovered")  # no-op once recorded
    return result


@dataclass
class _Batch:
    """The raw version as validation sees it: its rows, the allowed classes and the batch's figures."""

    rows: pd.DataFrame  # META_COLUMNS, sorted by sha256
    labels: list[str]
    label_source: str  # where the allowed labels come from (settings, or the recorded classes)
    counts: pd.DataFrame  # label, count
    summary: dict


def _read_batch(settings: Settings, raw_version: int, files_seen: int, rejected: int) -> _Batch:
    rows = lake.read(settings.raw_table, raw_version, columns=META_COLUMNS).to_pandas()
    rows = rows.sort_values("sha256", kind="stable", na_position="last").reset_index(drop=True)
    labels, label_source = classes.allowed(settings, [str(v) for v in rows["label"].dropna().unique()])
    counts = _class_counts(rows, labels)
    return _Batch(rows, labels, label_source, counts, _summary(len(rows), counts, files_seen, rejected))


def _build_docs(context: EphemeralDataContext, docs_dir: Path) -> str | None:
    """Data Docs' index page, or None when they could not be built."""
    try:
        sites = context.build_data_docs()
        index = docs_dir / "index.html"
        log.debug("data docs sites: %s", sites)
        return str(index) if index.exists() else None
    except Exception as exc:  # docs are a convenience: the JSON report is the record
        log.warning("validate: building Data Docs failed (%s); the JSON report is complete", exc)
        return None


def _report(settings: Settings, result: ValidationResult, batch: _Batch, entries: list[dict],
            suite_results: dict) -> dict:
    """The JSON report: thresholds, the batch, class counts, every expectation's outcome."""
    failed = result.failed
    return {
        "report_format": REPORT_FORMAT,
        "success": result.success,
        "raw_table": result.raw_table,
        "raw_version": result.raw_version,
        "env": settings.env,
        "config_hash": settings.section_hash("ingest", "validation"),
        "thresholds": {
            "allowed_labels": batch.labels,
            "allowed_labels_from": batch.label_source,
            "min_side": settings.ingest.min_side,
            "max_side": settings.ingest.max_side,
            "allowed_modes": list(settings.ingest.stored_modes),  # the report keeps its old key
            **_plain(settings.validation.model_dump(mode="json")),
        },
        "batch": batch.summary,
        "class_counts": {str(r.label): int(r.count) for r in batch.counts.itertuples(index=False)},
        "statistics": {
            "evaluated_expectations": len(entries),
            "successful_expectations": len(entries) - failed,
            "unsuccessful_expectations": failed,
            "suites": {name: bool(res.success) for name, res in suite_results.items()},
        },
        "expectations": entries,
        "docs_path": result.docs_path,
    }


def _raise_failures(settings: Settings, result: ValidationResult, batch: _Batch, entries: list[dict],
                    failed: list[dict]) -> None:
    lines = [line for e in failed for line in _failure_lines(e, batch.summary)]
    lines += _new_class_lines(batch.rows, batch.labels, batch.label_source) if classes.discovering(settings) else []
    message = (
        f"validation of {result.raw_table} v{result.raw_version} failed: {len(failed)} of {len(entries)} expectations "
        f"failed (report {result.report_path})\n" + "\n".join(lines)
    )
    raise ValidationFailedError(message, failures=lines, report_path=result.report_path, result=result)


def _new_class_lines(rows: pd.DataFrame, labels: list[str], source: str) -> list[str]:
    """One line per class outside the recorded set, with its count and how to accept it."""
    new = rows["label"].dropna()
    counts = new[~new.isin(set(labels))].value_counts()
    return [
        f"new class {str(label)!r}: {int(n)} images; the classes are {labels} (from {source}); "
        f"accept it with `cd4ml classes --accept {label}` or list it in ingest.allowed_labels"
        for label, n in sorted(counts.items(), key=lambda kv: str(kv[0]))
    ]
