"""The struct header reader agrees with Pillow on every PNG and JPEG mode, and defers to Pillow when unsure.

Run again on every Pillow upgrade (requirements.txt): every mode ingest keeps or converts, in
every format Pillow writes it to, is read the same by the header reader and by Pillow, and
ingest stores it as L or RGB with its pixels.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tasks.data.headers import PNG_MODES, fast_header
from tasks.data.images import CONVERT_MODES, KEEP_MODES, PreparedImage, prepare_image, screen
from tests.factories.fuzzing import png


def _pillow(data: bytes) -> tuple[str, int, int, str, int]:
    with Image.open(io.BytesIO(data)) as img:
        frames = getattr(img, "n_frames", 1) if getattr(img, "is_animated", False) else 1
        return img.format, img.size[0], img.size[1], img.mode, frames


@pytest.mark.parametrize("depth,colour", sorted(PNG_MODES))
def test_every_png_depth_and_colour_type_reads_as_pillow_does(depth, colour):
    data = png(depth, colour)
    assert fast_header(data) == _pillow(data)


def _orientation(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def _saved(mode: str, fmt: str, **kw) -> bytes:
    rng = np.random.default_rng(0)
    if mode in ("1", "L", "P"):
        img = Image.fromarray(rng.integers(0, 255, (21, 34), dtype=np.uint8), "L").convert(mode)
    else:
        img = Image.fromarray(rng.integers(0, 255, (21, 34, 3), dtype=np.uint8), "RGB").convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


CASES = {
    "png-1": _saved("1", "PNG"), "png-L": _saved("L", "PNG"), "png-P": _saved("P", "PNG"),
    "png-P-transparent": _saved("P", "PNG", transparency=0), "png-LA": _saved("LA", "PNG"),
    "png-RGB": _saved("RGB", "PNG"), "png-RGBA": _saved("RGBA", "PNG"), "png-I16": _saved("I;16", "PNG"),
    "png-interlaced": _saved("RGB", "PNG", optimize=False),
    "jpeg-L": _saved("L", "JPEG"), "jpeg-RGB": _saved("RGB", "JPEG", quality=90),
    "jpeg-CMYK": _saved("CMYK", "JPEG"), "jpeg-progressive": _saved("RGB", "JPEG", progressive=True),
    "jpeg-exif": _saved("RGB", "JPEG", exif=_orientation(6)),
    "jpeg-restart": _saved("RGB", "JPEG", restart_marker_blocks=1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_files_pillow_wrote_read_the_same(name):
    data = CASES[name]
    assert fast_header(data) == _pillow(data)


def test_animated_png_counts_its_frames():
    frames = [Image.new("RGB", (9, 9), (i * 40, 0, 0)) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:])
    data = buf.getvalue()
    assert fast_header(data) == _pillow(data) == ("PNG", 9, 9, "RGB", 3)
    assert screen(data, min_side=8, max_side=4096, max_pixels=10**7).code == "animated"


def test_doubt_goes_to_pillow_and_the_verdicts_stay_ingests():
    mpo = io.BytesIO()
    Image.new("RGB", (16, 16)).save(mpo, format="MPO", save_all=True, append_images=[Image.new("RGB", (16, 16))])
    assert fast_header(mpo.getvalue()) is None  # Pillow opens a multi-picture JPEG as frames
    assert screen(mpo.getvalue(), min_side=8, max_side=4096, max_pixels=10**7).code == "animated"
    cut = CASES["png-RGB"][:20]
    assert fast_header(cut) is None and screen(cut, min_side=1, max_side=99, max_pixels=10**7).code == "corrupt_image"
    assert fast_header(b"GIF89a....") is None and fast_header(b"") is None
    rules = {"min_side": 8, "max_side": 30, "max_pixels": 10**7}
    for name, data in CASES.items():  # ingest's verdicts: 34x21 is too large for max_side 30, CMYK unsupported
        expected = "unsupported_mode" if "CMYK" in name else "too_large"
        assert screen(data, **rules).code == expected, name
    assert screen(png(16, 2, 3000, 3000), min_side=8, max_side=4096, max_pixels=10**6).code == "too_many_pixels"


def _written(mode: str, fmt: str) -> bytes | None:
    """A 12x9 image of ``mode`` with a known first pixel, as Pillow writes it in ``fmt`` (None: it cannot)."""
    if mode.startswith("I"):
        img = Image.new(mode, (12, 9), 0)
        img.putpixel((0, 0), 40000)
    elif mode == "PA":
        img = Image.new("RGBA", (12, 9), (200, 100, 50, 255)).convert("PA")
    else:
        img = Image.new("RGB", (12, 9), (200, 100, 50)).convert(mode)
    buf = io.BytesIO()
    try:
        img.save(buf, format=fmt)
    except (OSError, KeyError, ValueError):
        return None
    return buf.getvalue()


def test_every_mode_ingest_takes_reads_the_same_and_is_stored_as_l_or_rgb():
    rules = {"min_side": 8, "max_side": 64, "max_pixels": 10**6}
    covered = set()
    for mode in (*KEEP_MODES, *CONVERT_MODES):
        for fmt in ("PNG", "TIFF", "JPEG", "BMP", "WEBP"):
            data = _written(mode, fmt)
            if data is None:
                continue
            covered.add(mode)
            header = fast_header(data)
            assert header is None or header == _pillow(data), (mode, fmt)
            assert screen(data, **rules) is None, (mode, fmt)
            stored = prepare_image(data, **rules)
            assert isinstance(stored, PreparedImage) and stored.mode in ("L", "RGB"), (mode, fmt, stored)
            assert stored.source_mode == _pillow(data)[3] and (stored.width, stored.height) == (12, 9)
            with Image.open(io.BytesIO(stored.data)) as back:
                first = back.getpixel((0, 0))
            if stored.source_mode.startswith("I"):  # 16-bit: the high byte, scaled rather than clipped
                assert first == 40000 >> 8, (mode, fmt, first)
            elif fmt in ("PNG", "TIFF", "BMP"):  # lossless, opaque: the pixel as Pillow converts it
                with Image.open(io.BytesIO(data)) as src:
                    assert first == src.convert(stored.mode).getpixel((0, 0)), (mode, fmt, first)
    assert covered == {*KEEP_MODES, *CONVERT_MODES}
    cmyk = _written("CMYK", "JPEG")
    assert screen(cmyk, **rules).code == prepare_image(cmyk, **rules).code == "unsupported_mode"
