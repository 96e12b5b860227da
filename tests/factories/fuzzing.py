"""Fuzz targets for the parsers of untrusted bytes, shared by the suite's short run and bench/fuzz.py's long one.

Each ``check_*`` feeds one input to a parser and raises ``AssertionError`` on a finding: an
exception that is not one of the project's typed answers, or an answer the next step cannot
store (a string no UTF-8 column can hold). A hang is the runner's to see (hypothesis' deadline
in the suite, the slowest input in the benchmark), and so is memory (tracemalloc in the benchmark).

Inputs (``hypothesis`` strategies): arbitrary bytes, and valid files of every kind the readers
meet (PNG in every bit depth and colour type, APNG, JPEG in L/RGB/CMYK, GIF, BMP, TIFF, WebP,
CSV and JSONL manifest and feedback rows) with random bytes set, inserted, deleted or cut.
"""

from __future__ import annotations

import io
import struct
import zlib
from functools import lru_cache
from pathlib import Path

from hypothesis import strategies as st
from PIL import Image

from tasks.data.headers import JPEG_MODES, PNG_MODES, Header, fast_header, jpeg_header, png_header
from tasks.data.images import PreparedImage, Rejection, prepare_image, screen
from tasks.data.sources import SourceError, open_source
from tasks.serving.feedback import FeedbackError, feedback_rows

ROW_BYTES = 256  # small, so that over-long lines are met often
SCREEN_RULES = {"min_side": 8, "max_side": 4096, "max_pixels": 16_777_216}
PREPARE_RULES = {**SCREEN_RULES, "max_pixels": 1 << 20}  # a full decode per input: keep each one small
# Findings of bench/fuzz.py, kept as fixed inputs of the suite's run: a damaged 9x9 GIF whose frame
# count raised TypeError inside Pillow (10.3), ending a whole ingest or scoring run.
FINDINGS = (bytes.fromhex(
    "474946383761090009008100000a0a0a0000000000000000002c00000000090009000008110001081c48b0a0c18308132a5cc87060"
    "400021f9000401000001002c0000000000090009000081c8c8c800000000000000000008110001081c48b0a0c18308132a5cc87060"
    "40003b"),)
_MODES = set(PNG_MODES.values()) | set(JPEG_MODES.values())


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(depth: int, colour: int, width: int = 5, height: int = 3, extra: bytes = b"") -> bytes:
    """A valid PNG of any bit depth and colour type, written by hand (Pillow cannot write them all);
    ``extra`` chunks go between the header and the pixels."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    row = (width * channels * depth + 7) // 8
    raw = b"".join(b"\x00" + bytes(i % 256 for i in range(row)) for _ in range(height))
    body = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
    if colour == 3:
        body += _chunk(b"PLTE", bytes(range(48)))
    return b"\x89PNG\r\n\x1a\n" + body + extra + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def _saved(mode: str, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (9, 9), 100 if mode in ("L", "P", "1", "I;16") else (100,) * len(mode)).save(buf, format=fmt, **kw)
    return buf.getvalue()


@lru_cache(maxsize=1)
def image_seeds() -> tuple[bytes, ...]:
    """Valid images of every kind the header readers and Pillow's lazy open meet."""
    seeds = [png(depth, colour) for depth, colour in sorted(PNG_MODES)]
    frames = [Image.new("L", (9, 9), v) for v in (10, 200)]
    apng = io.BytesIO()
    frames[0].save(apng, format="PNG", save_all=True, append_images=frames[1:])
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    seeds += [apng.getvalue(), gif.getvalue(), _saved("L", "JPEG"), _saved("RGB", "JPEG"), _saved("CMYK", "JPEG"),
              _saved("RGB", "JPEG", progressive=True), _saved("L", "BMP"), _saved("RGB", "TIFF"),
              _saved("RGB", "WEBP"), _saved("P", "GIF")]
    return tuple(seeds)


MANIFEST_SEEDS = (
    b'path,label\nx/a.png,3\n"x/b c.png",4\n../../etc/passwd,1\n/etc/passwd,2\nmemory://x/a.png,5\n',
    b'{"path": "x/a.png", "label": "3"}\n{"path": "x/\\u0000.png", "label": 4}\n[1, 2]\n{"path": "\\ud800"}\n',
)
FEEDBACK_SEEDS = (
    b"image_key,label\n" + b"ab" * 32 + b",3\npath,label\nx.png,\n,4\n",
    b'{"image_key": "' + b"cd" * 32 + b'", "label": "3"}\n{"image": "x.png", "label": {"a": [1]}}\n{"label": "\\ud800"}\n',
)


def _edit(seed: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(seed)
    for kind, where, value in edits:
        at = where % (len(data) + 1)
        if kind == "set" and data:
            data[at % len(data)] = value
        elif kind == "insert":
            data[at:at] = bytes([value]) * (1 + value % 7)
        elif kind == "delete":
            del data[at:at + 1 + value % 16]
        elif kind == "cut":
            del data[at:]
    return bytes(data)


def mutated(seeds: tuple[bytes, ...]) -> st.SearchStrategy[bytes]:
    """A seed with random bytes set, inserted, deleted or cut off."""
    edits = st.lists(st.tuples(st.sampled_from(["set", "insert", "delete", "cut"]), st.integers(0, 1 << 16),
                               st.integers(0, 255)), max_size=8)
    return st.tuples(st.sampled_from(seeds), edits).map(lambda pair: _edit(*pair))


def image_inputs() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=512), mutated(image_seeds()))


_FRAGMENTS = st.sampled_from([b"path", b"label", b"image_key", b"image", b",", b'"', b"\n", b"\r\n", b"\x00", b"\xff",
                              b"{", b"}", b"[" * 40, b"]", b":", b'\\ud800', b"../", b"/etc/passwd", b"x/a.png",
                              b"http://127.0.0.1:9/x", b"memory://x", b"x" * 300, b"1" * 5000])


def text_inputs(seeds: tuple[bytes, ...]) -> st.SearchStrategy[bytes]:
    """Rows as an attacker writes them: fragments of real rows, arbitrary bytes, mutated real files."""
    pieces = st.lists(st.one_of(_FRAGMENTS, st.binary(max_size=64)), max_size=40).map(b"".join)
    return st.one_of(pieces, st.binary(max_size=1024), mutated(seeds))


def check_headers(data: bytes) -> None:
    """The struct readers answer a ``Header`` or None, never an exception."""
    for reader in (fast_header, png_header, jpeg_header):
        header = reader(data)
        assert header is None or (isinstance(header, Header) and header.width > 0 and header.height > 0
                                  and header.mode in _MODES and header.frames >= 0), (reader.__name__, header)


def check_screen(data: bytes) -> None:
    """Scoring's header screen (struct readers, else Pillow's lazy open) answers a ``Rejection`` or None."""
    outcome = screen(data, **SCREEN_RULES)
    assert outcome is None or isinstance(outcome, Rejection), outcome


def check_prepare(data: bytes) -> None:
    """Ingest's full decode answers a ``PreparedImage`` or a ``Rejection``."""
    outcome = prepare_image(data, **PREPARE_RULES)
    assert isinstance(outcome, (PreparedImage, Rejection)), outcome


def check_manifest(root: Path, data: bytes, kind: str) -> None:
    """A manifest of any bytes lists as rows (problems included) Arrow can hold, or is one ``SourceError``."""
    (root / f"m.{kind}").write_bytes(data)
    try:
        listing = open_source(str(root), kind, f"m.{kind}", max_row_bytes=ROW_BYTES).listing()  # type: ignore[arg-type]
    except SourceError:
        return
    assert listing.num_rows >= 0


def check_feedback(path: Path, data: bytes) -> None:
    """A feedback file of any bytes gives rows whose text a table can hold, or is one ``FeedbackError``."""
    path.write_bytes(data)
    try:
        rows = list(feedback_rows(str(path), ROW_BYTES))
    except FeedbackError:
        return
    for row in rows:
        for text in (row.reference, row.label, row.problem):
            assert text is None or (text.encode("utf-8") is not None and "\x00" not in text), row
