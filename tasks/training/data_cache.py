"""The decode cache: one curated version decoded once into files on disk.

* ``ensure_cache`` streams one curated version (time travel) in record batches and decodes its
  train and val images once, with the model's own preprocessing (``cd4ml_runtime.preprocess``:
  channels, size, fit), into ``<cache_dir>/<key>/``: one raw uint8 file per split (rows in
  sha256 order, written at their offset as batches arrive), the targets, the rows' sha256 /
  label / split, two example images and the per-channel mean and std of the train split. Memory
  stays at a batch whatever the dataset's size; with more than one core, worker processes decode
  while the main process reads and writes. A Delta version never changes, so the cache never goes
  stale; later epochs, retries, tuning trials and every DDP rank read the files instead of
  decoding again. It is written to a temporary folder and renamed, so concurrent builders cannot
  tear it.
* ``channels: auto`` takes the majority mode of the rows' stored images (L -> 1, RGB -> 3), so a
  few colour photos in a grey dataset are read as grey (and the reverse), never a silent switch.
* ``SplitStore`` gathers a batch from a read-only memory map of the split file and hands the
  touched pages back to the kernel every 64 MB, so the process's resident memory does not grow
  with the dataset (the page cache keeps the file warm for the next epoch).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import mmap
import os
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from cd4ml_runtime.preprocess import ChannelStats, ImageDecodeError, PreprocessSpec, decode_many
from tasks.data import lake
from tasks.errors import DataError
from tasks.worker_pool import spawn_pool

CACHE_FORMAT = 2
META_FILE = "meta.json"
SCAN_ROWS = 256  # rows per streamed record batch
PARALLEL_FROM = 2000  # rows: below this, worker start-up costs more than it saves
FAULT_AROUND_BYTES = 64 << 10  # Linux maps up to 16 pages around a faulting page of a file mapping


class NoTrainingDataError(DataError, ValueError):
    """The curated version has no rows in a split that training needs."""


def class_order(labels: list[str]) -> list[str]:
    """Classes in a stable order: numerically when every label is an integer, else as text."""
    unique = sorted(set(labels))
    if all(label.lstrip("-").isdigit() for label in unique):
        return sorted(unique, key=int)
    return unique


def load_split_rows(
    curated_table: str, curated_version: int, splits: tuple[str, ...],
    columns: tuple[str, ...] = ("sha256", "image", "label", "split"),
) -> pa.Table:
    """The rows of ``splits`` (``columns``: sha256, label and split at least) at that exact version, in sha256 order."""
    table = lake.read(curated_table, curated_version, columns=list(columns), filter=[("split", "in", list(splits))])
    return table.sort_by([("sha256", "ascending"), ("split", "ascending"), ("label", "ascending")])


class SplitStore:
    """One split's decoded pixels on disk: ``n`` rows of uint8 ``shape``, gathered from a read-only map.

    A batch is one fancy-index gather (C speed, any order, repeats allowed). The pages a process
    touched are handed back to the kernel (``MADV_DONTNEED``) every ``release_bytes``: they stay in
    the page cache for the next epoch, but the process's resident memory stays flat whatever the
    dataset's size.
    """

    def __init__(self, path: str | Path, n: int, shape: tuple[int, int, int], release_bytes: int = 64 << 20) -> None:
        self.path, self.n, self.shape = str(path), int(n), tuple(int(v) for v in shape)
        self.row_bytes = int(np.prod(self.shape))
        self.release_bytes = release_bytes
        self._map: mmap.mmap | None = None
        self._rows: np.ndarray | None = None
        self._pid, self._touched = -1, 0

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:  # worker processes map the file themselves
        return {**self.__dict__, "_map": None, "_rows": None, "_pid": -1, "_touched": 0}

    def _mapped(self) -> np.ndarray:
        if self._rows is None or self._pid != os.getpid():
            size = os.path.getsize(self.path)
            if size != self.n * self.row_bytes:
                raise OSError(f"{self.path} holds {size} bytes, expected {self.n} rows of {self.row_bytes} (cache damaged?)")
            with open(self.path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            self._rows = np.frombuffer(self._map, dtype=np.uint8).reshape(self.n, *self.shape)
            self._pid, self._touched = os.getpid(), 0
        return self._rows

    def read(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows at ``positions`` (any order, repeats allowed) as uint8 (len, C, S, S)."""
        index = np.asarray(positions, dtype=np.int64)
        if len(index) == 0:
            return np.empty((0, *self.shape), dtype=np.uint8)
        if index.min() < 0 or index.max() >= self.n:
            raise IndexError(f"row positions outside 0..{self.n - 1}")
        out = self._mapped()[index]  # a copy
        self._touched += len(index) * max(self.row_bytes, FAULT_AROUND_BYTES)  # the kernel maps ~64 KB per fault
        if self._touched >= self.release_bytes and self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)
            self._touched = 0
        return out

    def chunks(self, positions: np.ndarray, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(0, len(positions), size):
            part = positions[i : i + size]
            yield part, self.read(part)


@dataclass(frozen=True)
class CachedSplits:
    """The decoded train and val splits of one curated version: pixels on disk, targets in memory."""

    path: str
    classes: list[str]
    spec: PreprocessSpec  # with the train split's channel statistics
    train: SplitStore
    y_train: torch.Tensor
    val: SplitStore
    y_val: torch.Tensor
    examples: list[bytes]  # two val images as stored: the pyfunc's input example

    def rows(self) -> pa.Table:
        """sha256, label and split of every cached row (for ``mlflow.log_input``)."""
        return pq.read_table(Path(self.path) / "rows.parquet")


def cache_key(curated_table: str, curated_version: int, image_size: int, channels: int | str = "auto", fit: str = "crop") -> str:
    text = f"{CACHE_FORMAT}|{curated_table}|{int(curated_version)}|{int(image_size)}|{channels}|{fit}"
    return f"v{int(curated_version)}-s{int(image_size)}-c{channels}-{fit}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _image_mode(data: bytes) -> str:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return "RGB" if img.mode not in ("L", "1", "I;16", "I;16B", "I;16L", "I", "F", "LA") else "L"
    except (OSError, ValueError):
        return "?"


def resolve_channels(channels: int | str, batches: Iterator[pa.RecordBatch]) -> tuple[int, dict[str, int]]:
    """1 or 3; ``auto`` = the majority of the images' stored modes (header reads, no decode)."""
    if channels != "auto":
        return int(channels), {}
    counts: Counter[str] = Counter()
    for batch in batches:
        counts.update(_image_mode(bytes(v)) for v in batch.column("image").to_pylist())
    return (3 if counts["RGB"] > counts["L"] else 1), dict(counts)


def _decode_chunk(images: list[bytes], spec: dict[str, Any]) -> np.ndarray:
    return decode_many(images, PreprocessSpec.from_dict(spec))


class _Decoder:
    """Decodes batches in the caller (small data, one core) or in a pool of spawned workers."""

    def __init__(self, spec: PreprocessSpec, rows: int) -> None:
        self.spec = spec
        workers = min(os.cpu_count() or 1, 8)
        self.pool: ProcessPoolExecutor | None = None
        if rows >= PARALLEL_FROM and workers > 1:
            self.pool = spawn_pool(workers)
            self.workers = workers

    def map(self, batches: Iterator[list[bytes]]) -> Iterator[np.ndarray]:
        if self.pool is None:
            for images in batches:
                yield decode_many(images, self.spec)
            return
        spec, pending = self.spec.to_dict(), []
        for images in batches:  # keep a few batches in flight: decode overlaps the read and the write
            pending.append(self.pool.submit(_decode_chunk, images, spec))
            if len(pending) > 2 * self.workers:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def ensure_cache(
    cache_dir: str, curated_table: str, curated_version: int, image_size: int, channels: int | str = "auto", fit: str = "crop"
) -> str:
    """Decode the train and val splits once; returns the cache folder (built only when missing).

    Raises ``NoTrainingDataError`` when a split is empty or there is a single class: a data
    problem no retry can fix.
    """
    target = Path(cache_dir) / cache_key(curated_table, curated_version, image_size, channels, fit)
    if (target / META_FILE).exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _build_cache(tmp, curated_table, int(curated_version), image_size, channels, fit)
        os.rename(tmp, target)
    except OSError:  # another process finished the same cache first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / META_FILE).exists():
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)


@dataclass(frozen=True)
class _Layout:
    """Where every row goes: per split, the sorted sha256 (position = rank) and the targets.

    Fixed-width numpy arrays, not Python objects: ~80 bytes a row, so a million images cost
    tens of megabytes here.
    """

    rows: pa.Table  # sha256, label, split in sha256 order
    classes: list[str]
    shas: dict[str, np.ndarray]  # split -> sorted sha256 as S64
    targets: dict[str, np.ndarray]  # split -> class index per position

    def positions(self, split: str, shas: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.shas[split], shas)


def _layout(curated_table: str, curated_version: int) -> _Layout:
    rows = load_split_rows(curated_table, curated_version, ("train", "val"), columns=("sha256", "label", "split"))
    rows = rows.set_column(1, "label", pc.cast(rows["label"], pa.string()))
    where = f"{curated_table}@v{curated_version}"
    counts = {s: int(pc.sum(pc.equal(rows["split"], s)).as_py() or 0) for s in ("train", "val")}
    if counts["train"] == 0 or counts["val"] == 0:
        raise NoTrainingDataError(f"{where} has {counts['train']} train and {counts['val']} val rows; training needs both")
    classes = class_order([str(v) for v in pc.unique(rows["label"]).to_pylist()])
    if len(classes) < 2:
        raise NoTrainingDataError(f"{where} has a single class {classes}: nothing to learn")
    shas, targets = {}, {}
    for split in ("train", "val"):
        part = rows.filter(pc.equal(rows["split"], split))
        shas[split] = np.asarray(part["sha256"].to_numpy(zero_copy_only=False), dtype="S64")
        targets[split] = pc.index_in(part["label"], value_set=pa.array(classes)).to_numpy(zero_copy_only=False).astype(np.int64)
    return _Layout(rows, classes, shas, targets)


@dataclass
class _Written:
    stats: ChannelStats
    examples: dict[int, bytes]


def _write_pixels(folder: Path, batches: Iterator[pa.RecordBatch], layout: _Layout, spec: PreprocessSpec) -> _Written:
    """Decode every streamed row and write its pixels at its position in its split file."""
    out = _Written(ChannelStats(spec.channels), {})
    row_bytes = spec.channels * spec.size * spec.size
    files = {s: os.open(folder / f"x_{s}.u8", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for s in layout.shas}
    decoder = _Decoder(spec, sum(len(v) for v in layout.shas.values()))
    queue: list[tuple[np.ndarray, np.ndarray, list[bytes]]] = []

    def images_of() -> Iterator[list[bytes]]:  # remembers each batch's rows for when its pixels come back
        for batch in batches:
            images = [bytes(v) for v in batch.column("image").to_pylist()]
            shas = np.asarray(batch.column("sha256").to_numpy(zero_copy_only=False), dtype="S64")
            queue.append((shas, np.asarray(batch.column("split").to_numpy(zero_copy_only=False)), images))
            yield images

    try:
        for pixels in decoder.map(images_of()):
            shas, splits, images = queue.pop(0)
            for split in ("train", "val"):
                rows = np.flatnonzero(splits == split)
                for i, pos in zip(rows.tolist(), layout.positions(split, shas[rows]).tolist()):
                    os.pwrite(files[split], pixels[i].tobytes(), pos * row_bytes)
                    if split == "val" and pos < 2:
                        out.examples[pos] = images[i]
            out.stats.add(pixels[splits == "train"])
    finally:
        decoder.close()
        for fd in files.values():
            os.close(fd)
    return out


def _build_cache(folder: Path, curated_table: str, curated_version: int, image_size: int, channels: int | str, fit: str) -> None:
    where = f"{curated_table}@v{curated_version}"
    layout = _layout(curated_table, curated_version)

    def stream(columns: list[str]) -> Iterator[pa.RecordBatch]:
        return lake.scan_batches(curated_table, curated_version, columns, {"split": ["train", "val"]}, SCAN_ROWS)

    n_channels, modes = resolve_channels(channels, stream(["image"]))
    spec = PreprocessSpec(n_channels, int(image_size), fit)
    try:
        written = _write_pixels(folder, stream(["sha256", "image", "label", "split"]), layout, spec)
    except ImageDecodeError as exc:
        raise DataError(f"{where}: a curated image no longer decodes ({exc})") from exc
    spec = spec.with_stats(*written.stats.result())
    for split, y in layout.targets.items():
        np.save(folder / f"y_{split}.npy", y)
    pq.write_table(layout.rows, folder / "rows.parquet")
    meta = {
        "format": CACHE_FORMAT,
        "curated_table": curated_table,
        "curated_version": int(curated_version),
        "classes": layout.classes,
        "preprocess": spec.to_dict(),
        "channels_requested": channels,
        "modes": modes,
        "n_train": len(layout.shas["train"]),
        "n_val": len(layout.shas["val"]),
        "examples": [base64.b64encode(written.examples[k]).decode() for k in sorted(written.examples)],
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2))


def load_cache(path: str) -> CachedSplits:
    root = Path(path)
    meta = json.loads((root / META_FILE).read_text())
    spec = PreprocessSpec.from_dict(meta["preprocess"])
    shape = (spec.channels, spec.size, spec.size)
    return CachedSplits(
        path=str(root),
        classes=list(meta["classes"]),
        spec=spec,
        train=SplitStore(root / "x_train.u8", meta["n_train"], shape),
        y_train=torch.from_numpy(np.load(root / "y_train.npy")),
        val=SplitStore(root / "x_val.u8", meta["n_val"], shape),
        y_val=torch.from_numpy(np.load(root / "y_val.npy")),
        examples=[base64.b64decode(e) for e in meta["examples"]],
    )
