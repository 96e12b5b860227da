"""The Spark engine: clear stops when it cannot run; the executor function follows the local rules.

pyspark is not a dependency of the suite (requirements-spark.txt): the session test skips
without it. The not-installed message is tested for real where pyspark is absent, and by
hiding the installed module where it is present.
"""

import io
import sys

import pytest
from PIL import Image

from tasks.data.ingest import ingest_landing
from tasks.data.sample_data import write_digits
from tasks.data.spark_ingest import RESULT_FIELDS, SparkUnavailableError, process_partition


def _spark_settings(settings, **extra):
    return settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"engine": "spark", **extra})})


@pytest.fixture
def no_pyspark(monkeypatch):
    if "pyspark" not in sys.modules:
        try:
            import pyspark  # noqa: F401
        except ImportError:
            return  # really absent: nothing to hide
    for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark -> ImportError


def test_engine_setting_without_pyspark_stops_with_the_install_command(settings, tmp_path, no_pyspark):
    write_digits(tmp_path / "l", limit=3)
    with pytest.raises(SparkUnavailableError, match=r"pip install -r requirements-spark.txt"):
        ingest_landing(_spark_settings(settings), run_id="s", logical_date="2026-11-21", landing=tmp_path / "l")
    with pytest.raises(SparkUnavailableError, match="pyspark is not installed"):
        ingest_landing(settings, run_id="s", logical_date="2026-11-21", landing=tmp_path / "l", engine="spark")


def test_unknown_engine_is_a_clear_error(settings, tmp_path):
    with pytest.raises(ValueError, match="local or spark"):
        ingest_landing(settings, run_id="s", logical_date="2026-11-21", landing=tmp_path, engine="dask")


def test_executor_function_applies_the_local_rules(tmp_path):
    good = tmp_path / "good.png"
    Image.new("L", (16, 16), 3).save(good)
    buf = io.BytesIO()
    Image.new("RGBA", (16, 16), (1, 2, 3, 0)).save(buf, format="PNG")
    (tmp_path / "rgba.png").write_bytes(buf.getvalue())
    (tmp_path / "bad.png").write_text("text")
    rows = [(0, f"file://{good}", str(good), "1"),
            (1, f"file://{tmp_path}/rgba.png", str(tmp_path / "rgba.png"), "2"),
            (2, f"file://{tmp_path}/bad.png", str(tmp_path / "bad.png"), "3"),
            (3, f"file://{tmp_path}/gone.png", str(tmp_path / "gone.png"), "4")]
    cfg = {"min_side": 8, "max_side": 4096, "max_pixels": 1 << 24, "keep_modes": ("L", "RGB"), "convert_modes": ("RGBA",)}
    out = [dict(zip(RESULT_FIELDS, r)) for r in process_partition(rows, cfg)]
    assert [(r["seq"], r["reason_code"]) for r in out] == [(0, None), (1, None), (2, "not_an_image"), (3, "unreadable")]
    assert out[0]["image"] == good.read_bytes() and out[0]["mode"] == "L"
    assert out[1]["mode"] == "RGB" and out[1]["source_mode"] == "RGBA" and out[1]["sha256"]


def test_spark_session_without_delta_jars_stops_with_a_clear_message(settings, tmp_path):
    pytest.importorskip("pyspark", reason="pyspark not installed (requirements-spark.txt)")
    from tasks.data.spark_ingest import spark_session

    spark_settings = _spark_settings(settings, spark_master="local[1]")
    try:
        spark = spark_session(spark_settings)
    except SparkUnavailableError as exc:
        assert "Delta Lake jars are not on Spark's classpath" in str(exc) and "spark.jars" in str(exc)
        return
    # The jars are there (a cluster image): then the Spark job must agree with the local engine.
    spark.stop()
    write_digits(tmp_path / "l", limit=30, with_bad_files=True)
    result = ingest_landing(spark_settings, run_id="spark", logical_date="2026-11-21", landing=tmp_path / "l")
    assert (result.engine, result.inserted, result.rejected, result.files_seen) == ("spark", 30, 2, 32)
