"""Decode and check one image's bytes: either facts about the image or a reject reason.

Pillow is the decoder. A file is accepted only after a full decode (``load()``), so a
truncated PNG or JPEG is caught here rather than in training.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image, ImageOps, UnidentifiedImageError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class ImageInfo:
    width: int
    height: int
    format: str
    mode: str


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


def inspect_image(data: bytes, *, min_side: int, max_side: int, max_pixels: int) -> ImageInfo | Rejection:
    if not data:
        return Rejection("empty_file", "file has zero bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as probe:
                width, height = probe.size
                fmt = probe.format or "unknown"
                if width * height > max_pixels:
                    return Rejection("too_many_pixels", f"{width}x{height} exceeds max_pixels {max_pixels}")
                probe.load()  # full decode: catches truncated files
                mode = probe.mode
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return Rejection("too_many_pixels", str(exc))
    except UnidentifiedImageError:
        fmt = sniff_format(data)
        if fmt:  # right signature, unparseable body: a damaged image, not some other file
            return Rejection("corrupt_image", f"{fmt} signature but the file cannot be parsed (truncated or damaged)")
        return Rejection("not_an_image", "bytes are not a known image format")
    except (OSError, SyntaxError, ValueError) as exc:
        return Rejection("corrupt_image", f"decode failed: {exc}")
    if min(width, height) < min_side:
        return Rejection("too_small", f"{width}x{height} is below min_side {min_side}")
    if max(width, height) > max_side:
        return Rejection("too_large", f"{width}x{height} is above max_side {max_side}")
    return ImageInfo(width=width, height=height, format=fmt, mode=mode)


def decode_gray(data: bytes, size: int) -> "Image.Image":
    """Decode to an upright single-channel image of ``size`` x ``size`` (model and drift input)."""
    with Image.open(io.BytesIO(data)) as img:
        img = ImageOps.exif_transpose(img)
        if img.mode in ("RGBA", "LA", "P"):
            img = img.convert("RGBA")
            background = Image.new("RGBA", img.size, (0, 0, 0, 255))
            img = Image.alpha_composite(background, img)
        gray = img.convert("L")
        if gray.size != (size, size):
            gray = gray.resize((size, size), Image.BILINEAR)
        return gray.copy()


def decode_batch(images: "list[bytes]", size: int) -> "np.ndarray":
    """Decode many images to a float32 array of shape (N, 1, size, size) scaled to [0, 1]."""
    import numpy as np

    out = np.empty((len(images), 1, size, size), dtype=np.float32)
    for i, data in enumerate(images):
        out[i, 0] = np.asarray(decode_gray(data, size), dtype=np.float32) / 255.0
    return out
