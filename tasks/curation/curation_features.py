"""Per-image curation features, computed once per image and kept in the ``curation_embeddings`` table.

A feature row is everything curation needs to know about one image's pixels:

* ``pixel_digest``: sha256 of the decoded pixels (exact duplicates that differ in encoding);
* ``embedding``: the vector near-duplicates are found with, by ``curation.embedding``:
  ``pixels`` = the grey pixels area-averaged (``BOX``) to ``feature_size`` px, mean-centred and
  L2-normalised (cosine = pixel correlation; area averaging maps a copy upscaled by an integer
  factor back to the same numbers, where bilinear drops it to ~0.97); ``fastdup`` = fastdup's
  own model (576 floats) on the exported copy;
* ``blur``, ``mean``, ``min``, ``max``, ``contrast``, ``family``: the project's own image
  statistics of the decoded image (``tasks.curation.image_stats``; Pillow and numpy);
* ``error``: why an image has no features (it did not decode, or fastdup refused it).

Rows are keyed by (``sha256``, ``config``): ``config`` names the method and every parameter
that changes the numbers (feature size, the statistics' version, and for ``embedding: fastdup``
its export size and fastdup's version), so changing one of
them re-embeds everything under the new name and an old row is never misread. The table is a
content-addressed cache, not a dataset version: it is read at its newest version and only
ever grows (rows of unseen keys appended: ``lake.append_new_rows``).

The exported copy is what fastdup reads (only for ``embedding: fastdup`` and the galleries): the
original bytes when they are a PNG or JPEG whose shorter side is at least ``EXPORT_MIN_SIDE``,
else the upright L/RGB pixels upscaled (bilinear) to that shorter side and saved as PNG (fastdup
skips images under 10x10 px, and the sample digits are 8x8).

Similarity (which images are near each other) is ``tasks.curation.neighbours``: an exact cosine
product below ``curation.exact_search_below`` eligible images, a stored faiss HNSW index above.
Measured here on 10,000 images (2 shared cores): fastdup's exact ``Flat`` k-NN over precomputed
embeddings took 4.7 s at 64 dimensions and 47.5 s at 576, its ``HNSW32`` 12.3 s at 576, while the
numpy product took 1.1 s and 1.9 s for all-against-all; the product's cost grows with the square
of the images, the index's about linearly (bench/README.md, issue 25).

Every fastdup run costs at least one second whatever its size: its engine calls ``sleep(1)``
(seen with gdb: ``sleep`` from ``do_main`` in ``libfastdup_shared.so``; 10, 100 and 1,000
images all took 1.04 s for statistics only). So its embeddings for a batch come from one call.
"""

from __future__ import annotations

import hashlib
import io
import logging
import shutil
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image, ImageOps

from tasks.curation.fastdup_optional import fastdup_installed, import_fastdup
from tasks.curation.feature_facts import FACT_COLUMNS, FeatureFacts, ImageFeatures
from tasks.curation.image_stats import NORM_MAX_SIDE, NORM_SIDE, ImageStats, image_stats
from tasks.curation.mapped_arrays import by_position, mapped_zeros
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.positions import position_code, position_dtype
from tasks.curation.sha_list import Keys
from tasks.curation.tables import RawRows
from tasks.data import lake
from tasks.settings import CurationSettings

log = logging.getLogger(__name__)


EXPORT_MIN_SIDE = 32  # px, shorter side of the copy fastdup reads; fastdup skips images under 10x10
GALLERY_IMAGES = 20  # images (or pairs) per gallery
FILL_ROWS = 1 << 16  # indices a union-find sets as their own parents at a time

FEATURES_SCHEMA = pa.schema(
    [
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("config", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("pixel_digest", pa.string(), nullable=True),
        pa.field("embedding", pa.list_(pa.float32()), nullable=True),
        pa.field("blur", pa.float64(), nullable=True),
        pa.field("mean", pa.float64(), nullable=True),
        pa.field("min", pa.float64(), nullable=True),
        pa.field("max", pa.float64(), nullable=True),
        pa.field("error", pa.string(), nullable=True),
        pa.field("run_id", pa.string(), nullable=False),
        # Added with the project's own statistics (stats=v2); appended, so older tables merge their schema.
        pa.field("contrast", pa.float64(), nullable=True),
        pa.field("family", pa.string(), nullable=True),
    ]
)


@dataclass(frozen=True)
class Features:
    """Features of a set of images: facts by sha256 and unit-length embeddings, one row each."""

    by_sha: FeatureFacts  # sha256 -> its facts (columns by position: ``tasks.curation.feature_facts``)
    row_of: Mapping[str, int]  # sha256 -> row of ``matrix``; images with an error have no row
    matrix: np.ndarray  # float32, L2-normalised rows

    def pixel_keys(self, rows: RawRows) -> PixelKeys:
        """sha256 -> its pixel key (``tasks.curation.pixel_keys``) for every image of ``rows`` (each has its facts):
        all the grouping and the walk read of the facts once the bad images are set aside."""
        facts = self.by_sha
        digests = facts.digests if facts.at is rows.at else facts.digests.take(facts.positions(rows.shas))
        return PixelKeys.of_digests(rows.at, rows.shas, digests)

    def vectors(self) -> Features:
        """The embedding's rows alone, the facts let go (``pixel_keys`` keeps what is read of them)."""
        return Features(FeatureFacts.empty(), self.row_of, self.matrix)


STATS_CONFIG = f"stats=v2,norm_side={NORM_SIDE},norm_max_side={NORM_MAX_SIDE}"  # tasks.curation.image_stats


def feature_config(cfg: CurationSettings) -> str:
    """The name of everything that changes a feature row's numbers (fastdup's version only where its model runs)."""
    if cfg.embedding == "pixels":
        return f"pixels;feature_size={cfg.feature_size};{STATS_CONFIG}"
    return (f"fastdup;model=default;export_min_side={EXPORT_MIN_SIDE};fastdup={package_version('fastdup')};"
            f"{STATS_CONFIG}")


# ---------------------------------------------------------------- decoding


@dataclass(frozen=True)
class _Decoded:
    """What one decode of an image gives: its pixel digest, embedding, statistics and exported copy."""

    digest: str
    vector: np.ndarray | None
    stats: ImageStats
    exported: bytes | None
    ext: str


def _decode(data: bytes, feature_size: int | None, export: bool = True) -> _Decoded:
    """One decode gives the pixel digest, the pixel embedding (if asked), the statistics and the exported copy."""
    with Image.open(io.BytesIO(data)) as src:
        fmt = src.format
        src.load()
        upright = ImageOps.exif_transpose(src)
        rotated = upright.size != src.size or src.getexif().get(0x0112, 1) not in (1, None)
        mode = upright.mode
        # Digest: RGBA is lossless for these modes, so L and RGB copies of one image match.
        rgba = upright.convert("RGBA") if mode in ("1", "L", "LA", "P", "RGB", "RGBA") else upright
        h = hashlib.sha256(f"{rgba.mode}:{rgba.size[0]}x{rgba.size[1]}:".encode())
        h.update(rgba.tobytes())
        digest = h.hexdigest()
        # Alpha is composited on black, as cd4ml_runtime.preprocess does for the model's input.
        if mode in ("RGBA", "LA", "P", "PA"):
            flat = Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba.convert("RGBA"))
            flat = flat.convert("L" if mode in ("LA",) else "RGB")
        elif mode in ("L", "RGB"):
            flat = upright
        else:
            flat = upright.convert("RGB")
        vector = None if feature_size is None else _pixel_vector(flat, feature_size)
        stats = image_stats(flat)
        if not export:
            return _Decoded(digest, vector, stats, None, "")
        exported, ext = _exported(flat, data, fmt, mode, rotated)
        return _Decoded(digest, vector, stats, exported, ext)


def _pixel_vector(flat: Image.Image, feature_size: int) -> np.ndarray:
    gray = flat.convert("L")
    if gray.size != (feature_size, feature_size):
        gray = gray.resize((feature_size, feature_size), Image.BOX)
    x = np.asarray(gray, dtype=np.float64).ravel()
    x = x - x.mean()
    norm = float(np.linalg.norm(x))
    # A flat image has no correlation to speak of: it is similar to other flat images only.
    return (x / norm if norm else np.full(x.shape, 1.0 / np.sqrt(x.size))).astype(np.float32)


def _exported(flat: Image.Image, data: bytes, fmt: str | None, mode: str, rotated: bool) -> tuple[bytes, str]:
    """The copy fastdup and the galleries read: the original bytes when they will do, else an upscaled PNG."""
    w, h_ = flat.size
    if fmt in ("PNG", "JPEG") and min(w, h_) >= EXPORT_MIN_SIDE and mode in ("L", "RGB") and not rotated:
        return data, ".png" if fmt == "PNG" else ".jpg"
    if min(w, h_) < EXPORT_MIN_SIDE:
        scale = EXPORT_MIN_SIDE / min(w, h_)
        flat = flat.resize((max(EXPORT_MIN_SIDE, round(w * scale)), max(EXPORT_MIN_SIDE, round(h_ * scale))),
                           Image.BILINEAR)
    buf = io.BytesIO()
    flat.save(buf, format="PNG", compress_level=1)
    return buf.getvalue(), ".png"


def pixel_embedding(data: bytes, size: int) -> np.ndarray:
    """The ``pixels`` embedding of one image (unit length, ``size * size`` floats)."""
    vector = _decode(data, size, export=False).vector
    assert vector is not None
    return vector


def decode_stats(data: bytes) -> ImageStats:
    """The bad-image statistics of one encoded image (``tasks.curation.image_stats``), as curation computes them."""
    return _decode(data, None, export=False).stats


def export_copy(data: bytes) -> tuple[bytes, str]:
    """The bytes fastdup (and a gallery) reads for one image, and their file extension."""
    decoded = _decode(data, None)
    assert decoded.exported is not None
    return decoded.exported, decoded.ext


# ---------------------------------------------------------------- computing and storing


def compute_features(
    images: list[tuple[str, bytes]], cfg: CurationSettings, work_dir: Path, run_id: str
) -> pa.Table:
    """Feature rows for ``images`` ((sha256, bytes) pairs): one decode each; fastdup only for its model.

    Every statistic is the project's own (``tasks.curation.image_stats``). ``embedding: fastdup``
    adds one fastdup run over the exported copies for its model's embeddings (``run_mode=1``:
    features, no k-NN); ``work_dir`` holds those copies and fastdup's files; the caller removes it.
    """
    config = feature_config(cfg)
    rows: dict[str, dict[str, Any]] = {}
    files: dict[str, str] = {}  # exported file -> sha256
    with_model = cfg.embedding == "fastdup"
    image_dir = work_dir / "images"
    if with_model:
        image_dir.mkdir(parents=True, exist_ok=True)
    for sha, data in images:
        row: dict[str, Any] = {"sha256": sha, "config": config, "method": cfg.embedding, "pixel_digest": None,
                               "embedding": None, "blur": None, "mean": None, "min": None, "max": None,
                               "error": None, "run_id": run_id, "contrast": None, "family": None}
        rows[sha] = row
        try:
            decoded = _decode(data, None if with_model else cfg.feature_size, export=with_model)
        except Exception as exc:  # ingest decoded it once; a failure now is recorded, never fatal
            row["error"] = f"undecodable: {exc}"
            continue
        st = decoded.stats
        row.update(pixel_digest=decoded.digest, embedding=decoded.vector, blur=st.blur, mean=st.mean, min=st.min,
                   max=st.max, contrast=st.contrast, family=st.family)
        if with_model and decoded.exported is not None:
            path = image_dir / f"{sha}{decoded.ext}"
            path.write_bytes(decoded.exported)
            files[str(path)] = sha
    if files:
        _add_model_embeddings(rows, files, work_dir)
    out = [rows[sha] for sha in sorted(rows)]
    column = [None if r["embedding"] is None else np.asarray(r["embedding"], dtype=np.float32).ravel() for r in out]
    table = pa.Table.from_pylist([{**r, "embedding": None} for r in out], schema=FEATURES_SCHEMA)
    return table.set_column(table.schema.get_field_index("embedding"), FEATURES_SCHEMA.field("embedding"),
                            _list_column(column))


def _add_model_embeddings(rows: dict[str, dict[str, Any]], files: dict[str, str], work_dir: Path) -> None:
    """fastdup's model embedding into each row; an image fastdup refuses gets an error and no features."""
    vectors, invalid = _run_fastdup(sorted(files), work_dir / "fastdup")
    for name, sha in files.items():
        row = rows[sha]
        if name in invalid:
            row.update(error=f"fastdup: {invalid[name]}", embedding=None)
        elif name not in vectors:
            row.update(error="fastdup: no embedding", embedding=None)
        else:
            row["embedding"] = vectors[name]


def _list_column(vectors: list[np.ndarray | None]) -> pa.Array:
    """list<float32> straight from numpy (a Python list of 576 floats per image is slow and large)."""
    sizes = [0 if v is None else v.size for v in vectors]
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
    present = [v for v in vectors if v is not None]
    values = pa.array(np.concatenate(present) if present else np.zeros(0, dtype=np.float32))
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(pa.float32()),
                                    mask=pa.array([v is None for v in vectors]))


def _run_fastdup(files: list[str], work_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One fastdup pass over ``files``: (model embeddings by file, invalid file -> code)."""
    import fastdup
    import pandas as pd

    if work_dir.exists():
        shutil.rmtree(work_dir)  # a crashed earlier attempt must not leak into this one
    fd = fastdup.create(work_dir=str(work_dir), input_dir=str(Path(files[0]).parent))
    fd.run(annotations=pd.DataFrame({"filename": files}), run_mode=1, overwrite=True, verbose=False)
    invalid_df = fd.invalid_instances()
    invalid = {} if invalid_df is None else dict(zip(invalid_df["filename"], invalid_df["error_code"].astype(str)))
    vectors: dict[str, np.ndarray] = {}
    if len(invalid) < len(files):
        names, matrix = fd.embeddings()
        vectors = {str(n): matrix[i] for i, n in enumerate(names)}
    return vectors, invalid


def load_features(uri: str, config: str, shas: set[str], vectors: bool = True) -> Features:
    """The stored features of ``shas`` under ``config`` (missing ones are simply absent; ``stored_rows``)."""
    return _as_features(stored_rows(uri, config, Keys.of(sorted(shas)), vectors))


NO_FACTS = dict.fromkeys(FACT_COLUMNS)  # a fact an older table lacks: null
FACTS_SCHEMA = pa.schema([FEATURES_SCHEMA.field(c).with_nullable(True) for c in ("sha256", *FACT_COLUMNS)])


def stored_rows(uri: str, config: str, wanted: Keys, vectors: bool = False) -> pa.Table:
    """The stored rows of ``wanted``'s images under ``config``, in the table's order: ``sha256`` and the facts
    (``FACTS_SCHEMA``; null where an older table lacks a fact), with ``vectors`` the embedding too.

    Streamed in blocks of rows (``lake.scan_blocks``), keeping only the rows of ``wanted`` (found by binary search in
    their byte array: an Arrow ``is_in`` hashed every wanted sha256 a block, about 190 MB at a million); without ``vectors`` the
    embedding column is not read at all (the neighbour search reads the vectors from their memory-mapped file:
    ``tasks.curation.vectors``), so memory holds the facts of these images, not the table.
    """
    columns = [*FACTS_SCHEMA.names, *(["embedding"] if vectors else [])]
    parts = [part for part, _ in _stored_parts(uri, config, wanted, columns)]
    return pa.concat_tables(parts) if parts else _nullable(columns).empty_table()


def _nullable(columns: list[str]) -> pa.Schema:
    return pa.schema([FEATURES_SCHEMA.field(c).with_nullable(True) for c in columns])


def _stored_parts(uri: str, config: str, wanted: Keys, columns: list[str]) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """Each block's rows of ``wanted``'s images under ``config``: their ``columns`` and positions among ``wanted``."""
    for block, rows, at in _stored_rows(uri, config, wanted, columns):
        yield block.take(pa.array(rows)), at


def _stored_rows(uri: str, config: str, wanted: Keys, columns: list[str]
                 ) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:
    """Each block of the stored rows (its ``columns``), which of its rows are ``wanted``'s images under ``config``
    and their positions among ``wanted`` (``lake.SEARCH_BLOCK_ROWS`` rows a block: a row's place is a binary search,
    no set is hashed a block). The block as read: a caller takes the rows it keeps, once."""
    version = lake.current_version(uri)
    if version is None or not len(wanted):
        return
    schema = _nullable([*columns, *(c for c in ("sha256", "config") if c not in columns)])
    for block in lake.scan_blocks_with_defaults(uri, version, schema.names, lake.SEARCH_BLOCK_ROWS, schema,
                                                NO_FACTS):
        part = block.cast(schema)
        at = wanted.positions(part.column("sha256"))
        keep = (at >= 0) & pc.fill_null(pc.equal(part.column("config"), config), False).to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(keep)
        yield part.select(columns), rows, at[rows]


def fill_stored_facts(uri: str, config: str, wanted: Keys, facts: FeatureFacts) -> np.ndarray:
    """Fill ``facts`` (``FeatureFacts.blank`` over ``wanted``'s images, in their order) with their stored facts under
    ``config``; which of ``wanted`` have stored facts (bool; an image stored twice: its first row).

    What a curation reads of every image of its raw version, read ``lake.SEARCH_BLOCK_ROWS`` rows at a time (a row's
    place among ``wanted`` is a binary search, no set is hashed a block) into the columns by position: no sha256 is
    held, nor a table of every image's facts (at a million images the stored rows with their sha256, read in blocks of
    262,144 with each row's config string, then taken into the raw rows' order, were the features' high). A block's
    rows to fill are taken from it once (a filtered copy, then a copy of its first rows, were two)."""
    filled = np.zeros(len(wanted), dtype=bool)
    for block, rows, at in _stored_rows(uri, config, wanted, list(FACT_COLUMNS)):
        _fill_first(facts, filled, block, rows, at, None)
    return filled


def fill_keyed_facts(uri: str, config: str, wanted: Keys, facts: FeatureFacts, into: np.ndarray) -> np.ndarray:
    """``fill_stored_facts`` for a few images (a batch's, ``into``: their positions among the facts): their stored rows
    found by key (``lake.scan_keyed``: the key column first, then only the row groups holding one), not every block of
    the table with its facts (at a million images that read held about 130 MB for a batch's 1,000 images, none of them
    stored yet). Of an image stored twice under ``config``, its first row, as there."""
    filled = np.zeros(len(wanted), dtype=bool)
    version = lake.current_version(uri)
    if version is None or not len(wanted):
        return filled
    have = set(lake.column_names(uri, version))
    present = [c for c in FACT_COLUMNS if c in have]
    values = pa.array([k.decode("ascii") for k in wanted.at(np.arange(len(wanted))).tolist()], pa.string())
    for block in lake.scan_keyed(uri, version, "sha256", values, ["config", *present], lake.SEARCH_BLOCK_ROWS,
                                 lake.KEYED_BYTES, position="_wanted"):
        rows = np.flatnonzero(pc.fill_null(pc.equal(block.column("config"), config), False).to_numpy(zero_copy_only=False))
        _fill_first(facts, filled, block.select(present), rows, block.column("_wanted").to_numpy()[rows], into)
    return filled


def _fill_first(facts: FeatureFacts, filled: np.ndarray, block: pa.Table, rows: np.ndarray, at: np.ndarray,
                into: np.ndarray | None) -> None:
    """Fill the facts of the wanted images at ``at`` (``block``'s ``rows``, in that order; ``into``: the facts'
    position of each wanted image, None where they are the same) not ``filled`` yet; of an image twice, its first
    row."""
    images, first = np.unique(at, return_index=True)
    unfilled = ~filled[images]
    new = images[unfilled]
    facts.fill(new if into is None else into[new], block.take(pa.array(rows[first[unfilled]])))
    filled[new] = True


def stored_vectors(uri: str, config: str, shas: list[str]) -> np.ndarray:
    """The unit embeddings of ``shas`` (every one stored without error), one row each in that order: a rebuild."""
    features = load_features(uri, config, set(shas))
    missing = [s for s in shas if s not in features.row_of]
    if missing:
        raise KeyError(f"{len(missing)} images have no stored embedding under {config}, e.g. {missing[0]}")
    return features.matrix[[features.row_of[s] for s in shas]]


def _as_features(table: pa.Table) -> Features:
    return Features(FeatureFacts.of_table(table), *computed_vectors(table))


def computed_vectors(table: pa.Table, rows: RawRows | None = None) -> tuple[Mapping[str, int], np.ndarray]:
    """(sha256 -> its row of the matrix, the unit embeddings) of ``table``'s rows that have one and no error; by the
    raw rows' positions when ``rows`` are given (a first curation embeds every image: a dict and a string an image
    were about 200 bytes), else a dict of interned strings."""
    empty: tuple[Mapping[str, int], np.ndarray] = ({}, np.zeros((0, 1), dtype=np.float32))
    if "embedding" not in table.column_names:  # facts only: the vectors are read from their file
        return empty
    emb = table.column("embedding")
    ok = emb.is_valid().to_numpy(zero_copy_only=False)
    if "error" in table.column_names:
        ok &= table.column("error").is_null().to_numpy(zero_copy_only=False)
    valid = np.flatnonzero(ok)
    if not len(valid):
        return empty
    column = table.column("sha256").take(pa.array(valid))
    if rows is None:
        return {s: r for r, s in enumerate(lake.interned(column))}, _unit_rows(emb, ok, len(valid))
    return RowOf.of(rows, rows.located(column)), _unit_rows(emb, ok, len(valid))


class RowOf(Mapping[str, int]):
    """sha256 -> its row of a matrix, held as each raw position's row (-1: none), 4 bytes an image."""

    def __init__(self, at: Mapping[str, int], row: np.ndarray) -> None:
        self.at, self.row = at, row

    @classmethod
    def of(cls, rows: RawRows, positions: np.ndarray) -> RowOf:
        """Row ``r`` is the image at raw position ``positions[r]`` (``KeyError`` for one that is not a raw row)."""
        if bool((positions < 0).any()):
            raise KeyError(f"{int((positions < 0).sum())} embedded images are not rows of the raw version")
        row = np.full(len(rows), -1, dtype=np.int32)
        row[positions] = np.arange(len(positions), dtype=np.int32)
        return cls(rows.at, row)

    def __getitem__(self, sha: str) -> int:
        r = int(self.row[self.at[sha]])
        if r < 0:
            raise KeyError(sha)
        return r

    def __contains__(self, sha: object) -> bool:
        i = self.at.get(sha)  # type: ignore[call-overload]
        return i is not None and self.row[i] >= 0

    def __iter__(self) -> Iterator[str]:
        shas = self.at.members  # type: ignore[attr-defined]
        return (shas[i] for i in np.flatnonzero(self.row >= 0).tolist())

    def __len__(self) -> int:
        return int((self.row >= 0).sum())


def _unit_rows(emb: pa.ChunkedArray, ok: np.ndarray, rows: int) -> np.ndarray:
    """The ``ok`` rows of an embedding column as one float32 matrix of unit rows, filled a chunk at a time: memory
    holds the matrix and one chunk (a whole column's take, flatten and division were four copies of it)."""
    matrix: np.ndarray | None = None
    at = start = 0
    for chunk in emb.chunks:
        picked = chunk.filter(pa.array(ok[start:start + len(chunk)]))
        start += len(chunk)
        if not len(picked):
            continue
        block = np.asarray(picked.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(picked), -1)
        if matrix is None:
            matrix = np.empty((rows, block.shape[1]), dtype=np.float32)
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        matrix[at:at + len(block)] = block / np.where(norms == 0, 1.0, norms)
        at += len(block)
    assert matrix is not None and at == rows
    return matrix


def store_features(uri: str, rows: pa.Table, metadata: dict[str, Any]) -> int | None:
    """Add rows whose (sha256, config) is new; a re-run adds nothing and commits nothing."""
    version, _ = lake.append_new_rows(uri, rows, ["sha256", "config"], metadata,
                                      configuration=lake.stats_columns_config(FEATURES_SCHEMA), merge_schema=True)
    return version


# ---------------------------------------------------------------- similarity


class UnionFind:
    """Disjoint sets over 0..n-1; the smaller index becomes the root, so the result is order-free.

    The parents are machine integers (4 bytes an image below 2**31), not a list of Python ints (36 bytes an image: the
    list's pointer and an int object each), held through the grouping: an ``array``, or with a scratch folder a
    mapping of a file there (``mapped_arrays``).
    """

    def __init__(self, n: int, scratch: Path | None = None) -> None:
        """``scratch``: a folder the parents are mapped from (``mapped_arrays``: not the process's own memory)."""
        self.parent = by_position(n, position_code(n), 0, scratch)
        parents = self._parents()
        for start in range(0, n, FILL_ROWS):  # each its own parent, a block at a time (no range of every index)
            parents[start:start + FILL_ROWS] = np.arange(start, min(n, start + FILL_ROWS), dtype=parents.dtype)

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def attach(self, children: np.ndarray, roots: np.ndarray) -> None:
        """Make each of ``children`` a direct child of its ``roots`` entry, all at once: for sets not joined yet, where
        each root is the smallest index of its set (so its own parent), as ``union`` would leave them."""
        self._parents()[children] = roots

    def attach_codes(self, codes: np.ndarray, scratch: Path | None = None) -> None:
        """Join the indices of each code ``>= 0`` under the smallest index with that code (``attach`` for every such
        set at once; the others stay as they are): one array a code, filled by ``minimum.at``, not a sort of every
        index (``np.unique`` with its index and inverse: four int64 arrays an image). Read a block of ``codes`` at a
        time, that array mapped from ``scratch`` where one is given (``mapped_arrays``): the recorded indices, their
        codes and their roots of every index at once were about 20 bytes an image of a batch's heap."""
        kind = self._parents().dtype
        span = max((int(codes[a:a + FILL_ROWS].max(initial=-1)) for a in range(0, len(codes), FILL_ROWS)),
                   default=-1) + 1
        first = mapped_zeros(span, kind, scratch)
        first[:] = len(self.parent)
        for at, by_code in _recorded_blocks(codes, kind):
            np.minimum.at(first, by_code, at)
        for at, by_code in _recorded_blocks(codes, kind):
            self.attach(at, first[by_code])

    def roots(self) -> np.ndarray:
        """Each index's root (int32 below 2**31 indices, as the parents), by pointer jumping (a ``find`` an index was a
        second at a million images): in the parents themselves, a block at a time until a pass changes none, so the
        roots are the parents' own storage (mapped where they are) and the sets stay as they were, compressed. Two
        copies of every parent a jump were 8 bytes an image of a batch's heap."""
        parent = self._parents()
        changed = True
        while changed:
            changed = False
            for start in range(0, len(parent), FILL_ROWS):
                part = parent[start:start + FILL_ROWS]
                up = parent[part]
                if not np.array_equal(up, part):
                    part[:], changed = up, True
        return parent

    def _parents(self) -> np.ndarray:
        return np.frombuffer(self.parent, dtype=position_dtype(len(self.parent)))


def _recorded_blocks(codes: np.ndarray, kind: np.dtype) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(the indices with a code ``>= 0``, as ``kind``; their codes), ``FILL_ROWS`` indices at a time."""
    for a in range(0, len(codes), FILL_ROWS):
        part = codes[a:a + FILL_ROWS]
        recorded = np.flatnonzero(part >= 0)
        yield (recorded + a).astype(kind), part[recorded]


# ---------------------------------------------------------------- galleries


def write_galleries(
    folder: Path,
    duplicates: list[tuple[str, str, float]],
    outliers: list[tuple[str, str, str, ImageFeatures]],
    images: dict[str, bytes],
    labels: dict[str, str],
) -> dict[str, str]:
    """fastdup's HTML galleries of this run's findings; name -> html path. Never fails the curation.

    ``duplicates``: (sha_a, sha_b, cosine), most similar first; ``outliers``: (sha, reason,
    detail, features). One stats gallery per outlier reason, sorted by the statistic that
    decided it. Images are embedded in the HTML, so the copies written for it are removed.
    """
    if not duplicates and not outliers:
        return {}
    if not fastdup_installed():  # an install without fastdup (its licence): the curation page shows the same
        log.info("curate: fastdup galleries skipped: fastdup is not installed (the curation page index.html "
                 "lists every drop)")
        return {}
    out: dict[str, str] = {}
    try:
        with warnings.catch_warnings():  # fastdup's own pandas code warns about chained assignment
            warnings.simplefilter("ignore")
            _galleries(folder, duplicates, outliers, images, labels, out)
    except Exception as exc:  # galleries are for people; the curation stands without them
        log.warning("curate: fastdup gallery failed: %s", exc)
    return out


def _galleries(
    folder: Path,
    duplicates: list[tuple[str, str, float]],
    outliers: list[tuple[str, str, str, ImageFeatures]],
    images: dict[str, bytes],
    labels: dict[str, str],
    out: dict[str, str],
) -> None:
    import pandas as pd

    fastdup = import_fastdup("fastdup's galleries")

    if folder.exists():
        shutil.rmtree(folder)
    source = folder / "images"
    source.mkdir(parents=True)
    path_of: dict[str, str] = {}

    def path(sha: str) -> str:
        if sha not in path_of:
            data, ext = export_copy(images[sha])
            target = source / f"{sha}{ext}"
            target.write_bytes(data)
            path_of[sha] = str(target)
        return path_of[sha]

    def made(name: str, target: Path) -> None:
        html = sorted(target.glob("*.html"))
        if html:
            out[name] = str(html[0])

    pairs = duplicates[:GALLERY_IMAGES]
    if pairs:
        target = folder / "duplicates"
        target.mkdir()
        frame = pd.DataFrame({"from": [path(a) for a, _, _ in pairs], "to": [path(b) for _, b, _ in pairs],
                              "distance": [s for _, _, s in pairs]})
        names = {path_of[s]: f"label {labels[s]}" for s in path_of}
        fastdup.create_duplicates_gallery(frame, save_path=str(target), num_images=GALLERY_IMAGES,
                                          get_label_func=names, work_dir=str(target))
        made("duplicates", target)
    order = {"blurry": ("blur", False), "too_dark": ("mean", False), "too_bright": ("mean", True),
             "too_small": ("blur", False), "flat": ("blur", False)}
    for reason, (metric, descending) in order.items():
        picked = [(s, d, f) for s, r, d, f in outliers if r == reason][: GALLERY_IMAGES * 5]
        if not picked:
            continue
        target = folder / f"outliers_{reason}"
        target.mkdir()
        frame = pd.DataFrame({"filename": [path(s) for s, _, _ in picked],
                              "blur": [f.blur or 0.0 for _, _, f in picked],
                              "mean": [f.mean or 0.0 for _, _, f in picked]})
        names = {path_of[s]: f"{reason} (label {labels[s]}): {d}" for s, d, _ in picked}
        fastdup.create_stats_gallery(frame, save_path=str(target), metric=metric, descending=descending,
                                     num_images=GALLERY_IMAGES, get_label_func=names, work_dir=str(target))
        made(f"outliers_{reason}", target)
    shutil.rmtree(source, ignore_errors=True)


def clear_dir(path: Path) -> None:
    """Remove a work folder; fastdup's exported copies are derived data."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # pragma: no cover - a file system that refuses: say so, do not fail
        log.warning("curate: could not remove %s", path)
