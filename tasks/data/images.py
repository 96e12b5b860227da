"""Decode and check one image's bytes: either facts about the image or a reject reason.

Pillow is the decoder. A file is accepted only after a full decode (``load()``), so a
truncated PNG or JPEG is caught here rather than in training.

``prepare_image`` is what ingest stores. Its rules, in order (first match wins):

* ``empty_file``: zero bytes. ``not_an_image``: no known image signature and Pillow cannot
  parse it (a text file named ``.png``). ``corrupt_image``: an image signature but a failed
  parse or full decode (truncated PNG/JPEG, damaged body).
* ``too_many_pixels``: width x height above ``max_pixels`` (checked from the header, before
  decoding: the decompression-bomb guard; Pillow's own bomb error lands here too).
* ``animated``: more than one frame (animated GIF, APNG, WebP): a still-image dataset cannot
  say which frame carries the label.
* ``too_small`` / ``too_large``: a side below ``min_side`` or above ``max_side``.
* ``unsupported_mode``: a mode neither kept nor converted (CMYK by default: converting it
  faithfully needs an ICC profile, so it is fixed upstream rather than guessed here).

An accepted image is stored untouched when it is already upright (no EXIF orientation) and in
a kept mode (``L``, ``RGB``). Otherwise the pixels are normalised once, here, and stored as a
lossless PNG: EXIF orientation applied (``ImageOps.exif_transpose``), ``1`` -> ``L``,
``P``/``PA``/``RGBA`` -> ``RGB`` and ``LA`` -> ``L`` (alpha composited on black, as
the model's preprocessing does), 16-bit ``I;16*``/``I`` -> ``L`` by keeping the high byte
(Pillow's own conversion clips at 255, which would turn a 16-bit image white), ``CMYK`` ->
``RGB`` only when configured. ``source_format``, ``source_mode`` and ``normalised`` record
what the file was and what was done, so the raw table's ``mode`` only ever holds kept modes.
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from tasks.data.headers import fast_header


@dataclass(frozen=True)
class Rejection:
    code: str  # short, stable, groupable: "not_an_image", "truncated", ...
    detail: str


_SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}


def sniff_format(data: bytes) -> str | None:
    """The image format a file's leading bytes claim, if any."""
    for magic, name in _SIGNATURES.items():
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


@dataclass(frozen=True)
class PreparedImage:
    """An accepted image as ingest stores it: ``data`` is the original bytes unless ``normalised``."""

    data: bytes
    width: int
    height: int
    format: str
    mode: str
    source_format: str
    source_mode: str
    normalised: str | None  # what was done ("exif_orientation=6; RGBA->RGB"), None = untouched


_ORIENTATION_TAG = 0x0112
KEEP_MODES = ("L", "RGB")  # the settings' defaults (ingest.keep_modes / convert_modes)
CONVERT_MODES = ("1", "P", "PA", "LA", "RGBA", "I;16", "I;16B", "I;16L", "I")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _to_kept_mode(img: "Image.Image", mode: str) -> tuple["Image.Image", str]:
    """Convert a convertible mode to L or RGB; the step is described for the ``normalised`` column."""
    if mode == "1":
        return img.convert("L"), "1->L"
    if mode in ("P", "PA", "RGBA", "RGBa", "LA"):
        target = "L" if mode == "LA" else "RGB"
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        alpha = mode != "P" or "transparency" in img.info
        step = f"{mode}->{target}" + (" (alpha on black)" if alpha else "")
        return Image.alpha_composite(background, rgba).convert(target), step
    if mode in _SIXTEEN_BIT:
        import numpy as np

        arr = np.asarray(img)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 65535):
            raise ValueError(f"mode {mode} holds values outside 0..65535: not a 16-bit image")
        return Image.fromarray((arr.astype(np.uint32) >> 8).astype(np.uint8), mode="L"), f"{mode}->L (high byte)"
    if mode == "CMYK":
        return img.convert("RGB"), "CMYK->RGB (no ICC profile)"
    raise ValueError(f"no conversion from mode {mode}")


def _frames(img: "Image.Image") -> int:
    return getattr(img, "n_frames", 1) if getattr(img, "is_animated", False) else 1


def _header_rejection(width: int, height: int, fmt: str, frames: int, max_pixels: int) -> Rejection | None:
    """The checks a header answers: too many pixels (before any decode), more than one frame."""
    if width * height > max_pixels:
        return Rejection("too_many_pixels", f"{width}x{height} exceeds max_pixels {max_pixels}")
    if frames > 1:
        return Rejection("animated", f"animated {fmt} with {frames} frames; only still images are accepted")
    return None


def _mode_rejection(mode: str, keep: frozenset[str] | set[str], convert: frozenset[str] | set[str]) -> Rejection | None:
    if mode not in keep and mode not in convert:
        return Rejection("unsupported_mode", f"mode {mode} is neither kept {sorted(keep)} nor converted {sorted(convert)}")
    return None


def _side_rejection(width: int, height: int, min_side: int, max_side: int) -> Rejection | None:
    if min(width, height) < min_side:
        return Rejection("too_small", f"{width}x{height} is below min_side {min_side}")
    if max(width, height) > max_side:
        return Rejection("too_large", f"{width}x{height} is above max_side {max_side}")
    return None


def _open_failure(exc: BaseException, data: bytes) -> Rejection:
    """What an exception from opening or decoding an image means, as a reject reason."""
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return Rejection("too_many_pixels", str(exc))
    if isinstance(exc, UnidentifiedImageError):
        sniffed = sniff_format(data)
        if sniffed:
            return Rejection("corrupt_image", f"{sniffed} signature but the file cannot be parsed (truncated or damaged)")
        return Rejection("not_an_image", "bytes are not a known image format")
    return Rejection("corrupt_image", f"decode failed (truncated or damaged): {exc}")


# Pillow's parsers, fed damaged bytes, also fail with the second line's types: bench/fuzz.py found a
# 109-byte GIF whose frame count raises TypeError in ``is_animated`` (Pillow 10.3), which ended a
# whole ingest or scoring run. They say something about the bytes, so the file is corrupt_image.
_OPEN_ERRORS = (Image.DecompressionBombError, Image.DecompressionBombWarning, UnidentifiedImageError,
                OSError, SyntaxError, ValueError, EOFError,
                TypeError, IndexError, KeyError, ZeroDivisionError, struct.error)


@contextmanager
def _opened(data: bytes) -> Iterator["Image.Image"]:
    """Pillow's lazy open of ``data`` (header only) with its decompression-bomb warning as an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data)) as img:
            yield img


def screen(
    data: bytes,
    *,
    min_side: int,
    max_side: int,
    max_pixels: int,
    keep_modes: Iterable[str] = KEEP_MODES,
    convert_modes: Iterable[str] = CONVERT_MODES,
) -> Rejection | None:
    """Ingest's rules that the header decides, without decoding the pixels (scoring screens with this).

    The same codes and order as ``prepare_image``; a body that is truncated or damaged is only
    found by decoding it, which the scorer's model does (and reports as ``corrupt_image``).
    """
    if not data:
        return Rejection("empty_file", "file has zero bytes")
    keep = keep_modes if isinstance(keep_modes, frozenset) else frozenset(keep_modes)  # a scorer passes them once
    convert = convert_modes if isinstance(convert_modes, frozenset) else frozenset(convert_modes)
    header = fast_header(data)  # PNG and JPEG without Pillow (tasks/data/headers.py); None: Pillow decides
    if header is not None:
        return (_header_rejection(header.width, header.height, header.format, header.frames, max_pixels)
                or _mode_rejection(header.mode, keep, convert)
                or _side_rejection(header.width, header.height, min_side, max_side))
    try:
        with _opened(data) as img:
            return (_header_rejection(*img.size, img.format or "unknown", _frames(img), max_pixels)
                    or _mode_rejection(img.mode, keep, convert)
                    or _side_rejection(*img.size, min_side, max_side))
    except _OPEN_ERRORS as exc:
        return _open_failure(exc, data)


def prepare_image(
    data: bytes,
    *,
    min_side: int,
    max_side: int,
    max_pixels: int,
    keep_modes: Iterable[str] = KEEP_MODES,
    convert_modes: Iterable[str] = CONVERT_MODES,
) -> PreparedImage | Rejection:
    """Check one file's bytes and return what ingest stores, or why it is rejected (module doc)."""
    if not data:
        return Rejection("empty_file", "file has zero bytes")
    keep, convert = set(keep_modes), set(convert_modes)
    try:
        with _opened(data) as img:
            width, height = img.size
            fmt = img.format or "unknown"
            header = _header_rejection(width, height, fmt, _frames(img), max_pixels)
            if header is not None:
                return header
            img.load()  # full decode: catches truncated files
            source_mode = img.mode
            orientation = img.getexif().get(_ORIENTATION_TAG, 1)
            unsupported = _mode_rejection(source_mode, keep, convert)
            if unsupported is not None:
                return unsupported
            steps: list[str] = []
            out = img
            if orientation not in (1, None) and orientation in range(2, 9):
                out = ImageOps.exif_transpose(out)
                steps.append(f"exif_orientation={orientation}")
            if source_mode not in keep:
                try:
                    out, step = _to_kept_mode(out, source_mode)
                except ValueError as exc:
                    return Rejection("unsupported_mode", str(exc))
                steps.append(step)
            width, height = out.size
            sides = _side_rejection(width, height, min_side, max_side)
            if sides is not None:
                return sides
            if not steps:
                return PreparedImage(data, width, height, fmt, source_mode, fmt, source_mode, None)
            buf = io.BytesIO()
            out.save(buf, format="PNG", compress_level=6)
            return PreparedImage(buf.getvalue(), width, height, "PNG", out.mode, fmt, source_mode, "; ".join(steps))
    except _OPEN_ERRORS as exc:
        return _open_failure(exc, data)
