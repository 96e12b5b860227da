import io
import shutil

import pytest
from PIL import Image

from tasks.data import lake
from tasks.data.ingest import MANIFEST_TABLE, META_COLUMNS, EmptyLandingError, ingest_landing
from tasks.data.sample_data import write_digits


def _png(size=(16, 16), value=128) -> bytes:
    buf = io.BytesIO()
    Image.new("L", size, value).save(buf, format="PNG")
    return buf.getvalue()


def _rejects(settings):
    table = lake.read(settings.rejects_table, lake.current_version(settings.rejects_table))
    return {r["source_uri"].rsplit("/", 2)[-2] + "/" + r["source_uri"].rsplit("/", 1)[-1]: r for r in table.to_pylist()}


def test_ingests_real_digits_once(settings, raw_digits, digits_landing):
    assert raw_digits.committed and raw_digits.inserted == 1797 and raw_digits.rejected == 0
    table = lake.read(settings.raw_table, raw_digits.raw_version)
    assert table.num_rows == 1797
    assert set(table.column("label").to_pylist()) == {str(d) for d in range(10)}
    assert table.schema.field("image").type == "binary"
    again = ingest_landing(settings, run_id="second", logical_date="2026-11-22", landing=digits_landing)
    assert not again.committed and again.inserted == 0 and again.already_present == 1797
    assert again.raw_version == raw_digits.raw_version == lake.current_version(settings.raw_table)
    assert lake.read(settings.raw_table, again.raw_version).num_rows == 1797


def test_bad_files_are_quarantined_and_the_batch_goes_on(settings, tmp_path):
    landing = tmp_path / "landing"
    write_digits(landing, limit=20)
    good = _png()
    (landing / "3" / "empty.png").write_bytes(b"")
    (landing / "3" / "text.png").write_text("not an image")
    (landing / "4" / "truncated.png").write_bytes(good[: len(good) // 2])
    (landing / "4" / "tiny.png").write_bytes(_png((4, 4)))
    (landing / "4" / "notes.txt").write_text("hello")
    (landing / "cat").mkdir()
    (landing / "cat" / "x.png").write_bytes(_png(value=9))
    (landing / "loose.png").write_bytes(_png(value=10))
    (landing / "5" / "a.png").write_bytes(_png(value=77))
    (landing / "6").mkdir(exist_ok=True)
    (landing / "6" / "b.png").write_bytes(_png(value=77))  # same bytes, other label

    result = ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=landing)
    assert result.inserted == 20
    reasons = {k: v["reason_code"] for k, v in _rejects(settings).items()}
    assert reasons == {
        "3/empty.png": "empty_file",
        "3/text.png": "not_an_image",
        "4/truncated.png": "corrupt_image",
        "4/tiny.png": "too_small",
        "4/notes.txt": "bad_extension",
        "cat/x.png": "unknown_label",
        "landing/loose.png": "no_label",
        "5/a.png": "label_conflict",
        "6/b.png": "label_conflict",
    }
    assert all(r["reason"] for r in _rejects(settings).values())
    raw = lake.read(settings.raw_table, result.raw_version, META_COLUMNS)
    assert raw.num_rows == 20

    again = ingest_landing(settings, run_id="r2", logical_date="2026-11-21", landing=landing)
    assert again.rejected == 9 and not again.committed
    assert lake.open_table(settings.rejects_table).count() == 9  # recorded once, not per run


def test_same_bytes_as_an_existing_image_under_another_label_is_rejected(settings, tmp_path):
    landing = tmp_path / "landing"
    (landing / "1").mkdir(parents=True)
    (landing / "1" / "a.png").write_bytes(_png(value=5))
    ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=landing)
    (landing / "2").mkdir()
    (landing / "2" / "a_copy.png").write_bytes(_png(value=5))
    result = ingest_landing(settings, run_id="r2", logical_date="2026-11-22", landing=landing)
    assert not result.committed
    assert _rejects(settings)["2/a_copy.png"]["reason"] == "same bytes already ingested with label '1'"


def test_a_second_batch_reads_the_tables_by_key_never_whole(settings, tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    (landing / "1").mkdir(parents=True)
    (landing / "1" / "a.png").write_bytes(_png(value=5))
    (landing / "1" / "b.png").write_bytes(_png(value=6))
    ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=landing)
    # a batch of a few files against millions of rows: the raw table's labels and the manifest's rows are read for
    # the files listed, not the whole table (lake.scan reads every row of the columns asked)
    real, image_tables = lake.scan, {lake.table_name(settings.raw_table), MANIFEST_TABLE}

    def whole(table, *args, **kwargs):
        assert lake.table_name(table.table_uri) not in image_tables, "a table of a row an image was read whole"
        return real(table, *args, **kwargs)

    monkeypatch.setattr(lake, "scan", whole)
    (landing / "1" / "b.png").write_bytes(_png(value=7))  # changed: read again
    (landing / "2").mkdir()
    (landing / "2" / "a_copy.png").write_bytes(_png(value=5))  # the bytes of 1/a.png: a conflict
    (landing / "2" / "c.png").write_bytes(_png(value=8))
    result = ingest_landing(settings, run_id="r2", logical_date="2026-11-22", landing=landing)
    assert (result.inserted, result.already_present, result.rejected, result.files_read) == (2, 1, 1, 3)
    monkeypatch.undo()
    assert _rejects(settings)["2/a_copy.png"]["reason"] == "same bytes already ingested with label '1'"


def test_empty_landing_is_a_clear_error_and_writes_no_version(settings, tmp_path):
    (tmp_path / "empty" / "3").mkdir(parents=True)
    with pytest.raises(EmptyLandingError, match="holds no files"):
        ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=tmp_path / "empty")
    assert lake.current_version(settings.raw_table) is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=tmp_path / "nope")


def test_all_rejected_records_rejects_then_says_so(settings, tmp_path):
    (tmp_path / "l" / "1").mkdir(parents=True)
    (tmp_path / "l" / "1" / "x.png").write_text("nope")
    with pytest.raises(EmptyLandingError, match="all 1 files were rejected"):
        ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=tmp_path / "l")
    assert lake.open_table(settings.rejects_table).count() == 1


def test_new_files_make_a_new_version_tagged_with_the_logical_date(settings, tmp_path, digits_landing):
    landing = tmp_path / "landing"
    shutil.copytree(digits_landing / "0", landing / "0")
    first = ingest_landing(settings, run_id="r1", logical_date="2026-11-20", landing=landing)
    shutil.copytree(digits_landing / "1", landing / "1")
    second = ingest_landing(settings, run_id="r2", logical_date="2026-11-21", landing=landing)
    assert second.raw_version == first.raw_version + 1
    assert lake.version_as_of(settings.raw_table, "2026-11-20") == first.raw_version
    assert lake.version_as_of(settings.raw_table, "2026-11-21") == second.raw_version
    assert lake.read(settings.raw_table, first.raw_version, ["sha256"]).num_rows < lake.read(
        settings.raw_table, second.raw_version, ["sha256"]).num_rows


def test_sample_data_is_byte_identical_when_written_twice(tmp_path):
    write_digits(tmp_path / "a", limit=5)
    write_digits(tmp_path / "b", limit=5)
    for f in (tmp_path / "a").rglob("*.png"):
        assert f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes()
    before = {f: f.stat().st_mtime_ns for f in (tmp_path / "a").rglob("*.png")}
    write_digits(tmp_path / "a", limit=5)  # unchanged files keep their mtime: the next ingest skips them
    assert {f: f.stat().st_mtime_ns for f in before} == before


def test_discover_takes_any_folder_name_as_a_label_and_a_mixed_colour_batch_keeps_both_modes(settings, tmp_path):
    """allowed_labels: discover: no unknown_label rejects (validation decides); colour and grey files are stored as
    they are (the training spec converts them by its documented rule)."""
    discover = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"allowed_labels": "discover"})})
    landing = tmp_path / "landing"
    (landing / "tabby cat").mkdir(parents=True)
    (landing / "tabby cat" / "grey.png").write_bytes(_png(value=40))
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, format="PNG")
    (landing / "tabby cat" / "red.png").write_bytes(buf.getvalue())
    result = ingest_landing(discover, run_id="d1", logical_date="2026-11-21", landing=landing)
    assert result.inserted == 2 and result.rejected == 0
    raw = lake.read(discover.raw_table, result.raw_version, META_COLUMNS).to_pylist()
    assert {(r["label"], r["mode"]) for r in raw} == {("tabby cat", "L"), ("tabby cat", "RGB")}


def test_a_missing_or_empty_landing_is_a_data_error_that_fails_at_once(settings, tmp_path):
    from tasks.errors import DataError

    (tmp_path / "empty").mkdir()
    for landing in (tmp_path / "nope", tmp_path / "empty"):  # before: FileNotFoundError / RuntimeError: retried
        with pytest.raises(DataError):
            ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=landing)


def test_an_http_landing_or_manifest_is_refused_before_anything_is_fetched(settings, tmp_path):
    from tasks.data.inputs import SchemeNotAllowedError
    from tests.factories.hostile import watched_http_server

    landing = tmp_path / "landing"
    write_digits(landing, limit=5)
    with watched_http_server() as (base, requests):
        with pytest.raises(SchemeNotAllowedError) as caught:
            ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=f"{base}/landing")
        assert caught.value.key == "ingest.allowed_schemes"
        with pytest.raises(SchemeNotAllowedError):
            ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=landing, label_source="csv",
                           manifest=f"{base}/labels.csv")
    assert requests == [] and lake.current_version(settings.raw_table) is None
