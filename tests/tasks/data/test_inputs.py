"""tasks/data/inputs.py: schemes from settings, locations confined to their root, rows bounded."""

from __future__ import annotations

import io
import json
import os
import tracemalloc

import pytest

from tasks.data.inputs import (
    BadRowError,
    OutsideRootError,
    SchemeNotAllowedError,
    bounded_lines,
    check_scheme,
    confined,
    csv_records,
    json_object,
    jsonl_records,
    schemes_of,
)
from tasks.errors import DataError
from tests.factories.hostile import deep_json, huge_field


def test_schemes_are_read_as_fsspec_reads_them():
    assert schemes_of("/landing") == ["file"] and schemes_of("file:///landing") == ["file"]
    assert schemes_of("http://127.0.0.1:9/x") == ["http"]
    assert schemes_of("simplecache::s3://bucket/x") == ["simplecache", "s3"]
    assert schemes_of("data:text/plain;base64,eA==") == ["data"]


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9/x", "https://example.invalid/x", "data:text/plain,x",
                                 "simplecache::http://127.0.0.1:9/x", "memory://x"])
def test_a_scheme_settings_do_not_allow_is_refused_naming_the_scheme_and_the_key(uri):
    with pytest.raises(SchemeNotAllowedError) as caught:
        check_scheme(uri, ("file",), "ingest.allowed_schemes", "the source")
    assert isinstance(caught.value, DataError)  # a retry cannot help: the DAG fails it at once
    assert caught.value.key == "ingest.allowed_schemes" and caught.value.scheme in schemes_of(uri)
    assert caught.value.key in str(caught.value) and "127.0.0.1" not in str(caught.value)  # no URI (credentials)
    check_scheme(uri.replace("simplecache::", ""), schemes_of(uri), "ingest.allowed_schemes", "the source")


def test_a_location_outside_its_root_is_refused_after_links_and_dots(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "m.csv").write_text("path,label\n")
    os.symlink("/etc/passwd", root / "link.csv")
    assert confined(str(root / "sub" / "m.csv"), str(root), "the manifest") == str((root / "sub" / "m.csv").resolve())
    for outside in ("/etc/passwd", str(root / ".." / "x.csv"), str(root / "link.csv"), f"file://{root}/../x.csv"):
        with pytest.raises(OutsideRootError):
            confined(outside, str(root), "the manifest")
    with pytest.raises(OutsideRootError):
        confined("memory://bucket/root/../other/m.csv", "memory://bucket/root", "the manifest")


def test_an_overlong_line_is_refused_without_being_held_and_the_next_line_goes_on():
    text = b"a,b\n" + huge_field(50_000_000).encode() + b"\n\xff\xfe bad\n1,2\n"
    tracemalloc.start()
    try:
        lines = list(bounded_lines(io.BytesIO(text), 1024))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # a 50 MB line was skipped in 64 kB chunks, never held
    assert lines[0] == (1, "a,b\n") and lines[3] == (4, "1,2\n")
    assert [(n, e.kind) for n, e in lines[1:3]] == [(2, "too_long"), (3, "bad_encoding")]


def test_json_nested_10000_deep_is_a_bad_row_not_a_recursion_error():
    with pytest.raises(BadRowError) as caught:
        json_object(deep_json(), 7)
    assert caught.value.kind == "too_deep"
    quoted = json.dumps({"path": "[" * 100, "label": "3"})  # brackets inside a string are not nesting
    assert json_object(quoted, 1)["label"] == "3"
    for line, kind in (("[1, 2]", "not_an_object"), ("{", "not_json"), ("1" * 5000, "not_json")):
        with pytest.raises(BadRowError) as caught:
            json_object(line, 1)
        assert caught.value.kind == kind


def test_csv_and_jsonl_records_reject_rows_and_go_on():
    lines = [(1, "path,label\n"), (2, '"' + huge_field() + '",3\n'), (3, BadRowError("bad_encoding", "line 3")),
             (4, "a.png,4\n")]
    header, records = csv_records(iter(lines))
    got = [(n, r.kind if isinstance(r, BadRowError) else r["label"]) for n, r in records]
    assert header == ["path", "label"] and got == [(2, "not_csv"), (3, "bad_encoding"), (4, "4")]
    rows = list(jsonl_records(iter([(1, deep_json() + "\n"), (2, "\n"), (3, '{"path": "a", "label": "1"}\n')])))
    assert [(n, r.kind if isinstance(r, BadRowError) else r["label"]) for n, r in rows] == [(1, "too_deep"), (3, "1")]
