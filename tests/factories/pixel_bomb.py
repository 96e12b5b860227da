"""A decompression bomb: a valid PNG whose few hundred kB of zlib hold gigabytes of pixels when decoded."""

from __future__ import annotations

import struct
import zlib

from tasks.data.headers import PNG_SIGNATURE


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pixel_bomb_png(side: int = 12000, colour_type: int = 2) -> bytes:
    """A complete, decodable ``side`` x ``side`` 8-bit PNG of black (RGB by default), built row by row:
    making it never holds the pixels (Pillow would)."""
    channels = {0: 1, 2: 3}[colour_type]
    row = b"\x00" * (1 + side * channels)  # filter byte 0, then the row's samples
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, colour_type, 0, 0, 0)
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
