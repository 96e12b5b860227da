import io
import json
import os

import fsspec
import pytest
from PIL import Image

from tasks.data.inputs import InputRefusedError, OutsideRootError, SchemeNotAllowedError
from tasks.data.sources import LandingNotFoundError, SourceError, open_source


def _png(value=128, size=(16, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("L", size, value).save(buf, format="PNG")
    return buf.getvalue()


def _by_name(entries):
    return {e.uri.rsplit("/", 1)[-1]: e for e in entries}


def test_folder_labels_stable_order_unicode_and_hidden_files(tmp_path):
    root = tmp_path / "landing"
    (root / "3").mkdir(parents=True)
    (root / "1" / "deeper").mkdir(parents=True)
    (root / "3" / "b.png").write_bytes(_png(1))
    (root / "3" / "a b é.png").write_bytes(_png(2))
    (root / "1" / "deeper" / "x.png").write_bytes(_png(3))
    (root / "3" / ".DS_Store").write_bytes(b"junk")
    (root / "loose.png").write_bytes(_png(4))
    entries = list(open_source(str(root)).entries())
    # Files of a folder first, then its subfolders; names sorted: the same order on every run.
    assert [e.uri.split("/landing/", 1)[1] for e in entries] == ["loose.png", "1/deeper/x.png", "3/a b é.png", "3/b.png"]
    labels = {e.uri.rsplit("/", 1)[-1]: e.label for e in entries}
    assert labels == {"x.png": "1", "a b é.png": "3", "b.png": "3", "loose.png": None}
    e = _by_name(entries)["a b é.png"]
    assert e.uri == f"file://{root.resolve()}/3/a b é.png" and e.size > 0 and e.mtime_ns > 0 and e.problem is None
    with fsspec.open(e.uri, "rb") as fh:  # source_uri opens again through fsspec, unencoded
        assert fh.read() == _png(2)
    assert list(open_source(f"file://{root}").entries()) == entries


def test_symlinks_inside_followed_outside_and_broken_rejected_fifo_never_opened(tmp_path):
    root = tmp_path / "landing"
    (root / "3").mkdir(parents=True)
    (root / "3" / "real.png").write_bytes(_png(1))
    outside = tmp_path / "secret.png"
    outside.write_bytes(_png(2))
    os.symlink(root / "3" / "real.png", root / "3" / "alias.png")
    os.symlink(outside, root / "3" / "escape.png")
    os.symlink(tmp_path / "gone.png", root / "3" / "dangling.png")
    os.symlink(tmp_path, root / "4")  # a label folder that is a link out of the zone
    os.mkfifo(root / "3" / "pipe.png")
    entries = _by_name(open_source(str(root)).entries())
    assert entries["alias.png"].problem is None and entries["alias.png"].path == str((root / "3" / "real.png").resolve())
    assert entries["escape.png"].problem.code == "symlink_outside_landing"
    assert str(outside) in entries["escape.png"].problem.detail
    assert entries["dangling.png"].problem.code == "broken_symlink"
    assert entries["4"].problem.code == "symlink_outside_landing"
    assert entries["pipe.png"].problem.code == "not_a_file"


def test_csv_manifest_rules(tmp_path):
    root = tmp_path / "landing"
    (root / "imgs").mkdir(parents=True)
    (root / "imgs" / "a.png").write_bytes(_png(1))
    (root / "imgs" / "b c.png").write_bytes(_png(2))
    (tmp_path / "outside.png").write_bytes(_png(3))
    (root / "labels.csv").write_text(
        "path,label,comment\n"
        "imgs/a.png,3,fine\n"
        "imgs/b c.png,4,spaces are fine\n"
        "../outside.png,3,climbs out\n"
        "imgs/../imgs/a.png,3,climbs even if it lands inside\n"
        f"{tmp_path / 'outside.png'},3,absolute outside\n"
        f"{root / 'imgs' / 'a.png'},5,absolute inside\n"
        "imgs/missing.png,3,not there\n"
        ",3,no path\n"
        "imgs/a.png,,no label\n"
    )
    entries = list(open_source(str(root), "csv", "labels.csv").entries())
    got = [(e.label, e.problem.code if e.problem else None) for e in entries]
    assert got == [
        ("3", None), ("4", None), ("3", "path_traversal"), ("3", "path_traversal"), ("3", "outside_landing"),
        ("5", None), ("3", "missing_file"), ("3", "bad_manifest_row"), (None, "bad_manifest_row"),
    ]
    assert entries[1].uri.endswith("/imgs/b c.png") and entries[1].path.endswith("b c.png")
    assert "#L" in entries[7].uri  # a row without a file is named by its manifest line


def test_jsonl_manifest_and_its_bad_lines(tmp_path):
    root = tmp_path / "landing"
    (root / "x").mkdir(parents=True)
    (root / "x" / "a.png").write_bytes(_png(1))
    lines = [json.dumps({"path": "x/a.png", "label": "7"}), "not json", json.dumps(["x/a.png", "7"]), "",
             json.dumps({"path": "x/a.png", "label": 8})]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    # A manifest outside the root is refused before it is opened (a Param must not read any file).
    with pytest.raises(OutsideRootError):
        open_source(str(root), "jsonl", str(tmp_path / "m.jsonl"))
    (root / "m.jsonl").write_text("\n".join(lines) + "\n")
    entries = list(open_source(str(root), "jsonl", "m.jsonl").entries())
    assert [(e.label, e.problem.code if e.problem else None) for e in entries] == [
        ("7", None), (None, "bad_manifest_row"), (None, "bad_manifest_row"), ("8", None)]


def test_whole_source_errors_are_clear(tmp_path):
    with pytest.raises(LandingNotFoundError, match="does not exist"):
        open_source(str(tmp_path / "nope"))
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SourceError, match="not a folder"):
        open_source(str(tmp_path / "f.txt"))
    with pytest.raises(SourceError, match="needs a manifest"):
        open_source(str(tmp_path), "csv")
    (tmp_path / "bad.csv").write_text("file,class\na.png,3\n")
    with pytest.raises(SourceError, match="needs a header with path and label"):
        list(open_source(str(tmp_path), "csv", "bad.csv").entries())
    with pytest.raises(SourceError, match="cannot be opened"):
        list(open_source(str(tmp_path), "csv", "absent.csv").entries())
    with pytest.raises(SourceError, match="Protocol not known"):
        open_source("nosuchproto://bucket/landing", allowed_schemes=("nosuchproto",))
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(SourceError, match="install s3fs"):
            open_source("s3://bucket/landing", allowed_schemes=("s3",))


def test_fsspec_url_listing_and_reading():
    fs = fsspec.filesystem("memory")
    fs.mkdir("/src-test/landing/2")
    fs.pipe("/src-test/landing/2/a.png", _png(9))
    fs.pipe("/src-test/landing/top.png", _png(8))
    source = open_source("memory://src-test/landing", allowed_schemes=("memory",))
    entries = list(source.entries())
    assert [(e.uri, e.label) for e in entries] == [
        ("memory:///src-test/landing/2/a.png", "2"), ("memory:///src-test/landing/top.png", None)]
    assert entries[0].size == len(_png(9)) and source.read(entries[0], 1 << 20) == _png(9)
    fs.rm("/src-test", recursive=True)


# ---------------------------------------------------------------- hostile input (issue 22)

def test_a_manifest_outside_the_root_is_refused_and_no_error_echoes_a_file(tmp_path):
    from tests.factories.hostile import SECRET_LINE

    root = tmp_path / "landing"
    root.mkdir()
    with pytest.raises(OutsideRootError):  # before: /etc/passwd was opened and its first line echoed
        list(open_source(str(root), "csv", "/etc/passwd").entries())
    (root / "passwd.csv").write_text(SECRET_LINE + "\ndaemon:x:1:1\n")  # a "manifest" with anything in it
    with pytest.raises(SourceError) as caught:
        list(open_source(str(root), "csv", "passwd.csv").entries())
    assert "root:x" not in str(caught.value) and "/bin/bash" not in str(caught.value)


def test_http_sources_and_manifests_are_refused_unfetched():
    from tests.factories.hostile import watched_http_server

    with watched_http_server() as (base, requests):
        with pytest.raises(SchemeNotAllowedError) as caught:
            open_source(f"{base}/landing")
        assert (caught.value.scheme, caught.value.key) == ("http", "ingest.allowed_schemes")
        with pytest.raises(SchemeNotAllowedError):
            open_source("/tmp", "csv", f"{base}/labels.csv")
        with pytest.raises(SchemeNotAllowedError) as caught:  # scoring's locations answer to serving's key
            open_source(f"{base}/inbox", allowed_schemes=("file",), schemes_key="serving.allowed_schemes")
        assert caught.value.key == "serving.allowed_schemes"
    assert requests == []


def test_a_name_that_is_not_utf8_is_quarantined_and_the_listing_goes_on(tmp_path):
    from tests.factories.hostile import png, undecodable

    root = tmp_path / "landing"
    (root / "3").mkdir(parents=True)
    (root / "3" / "fine.png").write_bytes(png())
    with open(undecodable(root / "3"), "wb") as fh:
        fh.write(png(value=3))
    os.mkdir(undecodable(root, b"\xff", b""))  # a label folder so named: not walked
    with open(undecodable(root, b"\xff", b"") + b"/x.png", "wb") as fh:
        fh.write(png(value=4))
    entries = list(open_source(str(root)).entries())  # before: UnicodeEncodeError, the whole listing lost
    codes = sorted((e.problem.code if e.problem else "", e.uri.rsplit("/", 1)[-1]) for e in entries)
    assert codes == [("", "fine.png"), ("undecodable_name", "\\xff"), ("undecodable_name", "caf\\xe9.png")]
    assert all(e.uri.encode("utf-8") for e in entries)


def test_bad_manifest_rows_are_rejected_as_rows_and_the_others_go_on(tmp_path):
    from tests.factories.hostile import deep_json, huge_field, png

    root = tmp_path / "landing"
    (root / "x").mkdir(parents=True)
    (root / "x" / "a.png").write_bytes(png())
    good = json.dumps({"path": "x/a.png", "label": "7"}).encode()
    lines = [good, json.dumps({"path": huge_field(), "label": "1"}).encode(), deep_json().encode(),
             b'{"path": "x/\xe9.png", "label": "2"}', json.dumps({"path": "x/a\u0000.png", "label": "3"}).encode(),
             b'{"path": "x/\\ud800.png", "label": "4"}', good]
    (root / "m.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    entries = list(open_source(str(root), "jsonl", "m.jsonl").entries())  # before: RecursionError on line 3
    assert [e.problem.code if e.problem else None for e in entries] == [None] + ["bad_manifest_row"] * 5 + [None]
    csv_lines = [b"path,label", b"x/a.png," + huge_field().encode(), b"x/\xe9.png,2", b"x/a.png,7"]
    (root / "m.csv").write_bytes(b"\n".join(csv_lines) + b"\n")
    entries = list(open_source(str(root), "csv", "m.csv").entries())  # before: csv.Error, nothing ingested
    assert [e.problem.code if e.problem else e.label for e in entries] == ["bad_manifest_row", "bad_manifest_row", "7"]


def test_an_object_store_manifest_must_lie_under_its_root():
    fs = fsspec.filesystem("memory")
    fs.pipe("/src-manifest/landing/2/a.png", _png(9))
    fs.pipe("/src-manifest/landing/labels.csv", b"path,label\n2/a.png,5\n")
    fs.pipe("/src-manifest/elsewhere.csv", b"path,label\nlanding/2/a.png,5\n")
    allowed = ("memory",)
    entries = list(open_source("memory://src-manifest/landing", "csv", "labels.csv", allowed_schemes=allowed).entries())
    assert [(e.uri, e.label, e.problem) for e in entries] == [("memory:///src-manifest/landing/2/a.png", "5", None)]
    for outside in ("memory://src-manifest/elsewhere.csv", "../elsewhere.csv", "/src-manifest/elsewhere.csv"):
        with pytest.raises(InputRefusedError):  # outside the root; the last one is a local path (scheme file)
            open_source("memory://src-manifest/landing", "csv", outside, allowed_schemes=allowed)
    fs.rm("/src-manifest", recursive=True)
