"""A short, deterministic fuzz run of every parser of untrusted bytes (issue 22); bench/fuzz.py is the long one.

Headers (tasks/data/headers.py and scoring's screen), manifests (tasks/data/sources.py over
tasks/data/inputs.py) and feedback files (tasks/serving/feedback.py): arbitrary and mutated
bytes give only the project's typed answers. ``derandomize``: the same inputs every run, so a
failure here is a reproducible finding, not noise; the deadline catches a hang.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings

from tests.factories.fuzzing import (
    FEEDBACK_SEEDS,
    FINDINGS,
    MANIFEST_SEEDS,
    check_feedback,
    check_headers,
    check_manifest,
    check_prepare,
    check_screen,
    image_inputs,
    text_inputs,
)

SHORT = settings(max_examples=150, derandomize=True, database=None, deadline=timedelta(seconds=2),
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz") / "landing"
    (folder / "x").mkdir(parents=True)
    (folder / "x" / "a.png").write_bytes(b"\x89PNG")
    return folder


@SHORT
@given(image_inputs())
def test_header_readers_answer_a_header_or_none(data):
    check_headers(data)


@SHORT
@given(image_inputs())
@example(FINDINGS[0])  # before: TypeError from Pillow's GIF frame count
def test_the_scoring_screen_answers_a_rejection_or_none(data):
    check_screen(data)


@SHORT
@given(image_inputs())
@example(FINDINGS[0])
def test_ingests_full_decode_answers_an_image_or_a_rejection(data):
    check_prepare(data)


@SHORT
@given(text_inputs(MANIFEST_SEEDS))
def test_a_csv_manifest_of_any_bytes_is_rows_or_one_source_error(root, data):
    check_manifest(root, data, "csv")


@SHORT
@given(text_inputs(MANIFEST_SEEDS))
def test_a_jsonl_manifest_of_any_bytes_is_rows_or_one_source_error(root, data):
    check_manifest(root, data, "jsonl")


@SHORT
@given(text_inputs(FEEDBACK_SEEDS))
def test_a_feedback_file_of_any_bytes_is_rows_or_one_feedback_error(root, data):
    check_feedback(root / "feedback.csv", data)
    check_feedback(root / "feedback.jsonl", data)
