"""Feedback files as an attacker or a careless operator writes them: each bad row rejected, the rest stored.

The predictions table is a real Delta table written with the scorer's schema (no model needed:
feedback only joins to what was scored).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.data import lake
from tasks.data.inputs import OutsideRootError, SchemeNotAllowedError
from tasks.serving.feedback import FeedbackError, load_feedback
from tasks.serving.score import PREDICTIONS_SCHEMA
from tests.factories.hostile import SECRET_LINE, deep_json, huge_field, watched_http_server

CLASSES = [str(d) for d in range(10)]


def _scored(settings, n: int = 5) -> list[str]:
    """``n`` predictions of model v1 in the settings' lake; returns their image keys."""
    now = datetime(2026, 11, 22, tzinfo=UTC)
    keys = [f"{i:064x}" for i in range(1, n + 1)]
    rows = [{"image_key": k, "source_uri": f"file:///inbox/{i}.png", "model_name": "m", "model_version": 1,
             "label": "3", "confidence": 0.9, "classes": CLASSES, "probabilities": [0.1] * 10,
             "logical_date": now, "scored_at": now, "run_id": "score"} for i, k in enumerate(keys)]
    lake.merge_new_rows(settings.predictions_table, pa.Table.from_pylist(rows, schema=PREDICTIONS_SCHEMA),
                        ["image_key", "source_uri"], {"run_id": "score", "step": "score"})
    return keys


def _folder(settings) -> Path:
    folder = Path(settings.storage.feedback_uri)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _rejects(result) -> list[tuple[int, str]]:
    return sorted((r["line"], r["reason_code"]) for r in lake.scan(lake.open_table(result.rejects_table)).to_pylist())


def test_malformed_rows_are_rejected_as_rows_and_the_others_are_stored(settings):
    keys = _scored(settings)
    folder = _folder(settings)
    lines = [json.dumps({"image_key": keys[0], "label": "1"}).encode(),
             json.dumps({"image_key": keys[1], "label": huge_field()}).encode(),  # a 200 kB field
             deep_json().encode(),  # before: RecursionError, and the whole load failed
             b'{"image_key": "' + keys[2].encode() + b'", "label": "\xe9"}',  # not UTF-8: before the file failed
             b'{"image_key": "\\ud800", "label": "2"}',  # a lone surrogate no table column can hold
             json.dumps({"image_key": keys[3], "label": "4"}).encode()]
    (folder / "day1.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (folder / "day1.csv").write_bytes(b"image_key,label\n" + keys[4].encode() + b",5\n"
                                      + b"x," + huge_field().encode() + b"\n" + b"\xff\xfe,6\n")
    result = load_feedback(settings, run_id="fb1", logical_date="2026-11-22")
    assert result.accepted == 3 and result.rejected_by_reason == {"bad_row": 6}
    # jsonl lines 2-5 and csv lines 3-4, each its own reject
    assert _rejects(result) == [(2, "bad_row"), (3, "bad_row"), (3, "bad_row"), (4, "bad_row"), (4, "bad_row"),
                                (5, "bad_row")]
    stored = lake.scan(lake.open_table(result.feedback_table)).to_pylist()
    assert sorted((r["image_key"], r["label"]) for r in stored) == [(keys[0], "1"), (keys[3], "4"), (keys[4], "5")]


def test_a_bad_file_in_the_folder_never_stops_a_later_run(settings, tmp_path):
    keys = _scored(settings)
    folder = _folder(settings)
    (folder / "a.csv").write_text(SECRET_LINE + "\n")  # no label column: the file cannot be used at all
    outside = tmp_path / "outside.csv"
    outside.write_text(f"image_key,label\n{keys[1]},2\n")
    os.symlink(outside, folder / "b.csv")  # a link out of the feedback folder
    (folder / "c.csv").write_text(f"image_key,label\n{keys[0]},1\n")
    for run in ("fb1", "fb2"):  # the scheduled monitor reads the whole folder every run
        result = load_feedback(settings, run_id=run, logical_date="2026-11-22")
        assert result.rejected_by_reason == {"bad_file": 2}
    assert [r["image_key"] for r in lake.scan(lake.open_table(result.feedback_table)).to_pylist()] == [keys[0]]
    reasons = " ".join(r["reason"] for r in lake.scan(lake.open_table(result.rejects_table)).to_pylist())
    assert "root:x" not in reasons and "/bin/bash" not in reasons


def test_a_given_file_must_lie_under_the_feedback_folder_and_use_an_allowed_scheme(settings):
    _scored(settings)
    with pytest.raises(OutsideRootError):  # before: any readable file was read
        load_feedback(settings, ["/etc/passwd"], run_id="fb", logical_date="2026-11-22")
    with watched_http_server() as (base, requests):
        with pytest.raises(SchemeNotAllowedError) as caught:
            load_feedback(settings, [f"{base}/labels.csv"], run_id="fb", logical_date="2026-11-22")
    assert caught.value.key == "serving.allowed_schemes" and requests == []
    bad = _folder(settings) / "bad.csv"
    bad.write_text(SECRET_LINE + "\n")
    with pytest.raises(FeedbackError) as caught:  # named by hand: said at once, without the file's content
        load_feedback(settings, [str(bad)], run_id="fb", logical_date="2026-11-22")
    assert "root:x" not in str(caught.value) and "/bin/bash" not in str(caught.value)
