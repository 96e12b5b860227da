"""Every quarantine kind of the data-plane issue, through ``ingest_landing`` (real files, real PIL, real Delta)."""

import ctypes
import io
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cd4ml_runtime.preprocess import PreprocessSpec, decode
from tasks.data import lake
from tasks.data.ingest import ingest_landing
from tasks.data.sample_data import write_digits
from tasks.settings import REPO_ROOT


def _enc(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _noise(size=(16, 16), seed=0, mode="L") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    arr = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(arr[:, :, 0] if channels == 1 else arr, mode=mode)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height and holds no pixels: a decompression bomb's header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _rejects(settings) -> dict[str, dict]:
    table = lake.read(settings.rejects_table, lake.current_version(settings.rejects_table)).to_pylist()
    return {r["source_uri"].rsplit("/", 1)[-1]: r for r in table}


def _raw(settings, version) -> dict[str, dict]:
    return {r["source_uri"].rsplit("/", 1)[-1]: r for r in lake.read(settings.raw_table, version).to_pylist()}


def test_every_bad_input_is_a_reject_row_and_the_batch_goes_on(settings, tmp_path):
    landing = tmp_path / "landing"
    write_digits(landing, limit=20)
    put = lambda rel, data: (landing / rel).parent.mkdir(parents=True, exist_ok=True) or (landing / rel).write_bytes(data)  # noqa: E731
    png, jpg = _enc(_noise(seed=1)), _enc(_noise((32, 32), seed=2, mode="RGB"), "JPEG", quality=90)
    put("3/empty.png", b"")
    put("3/text.png", b"this is a text file with an image extension\n")
    put("3/notes.txt", b"hello")
    put("4/truncated.png", png[: len(png) // 2])
    put("4/truncated.jpg", jpg[: len(jpg) // 2])
    put("4/bomb.png", _png_header_only(5_000, 5_000))  # over our max_pixels, under Pillow's own guard
    put("4/megabomb.png", _png_header_only(50_000, 50_000))  # over Pillow's guard too
    put("4/tiny.png", _enc(_noise((4, 4), seed=3)))
    put("4/huge.png", _enc(Image.new("L", (5000, 8), 7)))
    put("5/cmyk.jpg", _enc(Image.new("CMYK", (16, 16), (0, 50, 100, 0)), "JPEG"))
    frames = [_noise(seed=s) for s in (4, 5, 6)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    put("5/animated.gif", buf.getvalue())
    put("5/palette.png", _enc(_noise(seed=7).convert("P")))
    put("5/rgba.png", _enc(_noise(seed=8, mode="RGBA")))
    put("5/sixteen.png", _enc(Image.fromarray(np.full((16, 16), 40000, np.uint16))))
    rotated = Image.new("RGB", (32, 16), (0, 0, 255))
    rotated.paste((255, 0, 0), (0, 0, 8, 16))  # a red band on the left that rotation must move
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    put("6/rotated.jpg", _enc(rotated, "JPEG", exif=exif.tobytes(), quality=95))
    put("7/été avec espace.png", _enc(_noise(seed=9)))
    put("cat/x.png", _enc(_noise(seed=10)))
    same = _enc(_noise(seed=11))
    put("8/a.png", same)
    put("9/b.png", same)
    put("loose.png", _enc(_noise(seed=12)))
    (tmp_path / "secret.png").write_bytes(_enc(_noise(seed=13)))
    os.symlink(tmp_path / "secret.png", landing / "3" / "link_out.png")
    os.symlink(tmp_path / "gone.png", landing / "3" / "dangling.png")
    os.mkfifo(landing / "3" / "pipe.png")

    result = ingest_landing(settings, run_id="r1", logical_date="2026-11-21", landing=landing)

    rejects = _rejects(settings)
    assert {name: r["reason_code"] for name, r in rejects.items()} == {
        "empty.png": "empty_file",
        "text.png": "not_an_image",
        "notes.txt": "bad_extension",
        "truncated.png": "corrupt_image",
        "truncated.jpg": "corrupt_image",
        "bomb.png": "too_many_pixels",
        "megabomb.png": "too_many_pixels",
        "tiny.png": "too_small",
        "huge.png": "too_large",
        "cmyk.jpg": "unsupported_mode",
        "animated.gif": "animated",
        "x.png": "unknown_label",
        "a.png": "label_conflict",
        "b.png": "label_conflict",
        "loose.png": "no_label",
        "link_out.png": "symlink_outside_landing",
        "dangling.png": "broken_symlink",
        "pipe.png": "not_a_file",
    }
    assert all(r["reason"] for r in rejects.values())
    assert "5000x5000 exceeds max_pixels" in rejects["bomb.png"]["reason"]
    assert "decompression bomb" in rejects["megabomb.png"]["reason"] and "3 frames" in rejects["animated.gif"]["reason"]
    assert rejects["a.png"]["sha256"] == rejects["b.png"]["sha256"]
    assert result.rejected == 18 and result.inserted == 20 + 5 and result.files_seen == 20 + 23

    raw = _raw(settings, result.raw_version)
    assert {r["mode"] for r in raw.values()} <= set(settings.ingest.stored_modes)
    assert raw["palette.png"]["mode"] == "RGB" and raw["palette.png"]["source_mode"] == "P"
    assert raw["rgba.png"]["mode"] == "RGB" and "alpha on black" in raw["rgba.png"]["normalised"]
    sixteen = raw["sixteen.png"]
    assert sixteen["mode"] == "L" and sixteen["source_mode"] == "I;16"
    assert Image.open(io.BytesIO(sixteen["image"])).getpixel((0, 0)) == 40000 >> 8  # scaled, not clipped to 255
    rot = raw["rotated.jpg"]
    assert (rot["width"], rot["height"], rot["format"], rot["source_format"]) == (16, 32, "PNG", "JPEG")
    assert rot["normalised"].startswith("exif_orientation=6")
    upright = Image.open(io.BytesIO(rot["image"])).convert("RGB")
    assert upright.getpixel((8, 2))[0] > 200 and upright.getpixel((8, 29))[2] > 200  # red band now on top
    assert decode(rot["image"], PreprocessSpec(1, 16)).shape == (1, 16, 16)
    unicode = raw["été avec espace.png"]
    assert unicode["normalised"] is None and unicode["source_uri"].endswith("/7/été avec espace.png")
    assert unicode["image"] == (landing / "7" / "été avec espace.png").read_bytes()  # untouched original

    again = ingest_landing(settings, run_id="r2", logical_date="2026-11-21", landing=landing)
    assert not again.committed and again.rejected == 18
    assert lake.open_table(settings.rejects_table).count() == 18  # recorded once, not per run


def test_manifest_labels_missing_files_and_traversal_are_quarantined(settings, tmp_path):
    landing = tmp_path / "landing"
    (landing / "batch").mkdir(parents=True)
    for i in range(3):
        (landing / "batch" / f"img {i}.png").write_bytes(_enc(_noise(seed=20 + i)))
    (tmp_path / "elsewhere.png").write_bytes(_enc(_noise(seed=30)))
    (landing / "labels.csv").write_text(
        "path,label\nbatch/img 0.png,1\nbatch/img 1.png,2\nbatch/img 2.png,2\nbatch/missing.png,3\n../elsewhere.png,4\n"
    )
    result = ingest_landing(settings, run_id="m1", logical_date="2026-11-21", landing=landing,
                            label_source="csv", manifest="labels.csv")
    assert (result.inserted, result.rejected, result.files_seen) == (3, 2, 5)
    assert result.label_source == "csv"
    raw = _raw(settings, result.raw_version)
    assert {k: r["label"] for k, r in raw.items()} == {"img 0.png": "1", "img 1.png": "2", "img 2.png": "2"}
    rejects = {r["reason_code"]: r for r in _rejects(settings).values()}
    assert set(rejects) == {"missing_file", "path_traversal"}
    assert rejects["missing_file"]["source_uri"].endswith("/batch/missing.png")

    (landing / "labels.jsonl").write_text('{"path": "batch/img 0.png", "label": "1"}\n{"path": "batch/img 9.png", "label": "1"}\n')
    jsonl = ingest_landing(settings, run_id="m2", logical_date="2026-11-22", landing=landing,
                           label_source="jsonl", manifest=str(landing / "labels.jsonl"))
    assert (jsonl.inserted, jsonl.already_present, jsonl.rejected) == (0, 1, 1)


def _drop_file_permission_override() -> None:
    """Child-process setup: root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH obeys file modes."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from the exec'd program's capabilities
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unreadable_file_is_quarantined_with_a_real_permission_error(settings, tmp_path, cd4ml_home):
    landing = tmp_path / "landing"
    (landing / "1").mkdir(parents=True)
    for i in range(2):
        (landing / "1" / f"ok{i}.png").write_bytes(_enc(_noise(seed=40 + i)))
    locked = landing / "1" / "locked.png"
    locked.write_bytes(_enc(_noise(seed=42)))
    locked.chmod(0)
    if os.geteuid() != 0:
        pytest.skip("runs as root in CI; a non-root user needs no capability trick")
    probe = subprocess.run(["cat", str(locked)], preexec_fn=_drop_file_permission_override, capture_output=True)
    if probe.returncode == 0:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here (no CAP_SETPCAP): root would read a 000 file")
    code = (
        "from tasks.data.ingest import ingest_landing; from tasks.settings import load_settings; "
        f"r = ingest_landing(load_settings(), 'perm', '2026-11-21', {str(landing)!r}); print(r.inserted, r.rejected)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], preexec_fn=_drop_file_permission_override, env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "1"]
    reject = _rejects(settings)["locked.png"]
    assert reject["reason_code"] == "unreadable" and "Permission denied" in reject["reason"]


def test_reingest_reads_only_changed_files(settings, tmp_path):
    landing = tmp_path / "landing"
    write_digits(landing, limit=40)
    first = ingest_landing(settings, run_id="i1", logical_date="2026-11-21", landing=landing)
    assert first.files_read == 40 and first.inserted == 40
    again = ingest_landing(settings, run_id="i2", logical_date="2026-11-22", landing=landing)
    assert (again.files_read, again.unchanged_skipped, again.already_present, again.committed) == (0, 40, 40, False)
    assert lake.current_version(settings.table_uri("ingest_manifest")) == 0  # nothing changed, nothing committed

    changed = next(iter(sorted(Path(landing).rglob("*.png"))))
    changed.write_bytes(_enc(_noise(seed=99)))
    (landing / "2" / "new.png").write_bytes(_enc(_noise(seed=98)))
    third = ingest_landing(settings, run_id="i3", logical_date="2026-11-23", landing=landing)
    assert (third.files_read, third.unchanged_skipped, third.inserted) == (2, 39, 2)
    assert third.raw_version == first.raw_version + 1


# ---------------------------------------------------------------- hostile input (issue 22)

def test_an_undecodable_name_and_a_png_with_200_mb_of_junk_are_quarantined_unread(settings, tmp_path):
    import tracemalloc

    from tests.factories.hostile import png_with_junk, undecodable

    landing = tmp_path / "landing"
    write_digits(landing, limit=20)
    with open(undecodable(landing / "3"), "wb") as fh:
        fh.write(_enc(_noise(seed=7)))
    bomb = png_with_junk(landing / "4" / "junk.png")  # a sparse hole: no disk, and Pillow decodes its 8x8
    assert bomb.stat().st_size > settings.ingest.max_file_bytes
    tracemalloc.start()
    try:
        result = ingest_landing(settings, run_id="hostile", logical_date="2026-11-22", landing=landing)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Before: the bad name ended the run (UnicodeEncodeError) and the junk was read and stored whole.
    assert peak < 64 << 20
    assert result.inserted == 20 and result.rejected == 2
    rejects = {r["reason_code"]: r for r in lake.scan(lake.open_table(settings.rejects_table)).to_pylist()}
    assert set(rejects) == {"undecodable_name", "file_too_large"}
    assert rejects["undecodable_name"]["source_uri"].endswith("/3/caf\\xe9.png")
    assert rejects["file_too_large"]["sha256"] is None  # decided from the listed size, never opened
    other = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"max_file_bytes": 1 << 20})})
    again = ingest_landing(other, run_id="hostile-2", logical_date="2026-11-23", landing=landing)
    assert not again.zone_unchanged  # a new limit is a new decision for the same listing


def test_a_file_that_grows_past_the_limit_after_the_listing_is_not_read_whole(tmp_path):
    from tasks.data.admission import read_bounded
    from tasks.data.sources import open_source
    from tests.factories.hostile import png, png_with_junk

    root = tmp_path / "landing"
    (root / "1").mkdir(parents=True)
    (root / "1" / "a.png").write_bytes(png())
    source = open_source(str(root))
    entry = next(iter(source.entries()))
    png_with_junk(root / "1" / "a.png", 10 << 20)  # grown since it was listed
    outcome = read_bounded(source, entry, 1 << 20)
    assert outcome.code == "file_too_large"
