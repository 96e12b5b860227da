"""Untrusted input bounded and confined: the one place every entry point checks what it was given.

A landing source, a manifest, a scoring source and a feedback file are named by whoever runs a
command or triggers a DAG (its Params take the same values), and their bytes come from outside.
So, before anything is opened:

* **Schemes** (``check_scheme``): the URI schemes a location may use come from settings
  (``ingest.allowed_schemes`` for landing sources and manifests, ``serving.allowed_schemes`` for
  scoring sources and feedback files; a plain path is ``file``). The scheme is read with fsspec's
  own parser, every part of a chained URL (``simplecache::s3://...``) and ``data:`` URLs
  included, so what is checked is what fsspec would open. ``http://`` is never a default: a
  Param must not make a worker fetch from internal hosts.
* **Roots** (``confined``): a manifest must lie under the landing root and a feedback file under
  ``storage.feedback_uri``, after symlinks and ``..`` are resolved: a Param must not make a
  worker read ``/etc/passwd``.
* **Rows** (``bounded_lines``, ``csv_records``, ``json_object``): a manifest or feedback file is
  read a line at a time, each line at most ``max_bytes`` (a longer one is skipped unread, in
  chunks), decoded on its own (bad UTF-8 spoils that line only), and a JSON line nested deeper
  than ``MAX_JSON_DEPTH`` is refused before the parser recurses into it. What is wrong with a
  row is a ``BadRowError`` with a ``kind``; the caller records it as that row's reject and goes on.

No error here repeats the bytes it refused: a message names the location, the line, the kind of
problem and the settings key, never file content (it ends in logs, alerts and task pages).
"""

from __future__ import annotations

import csv
import json
import os
import posixpath
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any

from fsspec.core import split_protocol

from tasks.errors import DataError

# Manifest and feedback rows are flat objects; deeper nesting is never data, and json's C
# parser recurses once per level (10,000 levels end in RecursionError, not in a clear reject).
MAX_JSON_DEPTH = 32
_LOCAL = {"file", "local"}
_DRAIN = 1 << 16  # bytes per read while skipping the rest of an over-long line
_NOT_A_PROTOCOL = re.compile(".*[^a-z]+.*")  # fsspec's own test (core._un_chain) for a bare chained part


class InputRefusedError(DataError, ValueError):
    """A location that settings do not allow (scheme, or outside its root): refused before it is opened."""


class SchemeNotAllowedError(InputRefusedError):
    """The URI's scheme is not in the settings key that governs this kind of location."""

    def __init__(self, what: str, scheme: str, key: str, allowed: Iterable[str]) -> None:
        self.scheme, self.key, self.allowed = scheme, key, tuple(allowed)
        # The URI itself is not repeated: it may carry credentials (user:password@host).
        super().__init__(f"{what} uses the URI scheme {scheme!r}, which settings key {key} does not allow "
                         f"(allowed: {', '.join(self.allowed) or 'none'})")


class OutsideRootError(InputRefusedError):
    """The location resolves outside the root it must lie under."""

    def __init__(self, what: str, location: str, root: str) -> None:
        self.location, self.root = location, root
        super().__init__(f"{what} {location} lies outside {root} (after resolving links and '..'); "
                         f"it must be a file under that folder")


class BadRowError(DataError, ValueError):
    """One row of a manifest or feedback file cannot be used; ``kind`` says why (no content in it)."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind  # too_long | bad_encoding | too_deep | not_json | not_an_object | not_csv
        super().__init__(detail)


def schemes_of(uri: str) -> list[str]:
    """The scheme of every part of a (possibly chained) fsspec URL; a plain path is ``file``.

    Parsed as ``fsspec.core`` parses it: in a chain, a bare word (``simplecache::s3://...``) is a protocol.
    """
    uri = str(uri)
    parts = uri.split("::") if "::" in uri else [uri]
    out = []
    for part in parts:
        bare = len(parts) > 1 and "://" not in part and not _NOT_A_PROTOCOL.match(part)
        protocol = part if bare else split_protocol(part)[0]
        out.append("file" if protocol in (None, *_LOCAL) else str(protocol).lower())
    return out


def check_scheme(uri: str, allowed: Iterable[str], key: str, what: str) -> None:
    """Refuse ``uri`` unless every scheme in it is allowed by settings key ``key`` (module doc)."""
    permitted = {"file" if s in _LOCAL else s.lower() for s in allowed}
    for scheme in schemes_of(uri):
        if scheme not in permitted:
            raise SchemeNotAllowedError(what, scheme, key, sorted(permitted))


def is_local(uri: str) -> bool:
    return schemes_of(uri) == ["file"]


def local_path(uri: str) -> str:
    """The path of a local URI (``file:///x`` or ``/x``)."""
    return split_protocol(str(uri))[1] if "://" in str(uri) else str(uri)


def inside(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root.rstrip("/") + "/")


def confined(location: str, root: str, what: str) -> str:
    """The resolved path of ``location``, refused unless it lies under ``root`` (links and '..' resolved).

    Local locations are resolved on disk; object-store keys have no links, so '..' is normalised.
    """
    if is_local(location) and is_local(root):
        real, real_root = os.path.realpath(local_path(location)), os.path.realpath(local_path(root))
    else:
        real = posixpath.normpath(split_protocol(location)[1])
        real_root = posixpath.normpath(split_protocol(root)[1])
    if not inside(real, real_root):
        raise OutsideRootError(what, location, root)
    return real


def bounded_lines(handle: IO[bytes], max_bytes: int) -> Iterator[tuple[int, str | BadRowError]]:
    """(line number, text or what is wrong with it) of each line of a binary file, at most ``max_bytes`` each.

    A longer line is skipped in chunks (never held whole); a line that is not UTF-8 spoils itself only.
    """
    number = 0
    while True:
        raw = handle.readline(max_bytes + 1)
        if not raw:
            return
        number += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            while (chunk := handle.readline(_DRAIN)) and not chunk.endswith(b"\n"):
                pass
            yield number, BadRowError("too_long", f"line {number} is longer than {max_bytes} bytes")
            continue
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a byte-order mark, as spreadsheet tools write it
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, BadRowError("bad_encoding", f"line {number} is not UTF-8 text (byte {exc.start})")


def _depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside JSON strings."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def json_object(text: str, number: int, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """One JSONL line as an object, or ``BadRowError`` (too deep, not JSON, not an object)."""
    # Counting brackets is cheap; only a line with many of them is scanned for its real depth.
    if text.count("[") + text.count("{") > max_depth and _depth(text) > max_depth:
        raise BadRowError("too_deep", f"line {number}: JSON nested deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except RecursionError as exc:  # a bracket count fooled by strings cannot get here; kept as the last guard
        raise BadRowError("too_deep", f"line {number}: JSON nested too deep") from exc
    except ValueError as exc:  # JSONDecodeError, and an integer with more digits than Python converts
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "a number too long to convert"
        raise BadRowError("not_json", f"line {number}: not JSON: {reason}") from exc
    if not isinstance(value, dict):
        raise BadRowError("not_an_object", f"line {number}: a JSON {type(value).__name__}, not an object")
    return value


def jsonl_records(lines: Iterator[tuple[int, str | BadRowError]]) -> Iterator[tuple[int, dict[str, Any] | BadRowError]]:
    """(line number, object or what is wrong with it) for each non-blank line."""
    for number, text in lines:
        if isinstance(text, BadRowError):
            yield number, text
        elif text.strip():
            try:
                yield number, json_object(text, number)
            except BadRowError as exc:
                yield number, exc


def csv_records(lines: Iterator[tuple[int, str | BadRowError]]
                ) -> tuple[list[str], Iterator[tuple[int, dict[str, Any] | BadRowError]]]:
    """The header's column names and (line number, row or what is wrong with it) for each data row.

    A line ``bounded_lines`` refused reaches the CSV reader as an empty line (which it skips) and
    is reported in its place; a row the reader cannot parse is reported and the reader goes on.
    """
    refused: list[tuple[int, BadRowError]] = []
    current = [0]  # the physical line the reader took last (its own line_num lags after an error)

    def text() -> Iterator[str]:
        for number, line in lines:
            current[0] = number
            if isinstance(line, BadRowError):
                refused.append((number, line))
                yield "\n"
            else:
                yield line

    reader = csv.DictReader(text())
    try:
        header = [str(name) for name in (reader.fieldnames or ())]
    except csv.Error:
        header = []

    def records() -> Iterator[tuple[int, dict[str, Any] | BadRowError]]:
        while True:
            try:
                row: dict[str, Any] | BadRowError = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:  # csv's messages name the limit or the quote, never the field
                row = BadRowError("not_csv", f"line {current[0]}: not CSV: {exc}")
            while refused:
                yield refused.pop(0)
            yield current[0], row
        yield from refused

    return header, records()
