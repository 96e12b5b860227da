"""Great Expectations validation of a raw table version: real digits, real GE, real Delta."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.data import lake
from tasks.data.ingest import RAW_SCHEMA
from tasks.data.validate import ValidationFailedError, ValidationResult, validate_batch

EXPECTED_CHECKS = {
    "row_count",
    "sha256_not_null",
    "label_not_null",
    "width_not_null",
    "height_not_null",
    "mode_not_null",
    "sha256_unique",
    "label_in_set",
    "width_between",
    "height_between",
    "mode_in_set",
    "min_images_per_class",
    "max_class_imbalance",
    "max_rejected_share",
}


def _with_validation(settings, **update):
    return settings.model_copy(update={"validation": settings.validation.model_copy(update=update)})


def _plant(settings, rows: list[dict]) -> int:
    """Write rows straight into the raw table (bypassing ingest's checks); returns the new version."""
    now = datetime(2026, 11, 22, tzinfo=UTC)
    full = [
        {
            "image": b"not-an-image",
            "width": 8,
            "height": 8,
            "format": "PNG",
            "mode": "L",
            "source_uri": f"file:///planted/{row['sha256']}.png",
            "ingest_run_id": "planted",
            "logical_date": "2026-11-22T00:00:00+00:00",
            "ingested_at": now,
            **row,
        }
        for row in rows
    ]
    version, inserted = lake.merge_new_rows(
        settings.raw_table, pa.Table.from_pylist(full, schema=RAW_SCHEMA), "sha256", {"step": "test-plant"}
    )
    assert version is not None and inserted == len(rows)
    return version


def test_real_digits_pass_and_report_lists_every_expectation(settings, raw_digits):
    result = validate_batch(settings, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-1")

    assert isinstance(result, ValidationResult)
    assert result.success and result.failed == 0
    assert result.rows == 1797
    assert result.raw_version == raw_digits.raw_version and result.raw_table == settings.raw_table
    assert result.rejected_share == 0.0
    assert result.expectations == len(EXPECTED_CHECKS)
    assert result.to_dict()["report_path"] == result.report_path

    report_path = Path(result.report_path)
    assert report_path == settings.reports_path / "validation" / f"raw_v{raw_digits.raw_version}.json"
    report = json.loads(report_path.read_text())
    assert report["success"] is True and report["raw_version"] == raw_digits.raw_version
    assert {e["check"] for e in report["expectations"]} == EXPECTED_CHECKS
    assert len(report["expectations"]) == result.expectations
    for entry in report["expectations"]:
        assert entry["expectation_type"].startswith("expect_")
        assert entry["success"] is True
        assert "kwargs" in entry and "observed_value" in entry
    by_check = {e["check"]: e for e in report["expectations"]}
    # thresholds come from settings and land in the kwargs GE evaluated
    assert by_check["label_in_set"]["kwargs"]["value_set"] == list(settings.ingest.allowed_labels)
    assert by_check["width_between"]["kwargs"]["min_value"] == settings.ingest.min_side
    assert by_check["min_images_per_class"]["kwargs"]["min_value"] == settings.validation.min_images_per_class
    assert by_check["max_rejected_share"]["kwargs"]["max_value"] == settings.validation.max_rejected_share
    assert by_check["row_count"]["observed_value"] == 1797
    assert by_check["max_rejected_share"]["observed_value"] == 0.0
    assert 1.0 <= by_check["max_class_imbalance"]["observed_value"] < 1.1
    assert sum(report["class_counts"].values()) == 1797 and len(report["class_counts"]) == 10
    assert result.docs_path is not None and Path(result.docs_path).is_file()


def test_same_version_twice_gives_the_same_report(settings, raw_digits):
    first = validate_batch(settings, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-a")
    before = Path(first.report_path).read_bytes()
    second = validate_batch(settings, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-b")
    assert second == first
    assert Path(second.report_path).read_bytes() == before


def test_rejected_share_over_threshold_fails(settings, raw_digits):
    files_seen, rejected = 2000, 300  # 15% rejected; sit allows 10%
    with pytest.raises(ValidationFailedError) as info:
        validate_batch(settings, raw_digits.raw_version, files_seen, rejected, "run-rej")

    err = info.value
    message = str(err)
    assert message.splitlines()[0].startswith(f"validation of {settings.raw_table} v{raw_digits.raw_version} failed: 1 of")
    assert err.failures == [
        "expect_column_max_to_be_between(rejected_share) [max_rejected_share]: "
        "observed 0.15 > 0.1 (300 of 2000 files rejected)"
    ]
    assert err.failures[0] in message
    report = json.loads(Path(err.report_path).read_text())
    assert report["success"] is False
    failed = [e for e in report["expectations"] if not e["success"]]
    assert [e["check"] for e in failed] == ["max_rejected_share"]
    assert failed[0]["observed_value"] == pytest.approx(0.15)


def test_thresholds_differ_per_environment(settings, raw_digits):
    from tasks.settings import load_settings

    files_seen, rejected = 1797 + 54, 54  # ~2.9% rejected: fine in sit (10%), too many in prod (2%)
    assert validate_batch(settings, raw_digits.raw_version, files_seen, rejected, "run-sit").success
    prod_like = settings.model_copy(update={"validation": load_settings("prod").validation})
    with pytest.raises(ValidationFailedError, match=r"max_rejected_share\]: observed 0.0291734 > 0.02"):
        validate_batch(prod_like, raw_digits.raw_version, files_seen, rejected, "run-prod")


def test_class_below_min_images_per_class_fails(settings, raw_digits):
    # The digits have 174..183 images per class: 178 leaves exactly labels 2 (177) and 8 (174) short.
    strict = _with_validation(settings, min_images_per_class=178)
    with pytest.raises(ValidationFailedError) as info:
        validate_batch(strict, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-min")

    assert info.value.failures == [
        "min_images_per_class(label=2): observed 177 < 178",
        "min_images_per_class(label=8): observed 174 < 178",
    ]
    report = json.loads(Path(info.value.report_path).read_text())
    entry = next(e for e in report["expectations"] if e["check"] == "min_images_per_class")
    assert entry["success"] is False and entry["kwargs"]["min_value"] == 178
    assert entry["observed_value"] == [{"count": 177, "label": "2"}, {"count": 174, "label": "8"}]


def test_class_imbalance_over_threshold_fails(settings, raw_digits):
    tight = _with_validation(settings, max_class_imbalance=1.02)  # observed 183 / 174 = 1.0517
    with pytest.raises(ValidationFailedError) as info:
        validate_batch(tight, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-imb")
    assert info.value.failures == [
        "expect_column_max_to_be_between(class_imbalance) [max_class_imbalance]: observed 1.05172 > 1.02 "
        "(largest class '3': 183, smallest class '8': 174)"
    ]


def test_rows_planted_in_the_table_fail_and_the_old_version_still_passes(settings, raw_digits):
    planted = _plant(
        settings,
        [
            {"sha256": "a" * 64, "label": "x"},
            {"sha256": "b" * 64, "label": "x"},
            {"sha256": "c" * 64, "label": "x"},
            {"sha256": "d" * 64, "label": "4", "mode": "CMYK", "width": 5},
        ],
    )
    assert planted > raw_digits.raw_version

    with pytest.raises(ValidationFailedError) as info:
        validate_batch(settings, planted, raw_digits.files_seen, raw_digits.rejected, "run-bad")
    err = info.value
    assert err.failures == [
        "expect_column_values_to_be_in_set(label): 3 unexpected values ['x'] "
        f"(allowed: {list(settings.ingest.allowed_labels)})",
        "expect_column_values_to_be_between(width): 1 values out of range [5] (allowed: 8..4096)",
        f"expect_column_values_to_be_in_set(mode): 1 unexpected values ['CMYK'] (allowed: {list(settings.ingest.stored_modes)})",
    ]
    assert err.result.rows == 1797 + 4 and err.result.failed == 3
    assert Path(err.report_path).name == f"raw_v{planted}.json"
    report = json.loads(Path(err.report_path).read_text())
    label_entry = next(e for e in report["expectations"] if e["check"] == "label_in_set")
    assert label_entry["observed_value"] == 3
    assert {row["sha256"] for row in label_entry["result"]["partial_unexpected_index_list"]} == {
        "a" * 64, "b" * 64, "c" * 64
    }

    # Time travel: the version ingest produced is untouched by the later commit.
    assert validate_batch(settings, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-old").success


def test_bad_arguments_are_refused(settings, raw_digits):
    with pytest.raises(ValueError, match="files_seen and rejected"):
        validate_batch(settings, raw_digits.raw_version, -1, 0, "run-x")
    with pytest.raises(ValueError, match="raw_version"):
        validate_batch(settings, -1, 10, 0, "run-x")


def test_discovered_classes_come_from_the_first_validated_version_and_a_new_class_is_a_finding(settings, raw_digits):
    from tasks.data import classes

    discover = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"allowed_labels": "discover"})})
    first = validate_batch(discover, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-d")
    assert first.success
    assert classes.known(discover) == [str(d) for d in range(10)]
    report = json.loads(Path(first.report_path).read_text())
    assert report["thresholds"]["allowed_labels_from"].startswith("discovered in this version")
    validate_batch(discover, raw_digits.raw_version, raw_digits.files_seen, raw_digits.rejected, "run-d2")
    assert lake.current_version(discover.table_uri(classes.CLASSES_TABLE)) == 0  # recorded once

    version = _plant(discover, [{"sha256": f"{i:064x}", "label": "seven-segment"} for i in range(70)])
    with pytest.raises(ValidationFailedError) as failure:
        validate_batch(discover, version, 70, 0, "run-new")
    assert "new class 'seven-segment': 70 images" in str(failure.value)
    assert "cd4ml classes --accept seven-segment" in str(failure.value)
    assert classes.known(discover) == [str(d) for d in range(10)]  # not silently added

    assert classes.record(discover, ["seven-segment"], None, "cli", "accepted") == 1
    assert validate_batch(discover, version, 70, 0, "run-accepted").success
