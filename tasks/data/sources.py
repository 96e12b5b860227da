"""Where images come from: a landing root (local path or any fsspec URL) and where labels come from.

``open_source(uri, label_source, manifest)`` returns a ``Source`` whose ``entries()`` streams
one ``Entry`` per candidate file, in a stable order, and whose ``read(entry)`` returns its bytes.

* Roots: a local path, ``file://``, or any fsspec protocol (``s3://``, ``gs://``, ``abfs://``,
  ``memory://``...) whose extra is installed (``s3fs``, ``gcsfs``, ``adlfs``); an unknown or
  uninstalled protocol is a ``SourceError`` naming the package to install. Credentials come from
  the environment as each fsspec backend reads them, never from settings. Only the schemes the
  caller's settings allow are opened (``tasks.data.inputs``: ``ingest.allowed_schemes``, local
  paths by default); any other is a ``SchemeNotAllowedError`` before anything is opened.
* ``Entry.uri`` (stored as ``source_uri``) is the fsspec URL of the file, not percent-encoded
  (``file:///landing/3/été 1.png``), so ``fsspec.open(source_uri)`` opens it again. Unicode and
  spaces in names are ordinary names.
* Labels, ``folders``: the first folder below the root (``<root>/<label>/.../<file>``). A file
  directly in the root has no label. Names starting with ``.`` (``.DS_Store``, ``.git``) are
  skipped: they are tool droppings, not candidates.
* Labels, ``csv`` / ``jsonl``: a manifest with ``path`` and ``label`` (other columns ignored).
  The manifest itself must lie under the root (links and ``..`` resolved: ``OutsideRootError``).
  Paths are relative to the manifest's folder; absolute paths and URLs are allowed only inside
  the root. Only files the manifest names are candidates. It is read a line at a time
  (``ingest.max_manifest_row_bytes`` each); a line too long, not UTF-8 or JSON nested too deep
  is that row's ``bad_manifest_row``, and the other rows go on.
* Size, modification time (ns) and, on object stores, the ETag come from the listing, so the
  ingest can tell an unchanged file without opening it.

Problems found while listing are not errors: the entry carries a ``Rejection`` (the ingest
records it in the rejects table and the batch goes on):

* ``path_traversal``: a manifest path with a ``..`` segment, wherever it would land: a label
  file that climbs directories is a mistake or an attack, never needed.
* ``outside_landing``: an absolute manifest path or URL outside the root.
* ``missing_file``: a manifest row naming a file that does not exist.
* ``bad_manifest_row``: a row without path or label, or a JSONL line that is not an object.
* ``symlink_outside_landing``: a symlink (file or folder) whose target resolves outside the
  root: the landing zone is the trust boundary, a link must not pull in ``/etc/passwd``.
  Links inside the root are followed (folder loops are walked once).
* ``broken_symlink``: a link whose target does not exist.
* ``not_a_file``: a FIFO, socket or device named like an image; it is never opened (reading a
  FIFO would block the ingest forever).
* ``undecodable_name``: a file or folder whose name is not valid UTF-8 (its URI shows the bad
  bytes as ``\\xNN``); a folder so named is not walked. Every table column is UTF-8, so such a
  name could not be stored, and it must not stop the rest of the batch.

``unreadable`` (permission denied, I/O error) is raised by ``read`` as ``OSError`` and turned
into a reject row by the ingest; ``read`` never returns more than ``max_bytes`` (a larger file is
``FileTooLargeError``, the caller's ``file_too_large``), whatever the listing said. Tests run as root, whom ``chmod 000`` does not stop, so the
permission test runs the ingest in a child process whose capability bounding set lacks
``CAP_DAC_OVERRIDE``/``CAP_DAC_READ_SEARCH`` (a real EACCES from the kernel).

A whole manifest that cannot be used (missing, no ``path``/``label`` header) is a
``SourceError`` (a ``DataError``): nothing can be ingested from it, and a retry cannot help. No
such error repeats the manifest's content.
"""

from __future__ import annotations

import itertools
import logging
import os
import posixpath
import stat
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Literal, NamedTuple

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import url_to_fs

from tasks.data import inputs
from tasks.data.images import Rejection
from tasks.errors import DataError
from tasks.settings import IngestSettings

log = logging.getLogger(__name__)

LabelSource = Literal["folders", "csv", "jsonl"]
LABEL_SOURCES: tuple[str, ...] = ("folders", "csv", "jsonl")
_LOCAL_PROTOCOLS = {"file", "local"}
_EXTRAS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs", "abfss": "adlfs"}


class SourceError(DataError, ValueError):
    """The source as a whole cannot be used (bad URL, missing root, unusable manifest)."""


class LandingNotAFolderError(SourceError, NotADirectoryError):
    """The landing path exists but is a file (or another non-folder)."""


class LandingNotFoundError(SourceError, FileNotFoundError):
    """The landing root does not exist (a wrong path will not fix itself on retry)."""


class FileTooLargeError(DataError, ValueError):
    """A file holds more bytes than the caller's limit: it is rejected, never read whole."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"file is larger than {limit} bytes")


def printable_name(name: str) -> str:
    """A name from ``os.listdir`` as UTF-8 text: bytes that are not UTF-8 shown as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _decodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.listdir gave the undecodable bytes back as lone surrogates
        return False
    return True


class Entry(NamedTuple):
    """One candidate file (a NamedTuple: a listing makes one per file, so it must be cheap)."""

    uri: str  # fsspec URL: the source_uri of every row about this file
    path: str  # the path the filesystem opens ("" when the entry names nothing openable)
    label: str | None
    size: int = -1  # -1: unknown (never trusted as "unchanged")
    mtime_ns: int = -1
    etag: str | None = None
    problem: Rejection | None = None


LISTING_SCHEMA = pa.schema([
    pa.field("uri", pa.string()), pa.field("path", pa.string()), pa.field("label", pa.string()),
    pa.field("size", pa.int64()), pa.field("mtime_ns", pa.int64()), pa.field("etag", pa.string()),
    pa.field("problem_code", pa.string()), pa.field("problem_detail", pa.string()),
])


def _listing_of(entries: Iterator[Entry], chunk_size: int = 16384) -> pa.Table:
    """Entries as ``LISTING_SCHEMA`` columns, transposed a chunk at a time (no per-file appends)."""
    chunks: list[pa.Table] = []
    while chunk := list(itertools.islice(entries, chunk_size)):
        columns = list(zip(*chunk))
        problems = columns[6]
        arrays = [pa.array(col, field.type) for col, field in zip(columns[:6], LISTING_SCHEMA)]
        arrays.append(pa.array([p.code if p else None for p in problems], pa.string()))
        arrays.append(pa.array([p.detail if p else None for p in problems], pa.string()))
        chunks.append(pa.Table.from_arrays(arrays, schema=LISTING_SCHEMA))
    return pa.concat_tables(chunks).combine_chunks() if chunks else LISTING_SCHEMA.empty_table()


def _first(pair: tuple) -> str:
    return pair[0]


def _rows(rows: list[tuple]) -> pa.Table:
    """(uri, path, label, size, mtime_ns, problem) tuples as a ``LISTING_SCHEMA`` table."""
    return _listing_of(iter([Entry(uri, path, label, size, mtime_ns, None, problem)
                             for uri, path, label, size, mtime_ns, problem in rows]))


def _folder_chunk(names: list[str], stats: list[os.stat_result], shown_prefix: str, real_prefix: str,
                  label: str | None) -> pa.Table:
    """One folder of regular files as listing columns, sorted by name, built by pyarrow."""
    name_array = pa.array(names, pa.string())
    order = pc.sort_indices(name_array)  # byte order of UTF-8 = code point order = sorted(names)
    name_array = name_array.take(order)
    n = len(names)
    return pa.Table.from_arrays([
        pc.binary_join_element_wise(shown_prefix, name_array, ""),
        pc.binary_join_element_wise(real_prefix, name_array, ""),
        pa.repeat(pa.scalar(label, pa.string()), n) if label is not None else pa.nulls(n, pa.string()),
        pa.array([st.st_size for st in stats], pa.int64()).take(order),
        pa.array([st.st_mtime_ns for st in stats], pa.int64()).take(order),
        pa.nulls(n, pa.string()), pa.nulls(n, pa.string()), pa.nulls(n, pa.string()),
    ], schema=LISTING_SCHEMA)


def _stat_folder(folder: str) -> tuple[list[str], list[os.stat_result | OSError], bool]:
    """Names (no dot files), their ``lstat`` (or the error), and whether all are regular files.

    ``fstatat`` on the open folder, so no path is walked from ``/`` per file. ``OSError``: the
    folder itself cannot be opened or listed.
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = [name for name in os.listdir(fd) if name[0] != "."]
        if not _decodable("".join(names)):  # one check per folder; the slow path names the culprits
            return names, [_stat_or_error(name, fd) for name in names], False
        stat_at, is_reg = os.stat, stat.S_ISREG
        try:
            stats: list[os.stat_result | OSError] = [stat_at(name, dir_fd=fd, follow_symlinks=False) for name in names]
            return names, stats, all(map(is_reg, [st.st_mode for st in stats]))  # type: ignore[union-attr]
        except OSError:  # a file vanished or cannot be looked at: say which, per file
            return names, [_stat_or_error(name, fd) for name in names], False
    finally:
        os.close(fd)


def _stat_or_error(name: str, fd: int) -> os.stat_result | OSError:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        return exc


def _fs_for(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    try:
        return url_to_fs(uri)
    except ImportError as exc:
        protocol = uri.split("://", 1)[0]
        extra = _EXTRAS.get(protocol, f"the fsspec backend for {protocol}://")
        raise SourceError(f"cannot open {uri}: install {extra} ({exc})") from exc
    except ValueError as exc:
        raise SourceError(f"cannot open {uri}: {exc}") from exc


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool(set(protocols) & _LOCAL_PROTOCOLS)


def _mtime_ns(info: dict[str, Any]) -> int:
    """Modification time from whatever key this fsspec backend uses; -1 when it gives none."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9) if value < 1e11 else int(value)  # seconds, or already ns
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
            except ValueError:
                continue
    return -1


def _etag(info: dict[str, Any]) -> str | None:
    for key in ("ETag", "etag", "md5Hash", "content_md5"):
        if info.get(key):
            return str(info[key]).strip('"')
    return None


class Source:
    """A landing root plus a label rule. Stateless between calls: ``entries()`` can run twice."""

    def __init__(self, uri: str, label_source: LabelSource = "folders", manifest: str | None = None, *,
                 allowed_schemes: Iterable[str] | None = None, schemes_key: str = "ingest.allowed_schemes",
                 max_row_bytes: int | None = None) -> None:
        defaults = IngestSettings()  # a caller without settings gets the defaults: local paths only
        self.allowed_schemes = tuple(defaults.allowed_schemes if allowed_schemes is None else allowed_schemes)
        self.schemes_key = schemes_key
        self.max_row_bytes = defaults.max_manifest_row_bytes if max_row_bytes is None else max_row_bytes
        inputs.check_scheme(str(uri), self.allowed_schemes, schemes_key, "the source")
        if label_source not in LABEL_SOURCES:
            raise SourceError(f"label_source must be one of {', '.join(LABEL_SOURCES)}, got {label_source!r}")
        if label_source != "folders" and not manifest:
            raise SourceError(f"label_source {label_source!r} needs a manifest (csv or jsonl file with path,label)")
        self.fs, root = _fs_for(str(uri))
        self.local = _is_local(self.fs)
        if self.local:
            root = os.path.realpath(root)  # the trust boundary, with its own links resolved
        self.root = root.rstrip("/") or "/"
        self.label_source = label_source
        if not self.fs.exists(self.root):
            raise LandingNotFoundError(f"landing folder {uri} does not exist")
        if not self.fs.isdir(self.root):
            raise LandingNotAFolderError(f"landing path {uri} is not a folder")
        self.manifest_uri = self._manifest_uri(manifest) if manifest else None

    # ------------------------------------------------------------------ naming

    @property
    def root_uri(self) -> str:
        return self.uri_of(self.root)

    def uri_of(self, path: str) -> str:
        if self.local:
            return "file://" + path  # what fsspec's unstrip_protocol gives, without its per-call cost
        return self.fs.unstrip_protocol(path)

    def _manifest_uri(self, manifest: str) -> str:
        """The manifest's URI, refused unless its scheme is allowed and it lies under the root."""
        if "://" in manifest or manifest.startswith("/"):
            inputs.check_scheme(manifest, self.allowed_schemes, self.schemes_key, "the manifest")
            if inputs.is_local(manifest) != self.local:
                raise inputs.OutsideRootError("the manifest", manifest, self.root_uri)
            location = manifest
        else:  # relative: inside the root (a '..' or a link out of it is refused the same way)
            location = self.uri_of(posixpath.join(self.root, manifest))
        if self.local:
            return self.uri_of(inputs.confined(location, self.root, "the manifest"))
        location = self.fs.unstrip_protocol(self.fs._strip_protocol(location))  # the root's own spelling
        return self.uri_of(inputs.confined(location, self.root_uri, "the manifest"))

    def _inside(self, path: str) -> bool:
        return inputs.inside(path, self.root)

    # ------------------------------------------------------------------ listing

    def entries(self) -> Iterator[Entry]:
        """Every candidate file, in a stable order (sorted paths; manifest order for manifests)."""
        if self.label_source != "folders":
            yield from self._manifest_entries()
        elif not self.local:
            yield from self._walk_remote()
        else:
            listing = self._walk_local()
            for uri, path, label, size, mtime_ns, _etag, code, detail in zip(
                    *(listing.column(name).to_pylist() for name in LISTING_SCHEMA.names)):
                yield Entry(uri, path, label, size, mtime_ns, None, Rejection(code, detail) if code else None)

    def listing(self) -> pa.Table:
        """``entries()`` as columns (``LISTING_SCHEMA``), in the same order: what the ingest plans with.

        A local folder walk builds the columns directly (no ``Entry`` per file): an unchanged
        landing zone is decided from this listing alone, so its cost is the re-ingest's cost.
        """
        if self.local and self.label_source == "folders":
            return self._walk_local()
        return _listing_of(self.entries())

    def _folder_label(self, rel: str) -> str | None:
        parts = rel.split("/")
        return parts[0] if len(parts) >= 2 else None

    def _walk_local(self) -> pa.Table:
        """The local folder walk, as a ``LISTING_SCHEMA`` table.

        One ``listdir`` per folder and one ``lstat`` per entry, nothing else for a regular file:
        ``lstat``'s mode tells files, folders and links apart, and its size and mtime are what
        the ingest's unchanged check needs. The ``lstat`` is an ``fstatat`` on the open folder
        (no path walk from ``/`` per file: ~8% of the walk). A folder of plain files becomes one
        Arrow chunk built in C (names sorted and joined to their URIs by pyarrow), so the walk
        costs little more than its ``lstat`` calls. Links (rare) take the slow path: resolved, checked against the
        root, and followed only when they stay inside it.
        """
        chunks: list[pa.Table] = []
        is_reg, is_dir, is_link = stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK
        visited = {self.root}
        stack = [(self.root, "")]
        while stack:
            real_dir, rel_dir = stack.pop()
            shown_dir = posixpath.join(self.root, rel_dir) if rel_dir else self.root
            label = rel_dir.split("/", 1)[0] if rel_dir else None  # the same for every file here
            try:
                names, stats, plain = _stat_folder(real_dir)
            except OSError as exc:
                chunks.append(_rows([(self.uri_of(shown_dir), "", label, -1, -1, Rejection(
                    "unreadable", f"cannot list folder: {exc.strerror or exc}"))]))
                continue
            real_prefix, shown_prefix = real_dir + "/", "file://" + shown_dir + "/"
            if plain:  # a folder of regular files: columns built by pyarrow, sorted by name
                if names:
                    chunks.append(_folder_chunk(names, stats, shown_prefix, real_prefix, label))  # type: ignore[arg-type]
                continue
            rows: list[tuple] = []
            subdirs: list[tuple[str, str]] = []
            for name, st in sorted(zip(names, stats), key=_first):
                uri, real = shown_prefix + name, real_prefix + name
                if not _decodable(name):
                    kind = "folder" if isinstance(st, os.stat_result) and is_dir(st.st_mode) else "file"
                    rows.append((shown_prefix + printable_name(name), "", label, -1, -1, Rejection(
                        "undecodable_name", f"the {kind} name is not valid UTF-8; rename it to ingest it")))
                elif isinstance(st, FileNotFoundError):
                    log.info("listing: %s vanished while the landing zone was listed", real)
                elif isinstance(st, OSError):
                    rows.append((uri, "", label, -1, -1, Rejection("unreadable", f"cannot stat file: {st.strerror or st}")))
                elif is_reg(st.st_mode):
                    rows.append((uri, real, label, st.st_size, st.st_mtime_ns, None))
                elif is_dir(st.st_mode):
                    visited.add(real)
                    subdirs.append((real, rel_dir + "/" + name if rel_dir else name))
                elif is_link(st.st_mode):
                    target = os.path.realpath(real)
                    if not os.path.exists(target):
                        rows.append((uri, "", label, -1, -1,
                                     Rejection("broken_symlink", f"symlink to {target}, which does not exist")))
                    elif not self._inside(target):
                        rows.append((uri, "", label, -1, -1, Rejection(
                            "symlink_outside_landing", f"symlink resolves to {target}, outside the landing root {self.root}")))
                    elif os.path.isdir(target):
                        if target not in visited:
                            visited.add(target)
                            subdirs.append((target, rel_dir + "/" + name if rel_dir else name))
                    else:
                        entry = self._local_file(shown_dir + "/" + name, target, label)
                        rows.append((entry.uri, entry.path, label, entry.size, entry.mtime_ns, entry.problem))
                else:
                    rows.append((uri, "", label, -1, -1,
                                 Rejection("not_a_file", "a FIFO, socket or device, not a regular file")))
            if rows:
                chunks.append(_rows(rows))
            stack.extend(reversed(subdirs))  # depth first, sorted: the same order every run
        return pa.concat_tables(chunks).combine_chunks() if chunks else LISTING_SCHEMA.empty_table()

    def _local_file(self, shown: str, real: str, label: str | None) -> Entry:
        uri = self.uri_of(shown)
        try:
            st = os.stat(real)
        except OSError as exc:
            return Entry(uri, "", label, problem=Rejection("unreadable", f"cannot stat file: {exc.strerror or exc}"))
        if not stat.S_ISREG(st.st_mode):
            kind = "folder" if stat.S_ISDIR(st.st_mode) else "FIFO, socket or device"
            return Entry(uri, "", label, problem=Rejection("not_a_file", f"a {kind}, not a regular file"))
        return Entry(uri, real, label, size=st.st_size, mtime_ns=st.st_mtime_ns)

    def _walk_remote(self) -> Iterator[Entry]:
        found = self.fs.find(self.root, detail=True, withdirs=False)
        for path in sorted(found):
            rel = path[len(self.root):].lstrip("/")
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            info = found[path]
            yield Entry(self.uri_of(path), path, self._folder_label(rel), size=int(info.get("size") or -1),
                        mtime_ns=_mtime_ns(info), etag=_etag(info))

    # ------------------------------------------------------------------ manifests

    def _manifest_rows(self) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
        """(line number, row or None, why not) for each data row of the manifest (``tasks.data.inputs``)."""
        assert self.manifest_uri is not None
        try:
            handle = fsspec.open(self.manifest_uri, "rb").open()
        except (FileNotFoundError, OSError) as exc:
            raise SourceError(f"manifest {self.manifest_uri} cannot be opened: {exc.strerror or type(exc).__name__}"
                              ) from exc
        with handle:
            lines = inputs.bounded_lines(handle, self.max_row_bytes)
            if self.label_source == "csv":
                header, records = inputs.csv_records(lines)
                missing = sorted({"path", "label"} - set(header))
                if missing:  # the header's own words are not repeated: the "manifest" may be any file
                    raise SourceError(f"manifest {self.manifest_uri} needs a header with path and label; "
                                      f"missing: {', '.join(missing)}")
            else:
                records = inputs.jsonl_records(lines)
            for number, row in records:
                if isinstance(row, inputs.BadRowError):
                    yield number, None, str(row).removeprefix(f"line {number}: ")
                else:
                    yield number, row, ""

    def _manifest_entries(self) -> Iterator[Entry]:
        assert self.manifest_uri is not None
        _, manifest_path = _fs_for(self.manifest_uri)
        base = posixpath.dirname(os.path.realpath(manifest_path) if self.local else manifest_path)
        for number, row, why in self._manifest_rows():
            where = f"{self.manifest_uri}#L{number}"
            if row is None:
                yield Entry(where, "", None, problem=Rejection("bad_manifest_row", f"line {number}: {why}"))
                continue
            raw_path, label = row.get("path"), row.get("label")
            label = str(label).strip() if label not in (None, "") else None
            if not isinstance(raw_path, str) or not raw_path.strip():
                yield Entry(where, "", label, problem=Rejection("bad_manifest_row", f"line {number}: no path"))
                continue
            if label is None:
                yield Entry(where, "", None, problem=Rejection("bad_manifest_row", f"line {number}: no label"))
                continue
            raw_path = raw_path.strip()
            if not _decodable(raw_path + label) or "\x00" in raw_path:  # JSON escapes can spell both
                yield Entry(where, "", None, problem=Rejection(
                    "bad_manifest_row", f"line {number}: path or label holds a NUL or a lone surrogate"))
                continue
            if ".." in raw_path.replace("\\", "/").split("/"):
                yield Entry(where, "", label, problem=Rejection(
                    "path_traversal", f"line {number}: path {raw_path!r} contains '..'; paths must stay inside the landing root"))
                continue
            if "://" in raw_path:
                fs, path = self._row_fs(raw_path)
                if fs is None or type(fs) is not type(self.fs):
                    yield Entry(where, "", label, problem=Rejection(
                        "outside_landing", f"line {number}: {raw_path} is on another filesystem than the landing root"))
                    continue
            elif raw_path.startswith("/"):
                path = raw_path
            else:
                path = posixpath.normpath(posixpath.join(base, raw_path))
            if self.local:
                path = os.path.abspath(path)
            if not self._inside(path):
                yield Entry(where, "", label, problem=Rejection(
                    "outside_landing", f"line {number}: {raw_path} resolves to {path}, outside the landing root {self.root}"))
                continue
            yield self._manifest_file(path, label, number)

    def _row_fs(self, raw_path: str) -> tuple[fsspec.AbstractFileSystem | None, str]:
        """The filesystem a manifest row's URL names; None when its scheme is not allowed or unknown (a row problem)."""
        try:
            inputs.check_scheme(raw_path, self.allowed_schemes, self.schemes_key, "a manifest row")
            return _fs_for(raw_path)
        except (inputs.SchemeNotAllowedError, SourceError):
            return None, ""

    def _manifest_file(self, path: str, label: str, number: int) -> Entry:
        uri = self.uri_of(path)
        if self.local:
            if not os.path.lexists(path):
                return Entry(uri, "", label, problem=Rejection("missing_file", f"manifest line {number} names a file that does not exist"))
            target = os.path.realpath(path)  # resolves links anywhere along the path, not only the last one
            if not os.path.exists(target):
                return Entry(uri, "", label, problem=Rejection("broken_symlink", f"symlink to {target}, which does not exist"))
            if not self._inside(target):
                return Entry(uri, "", label, problem=Rejection(
                    "symlink_outside_landing", f"symlink resolves to {target}, outside the landing root {self.root}"))
            return self._local_file(path, target, label)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return Entry(uri, "", label, problem=Rejection("missing_file", f"manifest line {number} names a file that does not exist"))
        if info.get("type") == "directory":
            return Entry(uri, "", label, problem=Rejection("not_a_file", "a folder, not a regular file"))
        return Entry(uri, path, label, size=int(info.get("size") or -1), mtime_ns=_mtime_ns(info), etag=_etag(info))

    # ------------------------------------------------------------------ reading

    def read(self, entry: Entry, max_bytes: int) -> bytes:
        """The file's bytes; ``OSError`` (permission, I/O) is the caller's ``unreadable``.

        At most ``max_bytes`` are kept: a file that grew after the listing (or whose size the
        listing did not know) is ``FileTooLargeError`` after ``max_bytes + 1`` bytes, not read whole.
        """
        if self.local:
            with open(entry.path, "rb") as fh:
                return read_at_most(fh, max_bytes, os.fstat(fh.fileno()).st_size)
        with self.fs.open(entry.path, "rb") as fh:
            return read_at_most(fh, max_bytes, entry.size)


_CHUNK = 1 << 20


def read_at_most(fh: Any, max_bytes: int, size_hint: int) -> bytes:
    """The rest of ``fh``, or ``FileTooLargeError`` once more than ``max_bytes`` came.

    ``read(n)`` allocates ``n`` bytes before it reads, so the first read asks for what the file
    holds (``size_hint``, +1 to see it grow), never for the limit; more comes in 1 MiB chunks.
    """
    chunks: list[bytes] = []
    total = 0
    want = min(size_hint, max_bytes) + 1 if size_hint >= 0 else _CHUNK
    while True:
        ask = min(want, max_bytes + 1 - total)
        chunk = fh.read(ask)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise FileTooLargeError(max_bytes)
        if len(chunk) < ask:  # end of file (a blocking read returns less only there)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        want = _CHUNK


def too_large(entry: Entry, max_bytes: int) -> Rejection | None:
    """``file_too_large`` from the listed size, before the file is opened (unknown size: ``read`` bounds it)."""
    if entry.size > max_bytes:
        return Rejection("file_too_large", f"{entry.size} bytes is above max_file_bytes {max_bytes}")
    return None


def open_source(uri: str, label_source: LabelSource = "folders", manifest: str | None = None, *,
                allowed_schemes: Iterable[str] | None = None, schemes_key: str = "ingest.allowed_schemes",
                max_row_bytes: int | None = None) -> Source:
    """A ``Source`` for a landing root (local path or fsspec URL) and a label rule (module doc).

    ``allowed_schemes`` is the value of settings key ``schemes_key`` (default: ingest's default,
    local paths only); ``max_row_bytes`` bounds a manifest line (default: ingest's default).
    """
    return Source(uri, label_source, manifest, allowed_schemes=allowed_schemes, schemes_key=schemes_key,
                  max_row_bytes=max_row_bytes)
