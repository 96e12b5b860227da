"""What a PNG or JPEG header says (size, Pillow's mode, frames), read with ``struct`` instead of Pillow.

Scoring screens every file with ingest's header rules before the model decodes it
(``tasks.data.images.screen``); Pillow's lazy open costs about 18 us a file, as much as all the
rest of the scorer's own work (bench/score.py). These two formats cover almost every file, and
their headers are simple: PNG's IHDR chunk (and an ``acTL`` chunk before the image data for
APNG), JPEG's first start-of-frame segment. Anything unusual returns None and the caller asks
Pillow: 12-bit JPEG, an MPO (a JPEG with an ``MPF`` segment: Pillow opens it as several frames),
a header cut short, a chunk that is not where it should be. The mode is Pillow's name for it
(``PngImagePlugin._MODES``; JPEG by component count), and tests compare every answer with
Pillow's on files Pillow wrote in every mode.

A broken body is not seen here (nor by Pillow's lazy open): the model's decode finds it.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# (bit depth, colour type) -> Pillow's mode (PngImagePlugin._MODES, Pillow 10.3)
PNG_MODES = {(1, 0): "1", (2, 0): "L", (4, 0): "L", (8, 0): "L", (16, 0): "I;16", (8, 2): "RGB", (16, 2): "RGB",
             (1, 3): "P", (2, 3): "P", (4, 3): "P", (8, 3): "P", (8, 4): "LA", (16, 4): "RGBA", (8, 6): "RGBA",
             (16, 6): "RGBA"}
JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM and RST0..7: markers without a length


class Header(NamedTuple):
    format: str
    width: int
    height: int
    mode: str
    frames: int


def png_header(data: bytes) -> Header | None:
    """IHDR (size, mode) and acTL (frames) of a PNG; None when Pillow should decide."""
    if len(data) < 33 or not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    mode = PNG_MODES.get((depth, colour))
    if mode is None or width == 0 or height == 0:
        return None
    frames, pos = 1, 33
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IDAT":
            return Header("PNG", width, height, mode, frames)
        if kind == b"acTL":
            if length < 8 or pos + 16 > len(data):
                return None
            frames = struct.unpack_from(">I", data, pos + 8)[0]
        pos += 12 + length
    return None  # no image data where it should be: Pillow says what is wrong


def jpeg_header(data: bytes) -> Header | None:
    """The first start-of-frame segment of a JPEG (size, mode); None when Pillow should decide."""
    if not data.startswith(b"\xff\xd8"):
        return None
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if length < 2:
            return None
        segment = pos + 4
        if marker == 0xE2 and data[segment:segment + 4] == b"MPF\x00":
            return None  # multi-picture JPEG: Pillow counts its frames
        if marker in _SOF:
            if segment + 6 > end:
                return None
            precision, height, width, components = struct.unpack_from(">BHHB", data, segment)
            mode = JPEG_MODES.get(components)
            if precision != 8 or mode is None or width == 0 or height == 0:
                return None
            return Header("JPEG", width, height, mode, 1)
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        pos += 2 + length
    return None


def fast_header(data: bytes) -> Header | None:
    """The header of a PNG or JPEG, or None for every other file and every doubt."""
    if data[:8] == PNG_SIGNATURE:
        return png_header(data)
    if data[:2] == b"\xff\xd8":
        return jpeg_header(data)
    return None
