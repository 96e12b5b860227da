"""Hostile inputs as a careless operator or an attacker would give them (issue 22), real files and a real server.

* ``watched_http_server``: a real HTTP server on 127.0.0.1 that counts the requests it gets, so a
  test can show that a refused ``http://`` location was never fetched.
* ``png_with_junk``: a valid 8x8 PNG followed by a sparse hole of junk (no disk, no memory spent),
  the file a decoder would accept and a plain ``read()`` would take whole.
* ``undecodable``: a file or folder name that is not valid UTF-8.
* ``deep_json`` / ``huge_field``: a JSON line nested 10,000 deep, a 200 kB field.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from PIL import Image

SECRET_LINE = "root:x:0:0:root:/root:/bin/bash"  # what /etc/passwd's first line looks like


def png(size: tuple[int, int] = (8, 8), value: int = 200) -> bytes:
    buf = io.BytesIO()
    Image.new("L", size, value).save(buf, format="PNG")
    return buf.getvalue()


def png_with_junk(path: Path, junk_bytes: int = 200 << 20) -> Path:
    """A valid 8x8 PNG, then ``junk_bytes`` of a sparse hole: Pillow decodes it, ``read()`` takes it all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.write(png())
        fh.truncate(fh.tell() + junk_bytes)
    return path


def undecodable(folder: Path, stem: bytes = b"caf\xe9", suffix: bytes = b".png") -> bytes:
    """The path (bytes) of a name in ``folder`` that is Latin-1, not UTF-8."""
    return os.fsencode(folder) + b"/" + stem + suffix


def deep_json(depth: int = 10_000) -> str:
    return "[" * depth + "]" * depth


def huge_field(n: int = 200_000) -> str:
    return "x" * n


class _Counting(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        body = b"path,label\n/etc/passwd,1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def watched_http_server() -> Iterator[tuple[str, list[str]]]:
    """(base URL, the list of paths requested so far) of a real server on 127.0.0.1."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.requests  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
