"""Calibration of near-duplicate detection: which embedding and threshold tell planted copies from distinct images.

Curation embeds each image (``tasks.curation.curation_features``) and calls two images near-duplicates
when the cosine of their embeddings is at or above a threshold; the copy is then dropped. This
measures, on real images that ship inside installed packages (nothing is downloaded):

* cells (source x size):
  - ``digits``: scikit-learn's 1,797 8x8 digits (0..16 scaled to 0..255, ``tasks.data.sample_data``)
    at 8 px (native), 32 px and 64 px (upscaled, bilinear); class = the digit's label;
  - ``tiles``: non-overlapping 32, 64 and 128 px tiles of real photos (scikit-learn's
    ``china.jpg``/``flower.jpg`` and scikit-image's bundled photos, ``SKIMAGE_PHOTOS``); class = the photo.
    Near-flat tiles (grey std < ``FLAT_STD``: sky, black retina border) are left out and counted:
    they are look-alikes by any measure and the outlier rules see them;
* copies: each sampled original gets one copy per transformation (``TRANSFORMS``), every
  parameter drawn from a fixed-seed RNG: ``resize`` (down by 0.5-0.8x and back up, bilinear),
  ``rescale`` (kept at 1.25-2x the size), ``jpeg`` (quality 60-90), ``brightness`` (x0.75-0.9 or
  x1.1-1.25), ``shift`` (2-4% of the side in a random direction, sub-pixel, edges repeated),
  ``crop`` (a 90-95% box at a random offset, resized back). At 8 px a shift or crop is a fraction
  of a pixel, i.e. a bilinear re-sampling;
* distinct: for each original, its MOST similar other image of the same class in the cell's
  pool (the hardest negative: the one that would be wrongly dropped at a low threshold).

Embeddings: ``pixels`` at ``feature_size`` 8, 16 and 32 (``pixel_embedding``), and fastdup's
own model via ``compute_features`` (``embedding: fastdup``; one fastdup run for every image of
every cell; skip it with ``--no-fastdup``). Every image is encoded (PNG, or JPEG for ``jpeg``)
and embedded from its bytes, exactly as curation does.

Pairwise candidate ``aligned``: ``tasks.curation.copy_score.copy_score`` (alignment-, blur- and
brightness-tolerant NCC; skip it with ``--no-aligned``), scored on exactly the same copies. It
re-scores candidate pairs, so its hardest distinct image of an original is the highest aligned
score among the original's top-5 same-class neighbours by ``pixels fs=8`` cosine (alignment can
lift a neighbour that was not the cosine's first). Its digits count: of the digits at 8 px, how
many have another digit at or above the threshold among their top-10 neighbours by that cosine.
Reported for every candidate: each cell x transformation at the one threshold of scope ``all``,
and whether the product requirement (precision >= 99%, recall >= 95% in every cell and
transformation, false drops <= 1% in every cell) is met there; for ``aligned``, microseconds
per pair and per signature.

Threshold: for each embedding and cell, the lowest threshold at which at most 1% of the
originals have their hardest distinct image at or above it (false drops <= 1%): recall of
copies is highest there. A scope (``all`` six cells, ``digits``, ``tiles``) gets one threshold,
the highest per-cell one in it, as curation runs with one number per deployment. Precision
counts a copy at or above the threshold as a true drop and an original's hardest distinct image
at or above it as a false drop (6 copies but 1 hardest negative per original, so precision is
optimistic; the false-drop rate is the number to hold). Also: for the digits at native 8 px,
how many have another digit at or above the threshold (all pairs of the pool: 1,797 in full
mode), and recall and false drops at the configured ``near_duplicate_threshold`` (and, for the
aligned score, the digits count at ``curation.copy_similarity``).

Usage: python bench/dedup_calibration.py [--quick] [--no-fastdup] [--no-aligned] [--seed 0] [--out PATH]
(prints Markdown tables, writes bench/results/dedup_calibration.json)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("FASTDUP_PRODUCTION", "1")
os.environ.setdefault("SENTRY_OPT_OUT", "1")

RESULTS = REPO / "bench" / "results" / "dedup_calibration.json"
TRANSFORMS = ("resize", "rescale", "jpeg", "brightness", "shift", "crop")
FEATURE_SIZES = (8, 16, 32)
MAX_FALSE_DROPS = 0.01
FLAT_STD = 8.0  # grey std (0..255) below which a tile counts as flat and is left out
# scikit-learn's two sample photos plus scikit-image's bundled photos (files inside the wheel).
SKIMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "brick", "grass",
                  "gravel", "hubble_deep_field", "immunohistochemistry", "retina")
SCOPES = {"all": ("digits", "tiles"), "digits": ("digits",), "tiles": ("tiles",)}
ALIGNED = "aligned"  # candidate name of tasks.curation.copy_score.copy_score
ALIGNED_BASE = "pixels fs=8"  # the embedding whose cosine proposes the candidate pairs the aligned score re-scores
ALIGNED_TOP_DISTINCT = 5  # hardest distinct for the aligned score: max over this many top same-class neighbours
DIGITS_TOP_NEIGHBOURS = 10  # digits count for the aligned score: each digit's top neighbours by base cosine
TARGET = {"precision": 0.99, "recall": 0.95, "false_drops": 0.01}  # the product requirement
CELLS = (("digits", 8), ("digits", 32), ("digits", 64), ("tiles", 32), ("tiles", 64), ("tiles", 128))

# Per mode: digits pool (all 1,797 in full), originals per cell, tile pool cap per photo and size.
MODES = {
    "quick": {"digits_pool": 500, "originals": 50, "tiles_per_photo": {32: 30, 64: 20, 128: 10}},
    "full": {"digits_pool": 1797, "originals": 250, "tiles_per_photo": {32: 120, 64: 60, 128: 30}},
}


# ---------------------------------------------------------------- images


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    if fmt == "PNG":
        kw.setdefault("compress_level", 1)
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _shift(img: Image.Image, dx: float, dy: float) -> Image.Image:
    """``img`` moved by (dx, dy) px (sub-pixel, bilinear), the uncovered border filled with edge pixels."""
    pad = int(math.ceil(max(abs(dx), abs(dy)))) + 1
    arr = np.asarray(img)
    widths = ((pad, pad), (pad, pad)) + (((0, 0),) if arr.ndim == 3 else ())
    padded = Image.fromarray(np.pad(arr, widths, mode="edge"), mode=img.mode)
    # output (x, y) reads input (x + pad - dx, y + pad - dy): the content moves by +dx, +dy
    return padded.transform(img.size, Image.AFFINE, (1, 0, pad - dx, 0, 1, pad - dy), resample=Image.BILINEAR)


def make_copy(img: Image.Image, kind: str, rng: np.random.Generator) -> tuple[bytes, dict]:
    """One planted copy of ``img`` by ``kind``: (encoded bytes, the drawn parameters)."""
    w, h = img.size
    if kind == "resize":
        f = float(rng.uniform(0.5, 0.8))
        small = img.resize((max(1, round(w * f)), max(1, round(h * f))), Image.BILINEAR)
        return _encode(small.resize((w, h), Image.BILINEAR)), {"factor": round(f, 3)}
    if kind == "rescale":
        f = float(rng.uniform(1.25, 2.0))
        return _encode(img.resize((round(w * f), round(h * f)), Image.BILINEAR)), {"factor": round(f, 3)}
    if kind == "jpeg":
        q = int(rng.integers(60, 91))
        return _encode(img, "JPEG", quality=q), {"quality": q}
    if kind == "brightness":
        f = float(1.0 + rng.choice([-1.0, 1.0]) * rng.uniform(0.10, 0.25))
        return _encode(ImageEnhance.Brightness(img).enhance(f)), {"factor": round(f, 3)}
    if kind == "shift":
        d = float(rng.uniform(0.02, 0.04)) * min(w, h)
        a = float(rng.uniform(0, 2 * math.pi))
        return _encode(_shift(img, d * math.cos(a), d * math.sin(a))), {"px": round(d, 3)}
    if kind == "crop":
        f = float(rng.uniform(0.05, 0.10))
        cw, ch = w * (1 - f), h * (1 - f)
        x0, y0 = float(rng.uniform(0, w - cw)), float(rng.uniform(0, h - ch))
        return _encode(img.resize((w, h), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))), {"fraction": round(f, 3)}
    raise ValueError(kind)


def _photos() -> list[tuple[str, np.ndarray]]:
    from skimage import data as skdata
    from sklearn.datasets import load_sample_images

    sample = load_sample_images()
    out = [(Path(f).stem, np.asarray(im)) for f, im in zip(sample.filenames, sample.images)]
    for name in SKIMAGE_PHOTOS:
        im = np.asarray(getattr(skdata, name)())
        if im.ndim == 3 and im.shape[2] == 4:
            im = im[:, :, :3]
        out.append((name, im.astype(np.uint8)))
    return out


@dataclass
class Cell:
    source: str
    size: int
    pool: list[bytes] = field(default_factory=list)  # distinct images, PNG
    labels: list[str] = field(default_factory=list)  # class of each pool image
    originals: list[int] = field(default_factory=list)  # pool indices that get copies
    copies: list[tuple[int, str, bytes, dict]] = field(default_factory=list)  # (pool index, kind, bytes, params)
    flat_left_out: int = 0

    @property
    def name(self) -> str:
        return f"{self.source} {self.size}px"


def build_cells(mode: dict, seed: int) -> list[Cell]:
    from tasks.data.sample_data import digits_arrays

    digits, digit_labels = digits_arrays()
    photos = _photos()
    cells = []
    for ci, (source, size) in enumerate(CELLS):
        rng = np.random.default_rng([seed, ci])
        cell = Cell(source, size)
        imgs: list[Image.Image] = []
        if source == "digits":
            pick = np.arange(len(digits))
            if mode["digits_pool"] < len(digits):
                pick = np.sort(rng.choice(len(digits), mode["digits_pool"], replace=False))
            for k in pick:
                img = Image.fromarray(digits[k], mode="L")
                if size != 8:
                    img = img.resize((size, size), Image.BILINEAR)
                imgs.append(img)
                cell.labels.append(str(int(digit_labels[k])))
        else:
            cap = mode["tiles_per_photo"][size]
            for name, im in photos:
                rgb = Image.fromarray(im)
                grey = np.asarray(rgb.convert("L"), dtype=np.float64)
                tiles = []
                for y in range(0, im.shape[0] - size + 1, size):
                    for x in range(0, im.shape[1] - size + 1, size):
                        if grey[y:y + size, x:x + size].std() < FLAT_STD:
                            cell.flat_left_out += 1
                        else:
                            tiles.append((x, y))
                if len(tiles) > cap:
                    tiles = [tiles[i] for i in np.sort(rng.choice(len(tiles), cap, replace=False))]
                for x, y in tiles:
                    imgs.append(rgb.crop((x, y, x + size, y + size)))
                    cell.labels.append(name)
        cell.pool = [_encode(img) for img in imgs]
        n_orig = min(mode["originals"], len(imgs))
        cell.originals = sorted(rng.choice(len(imgs), n_orig, replace=False).tolist())
        for i in cell.originals:
            for kind in TRANSFORMS:
                data, params = make_copy(imgs[i], kind, rng)
                cell.copies.append((i, kind, data, params))
        cells.append(cell)
    return cells


# ---------------------------------------------------------------- embeddings


def _unit(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    n = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(n == 0, 1.0, n)


def pixel_embeddings(cells: list[Cell], size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from tasks.curation.curation_features import pixel_embedding

    out = []
    for cell in cells:
        pool = _unit(np.stack([pixel_embedding(b, size) for b in cell.pool]))
        copies = _unit(np.stack([pixel_embedding(c[2], size) for c in cell.copies]))
        out.append((pool, copies))
    return out


@contextlib.contextmanager
def _stdout_to_stderr():
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def fastdup_embeddings(cells: list[Cell], seed: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """fastdup's model for every image of every cell in ONE ``compute_features`` call (NaN rows: fastdup refused)."""
    from tasks.curation.curation_features import compute_features
    from tasks.settings import load_settings

    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-dedup-"))
    try:
        settings = load_settings("sit", home=root / "home")
        cfg = settings.curation.model_copy(update={"embedding": "fastdup"})
        items: list[tuple[str, bytes]] = []
        for ci, cell in enumerate(cells):
            items += [(f"c{ci}p{i:06d}", b) for i, b in enumerate(cell.pool)]
            items += [(f"c{ci}k{i:06d}", c[2]) for i, c in enumerate(cell.copies)]
        start = time.perf_counter()
        with _stdout_to_stderr():  # fastdup's banner and progress bar: keep stdout Markdown only
            table = compute_features(items, cfg, root / "work", run_id=f"bench-dedup-{seed}")
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = table.column("sha256").to_pylist()
    embs = table.column("embedding").to_pylist()
    errors = [e for e in table.column("error").to_pylist() if e]
    dim = next(len(e) for e in embs if e is not None)
    by_key = {k: (np.asarray(e, dtype=np.float64) if e is not None else np.full(dim, np.nan))
              for k, e in zip(keys, embs)}
    out = []
    for ci, cell in enumerate(cells):
        pool = _unit(np.stack([by_key[f"c{ci}p{i:06d}"] for i in range(len(cell.pool))]))
        copies = _unit(np.stack([by_key[f"c{ci}k{i:06d}"] for i in range(len(cell.copies))]))
        out.append((pool, copies))
    info = {"images": len(items), "seconds": round(seconds, 1), "errors": len(errors), "dim": dim,
            "error_examples": sorted(set(errors))[:3]}
    return out, info


# ---------------------------------------------------------------- measuring


def hardest_distinct(pool: np.ndarray, labels: list[str], rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For each pool row in ``rows``: the highest cosine to another pool image of the same class, and its index."""
    lab = np.asarray(labels)
    sims = pool[rows] @ pool.T
    same = lab[rows][:, None] == lab[None, :]
    sims = np.where(same, sims, -np.inf)
    sims[np.arange(len(rows)), rows] = -np.inf
    sims = np.nan_to_num(sims, nan=-np.inf)
    j = sims.argmax(axis=1)
    return sims[np.arange(len(rows)), j], j


def threshold_for(hard: np.ndarray, max_rate: float = MAX_FALSE_DROPS) -> float:
    """Lowest threshold with at most ``max_rate`` of ``hard`` at or above it."""
    h = np.sort(hard[np.isfinite(hard)])[::-1]
    allowed = int(math.floor(max_rate * len(h)))
    if allowed >= len(h):
        return -1.0
    return float(np.nextafter(h[allowed], np.inf))


def score(copy_sims: np.ndarray, hard: np.ndarray, t: float) -> dict:
    c = np.nan_to_num(copy_sims, nan=-np.inf)
    tp = int((c >= t).sum())
    fp = int((hard >= t).sum())
    return {"threshold": t, "recall": tp / len(c), "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "false_drop_rate": fp / len(hard), "copies_dropped": tp, "copies": len(c), "false_drops": fp,
            "originals": len(hard)}


def _q(x: np.ndarray, p: float) -> float:
    return float(np.percentile(x, p)) if len(x) else float("nan")


def measure(cell: Cell, pool: np.ndarray, copies: np.ndarray) -> dict:
    hard, _ = hardest_distinct(pool, cell.labels, cell.originals)
    orig = np.asarray([c[0] for c in cell.copies])
    return measure_sims(cell, np.einsum("ij,ij->i", copies, pool[orig]), hard)


def measure_sims(cell: Cell, copy_sims: np.ndarray, hard: np.ndarray) -> dict:
    """Summary of one cell from each copy's similarity to its original and each original's hardest distinct one."""
    rows = cell.originals
    row_of = {r: k for k, r in enumerate(rows)}
    kinds = np.asarray([c[1] for c in cell.copies])
    per_kind = {}
    for kind in TRANSFORMS:
        s = np.nan_to_num(copy_sims[kinds == kind], nan=-1.0)
        per_kind[kind] = {"min": float(s.min()), "p1": _q(s, 1), "p5": _q(s, 5), "median": _q(s, 50)}
    all_copies = np.nan_to_num(copy_sims, nan=-1.0)
    t = threshold_for(hard)
    return {
        "cell": cell.name, "pool": len(cell.pool), "classes": len(set(cell.labels)), "originals": len(rows),
        "flat_left_out": cell.flat_left_out,
        "copies": per_kind,
        "copies_all": {"min": float(all_copies.min()), "p1": _q(all_copies, 1), "p5": _q(all_copies, 5),
                       "median": _q(all_copies, 50)},
        "hardest_distinct": {"median": _q(hard, 50), "p95": _q(hard, 95), "p99": _q(hard, 99),
                             "max": float(hard.max())},
        "best": score(copy_sims, hard, t),
        "_copy_sims": copy_sims, "_hard": hard, "_row_of": row_of,
    }


def digits_at_threshold(pool: np.ndarray, labels: list[str], t: float) -> dict:
    """Of all pool digits: how many have another digit at cosine >= t (same label, any label), and exact matches."""
    sims = pool @ pool.T
    np.fill_diagonal(sims, -np.inf)
    sims = np.nan_to_num(sims, nan=-np.inf)
    lab = np.asarray(labels)
    same = lab[:, None] == lab[None, :]
    return {"threshold": t, "digits": len(labels),
            "with_same_label_match": int(((sims >= t) & same).any(axis=1).sum()),
            "with_any_label_match": int((sims >= t).any(axis=1).sum()),
            "with_other_label_match": int(((sims >= t) & ~same).any(axis=1).sum()),
            "pairs_same_label": int((((sims >= t) & same).sum()) // 2)}


# ---------------------------------------------------------------- aligned copy score (tasks.curation.copy_score)


def top_distinct(pool: np.ndarray, labels: list[str], rows: list[int], k: int) -> np.ndarray:
    """For each pool row in ``rows``: its ``k`` most similar other pool images of the same class (highest cosine first)."""
    lab = np.asarray(labels)
    sims = pool[rows] @ pool.T
    sims = np.where(lab[rows][:, None] == lab[None, :], sims, -np.inf)
    sims[np.arange(len(rows)), rows] = -np.inf
    sims = np.nan_to_num(sims, nan=-np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


class AlignedScorer:
    """``copy_signature`` once per image (cached by cell and pool index), ``copy_score`` per pair, both timed."""

    def __init__(self) -> None:
        from tasks.curation import copy_score as copy_similarity

        self.cs = copy_similarity
        self.sigs: dict[tuple[int, int], np.ndarray] = {}
        self.sig_seconds = 0.0
        self.signatures = 0
        self.pair_seconds = 0.0
        self.pairs = 0

    def signature(self, data: bytes) -> np.ndarray:
        start = time.perf_counter()
        sig = self.cs.copy_signature(data)
        self.sig_seconds += time.perf_counter() - start
        self.signatures += 1
        return sig

    def pool_sig(self, ci: int, cell: Cell, i: int) -> np.ndarray:
        if (ci, i) not in self.sigs:
            self.sigs[(ci, i)] = self.signature(cell.pool[i])
        return self.sigs[(ci, i)]

    def score(self, a: np.ndarray, b: np.ndarray) -> float:
        start = time.perf_counter()
        out = self.cs.copy_score(a, b)
        self.pair_seconds += time.perf_counter() - start
        self.pairs += 1
        return out


def measure_aligned(cells: list[Cell], base: list[tuple[np.ndarray, np.ndarray]], scorer: AlignedScorer,
                    k: int = ALIGNED_TOP_DISTINCT) -> tuple[list[dict], list[np.ndarray]]:
    """The aligned score on the same copies and hardest distinct images as the embeddings.

    Hardest distinct: the ``k`` same-class images with the highest base (``pixels fs=8``) cosine,
    scored by the aligned score, the highest kept (alignment can lift a neighbour that was not the
    cosine's top one). Also returned per cell: the aligned scores of all ``k`` candidates.
    """
    measured, hard_all = [], []
    for ci, (cell, (pool, _)) in enumerate(zip(cells, base)):
        top = top_distinct(pool, cell.labels, cell.originals, k)
        hard_k = np.asarray([[scorer.score(scorer.pool_sig(ci, cell, r), scorer.pool_sig(ci, cell, int(j))) for j in tj]
                             for r, tj in zip(cell.originals, top)])
        copy_sims = np.asarray([scorer.score(scorer.signature(data), scorer.pool_sig(ci, cell, i))
                                for i, _, data, _ in cell.copies])
        m = measure_sims(cell, copy_sims, hard_k.max(axis=1))
        top1 = hard_k[:, 0]
        m["hardest_distinct_top1_only"] = {"p99": _q(top1, 99), "max": float(top1.max()),
                                           "originals_where_top5_raised_it": int((hard_k.max(axis=1) > top1).sum())}
        measured.append(m)
        hard_all.append(hard_k)
    return measured, hard_all


def digits_top_neighbours(cell: Cell, pool: np.ndarray, scorer: AlignedScorer, thresholds: dict[str, float],
                          k: int = DIGITS_TOP_NEIGHBOURS) -> dict:
    """Digits at 8 px: how many have another digit at or above each threshold among their ``k`` nearest by base cosine."""
    sims = pool @ pool.T
    np.fill_diagonal(sims, -np.inf)
    sims = np.nan_to_num(sims, nan=-np.inf)
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    pairs = {tuple(sorted((int(i), int(j)))) for i in range(len(top)) for j in top[i]}
    score = {p: scorer.score(scorer.pool_sig(0, cell, p[0]), scorer.pool_sig(0, cell, p[1])) for p in sorted(pairs)}
    lab = np.asarray(cell.labels)
    out = {}
    for name, t in thresholds.items():
        hit = [(i, j) for (i, j), v in score.items() if v >= t]
        same = [(i, j) for i, j in hit if lab[i] == lab[j]]
        out[name] = {"threshold": t, "digits": len(top), "neighbours_per_digit": k, "pairs_scored": len(score),
                     "with_any_label_match": len({x for p in hit for x in p}),
                     "with_same_label_match": len({x for p in same for x in p}),
                     "with_other_label_match": len({x for p in hit if lab[p[0]] != lab[p[1]] for x in p}),
                     "pairs_at_or_above": len(hit), "pairs_same_label": len(same),
                     "examples": [(i, j, lab[i], lab[j], round(score[(i, j)], 5)) for i, j in sorted(
                         hit, key=lambda p: -score[p])[:5]]}
    return out


def by_transform(copy_sims: np.ndarray, kinds: np.ndarray, hard: np.ndarray, t: float) -> dict:
    """Recall, precision and false drops of each transformation's copies at ``t`` (false drops: the same originals)."""
    return {kind: score(copy_sims[kinds == kind], hard, t) for kind in TRANSFORMS}


# ---------------------------------------------------------------- report


def _f(x: float, nd: int = 3) -> str:
    return "nan" if x != x else f"{x:.{nd}f}"


def _aligned_config() -> dict:
    from tasks.curation import copy_score as cs

    names = ("GRID", "MARGIN", "TAPER", "SIGMA", "FINE_SCALES", "FINE_SHIFTS", "COARSE_SCALE_STEP",
             "COARSE_SHIFT_STEP", "COARSE_BLURS", "REFINE_SCALE", "REFINE_SHIFT", "BLURS", "RHO0", "RHO_MIN",
             "RHO_MAX", "CLIP_LEVELS", "CLIP_IF_MAX", "JPEG_QUALITIES", "MAX_ASPECT_RATIO")
    return {n: getattr(cs, n) for n in names}


def main() -> None:
    args = _parse_args()
    mode_name = "quick" if args.quick else "full"
    mode = MODES[mode_name]
    t0 = time.perf_counter()
    load_before = os.getloadavg()

    cells = build_cells(mode, args.seed)
    build_s = time.perf_counter() - t0
    embeddings: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    timings: dict[str, float] = {"build_images": round(build_s, 1)}
    for fs in FEATURE_SIZES:
        s = time.perf_counter()
        embeddings[f"pixels fs={fs}"] = pixel_embeddings(cells, fs)
        timings[f"pixels fs={fs}"] = round(time.perf_counter() - s, 1)
    fastdup_info = None
    if not args.no_fastdup:
        with _stdout_to_stderr():
            import fastdup  # noqa: F401  (import outside the timing; it prints a banner)

        embeddings["fastdup"], fastdup_info = fastdup_embeddings(cells, args.seed)
        timings["fastdup"] = fastdup_info["seconds"]

    from tasks.settings import load_settings

    conf = load_settings("sit", home=Path(tempfile.gettempdir()) / "cd4ml-bench-dedup-conf").curation
    measured_by = {emb: [measure(cell, pool, copies) for cell, (pool, copies) in zip(cells, per_cell)]
                   for emb, per_cell in embeddings.items()}
    scorer = None
    if not args.no_aligned:
        s = time.perf_counter()
        scorer = AlignedScorer()
        measured_by[ALIGNED], _ = measure_aligned(cells, embeddings[ALIGNED_BASE], scorer)
        timings[ALIGNED] = round(time.perf_counter() - s, 1)
    results = {emb: calibrate(emb, measured, cells, embeddings, scorer, conf, timings)
               for emb, measured in measured_by.items()}

    print(f"# Dedup calibration ({mode_name}, seed {args.seed})\n")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {load_before[0]:.1f} at start; "
          f"timings (s): {timings}" + (f"; fastdup {fastdup_info}" if fastdup_info else "") + "\n")
    print("Pools: " + "; ".join(f"{c.name}: {len(c.pool)} images / {len(set(c.labels))} classes, "
                                 f"{len(c.originals)} originals x {len(TRANSFORMS)} copies"
                                 + (f", {c.flat_left_out} flat tiles left out" if c.source == "tiles" else "")
                                 for c in cells) + "\n")
    print_per_cell(results)
    print_thresholds(results)
    if ALIGNED in results:
        print_aligned(results[ALIGNED])
    print_digits_and_configured(results)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"mode": mode_name, "seed": args.seed, "config": {**mode, "transforms": TRANSFORMS, "cells": CELLS,
                                                                  "feature_sizes": FEATURE_SIZES, "flat_std": FLAT_STD,
                                                                  "max_false_drops": MAX_FALSE_DROPS,
                                                                  "photos": ["china", "flower", *SKIMAGE_PHOTOS]},
               "load_average_start": load_before[0], "timings_s": timings, "fastdup": fastdup_info,
               "aligned_config": _aligned_config() if scorer is not None else None,
               "copy_params_example": {k: [c[3] for c in cells[3].copies if c[1] == k][:3] for k in TRANSFORMS},
               "results": results, "total_seconds": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(payload, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    print(f"\nwrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out} "
          f"in {payload['total_seconds']} s")



def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sample (under ~2 minutes)")
    parser.add_argument("--no-fastdup", action="store_true", help="pixel embeddings only")
    parser.add_argument("--no-aligned", action="store_true", help="skip the aligned copy score (tasks.curation.copy_score)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args()


def calibrate(emb: str, measured: list[dict], cells: list[Cell], embeddings: dict, scorer: AlignedScorer | None,
              conf, timings: dict[str, float]) -> dict:
    """One embedding's results: a threshold per scope, every cell at the "all" threshold, the target, digits."""
    conf_thresholds = {"near_duplicate_threshold": conf.near_duplicate_threshold}
    # One threshold per scope: the highest per-cell one, so every cell in it keeps false drops <= 1%.
    scopes = {}
    for scope, sources in SCOPES.items():
        picked = [(m, cell) for m, cell in zip(measured, cells) if cell.source in sources]
        t = max(m["best"]["threshold"] for m, _ in picked)
        by_cell = [{"cell": m["cell"], **score(m["_copy_sims"], m["_hard"], t)} for m, _ in picked]
        copies_all = np.concatenate([m["_copy_sims"] for m, _ in picked])
        hard_all = np.concatenate([m["_hard"] for m, _ in picked])
        recall_by_kind = {}
        for kind in TRANSFORMS:
            sims = np.concatenate([np.nan_to_num(m["_copy_sims"], nan=-1.0)[np.asarray([c[1] == kind
                                                                                     for c in cell.copies])]
                                   for m, cell in picked])
            recall_by_kind[kind] = float((sims >= t).mean())
        scopes[scope] = {"threshold": t, "pooled": score(copies_all, hard_all, t), "by_cell": by_cell,
                         "recall_by_transform": recall_by_kind,
                         "worst_cell": min(by_cell, key=lambda x: x["recall"])["cell"],
                         "min_cell_recall": min(b["recall"] for b in by_cell),
                         "max_cell_false_drop_rate": max(b["false_drop_rate"] for b in by_cell)}
    copies_all = np.concatenate([m["_copy_sims"] for m in measured])
    hard_all = np.concatenate([m["_hard"] for m in measured])
    # Every cell and transformation at the one threshold of scope "all" (the product runs one number).
    t_all = scopes["all"]["threshold"]
    at_all = []
    for m, cell in zip(measured, cells):
        kinds = np.asarray([c[1] for c in cell.copies])
        at_all.append({"cell": m["cell"], "all": score(m["_copy_sims"], m["_hard"], t_all),
                       "by_transform": by_transform(m["_copy_sims"], kinds, m["_hard"], t_all)})
    misses = [(a["cell"], kind, round(v["recall"], 3)) for a in at_all for kind, v in a["by_transform"].items()
              if v["recall"] < TARGET["recall"]]
    pooled_all = scopes["all"]["pooled"]
    target = {**TARGET, "threshold": t_all, "pooled_precision": pooled_all["precision"],
              "min_cell_transform_recall": min(v["recall"] for a in at_all for v in a["by_transform"].values()),
              "max_cell_false_drop_rate": scopes["all"]["max_cell_false_drop_rate"],
              "recall_misses": misses,
              "met": bool(not misses and pooled_all["precision"] >= TARGET["precision"]
                          and scopes["all"]["max_cell_false_drop_rate"] <= TARGET["false_drops"])}
    configured: dict = {}
    if emb == ALIGNED:  # cosine settings and all-pairs counts do not apply: digits' top neighbours instead
        digits = {}
        s = time.perf_counter()
        top_neighbours = digits_top_neighbours(cells[0], embeddings[ALIGNED_BASE][0][0], scorer,
                                               {"all": t_all, "digits": scopes["digits"]["threshold"],
                                                "copy_similarity": conf.copy_similarity})
        timings[f"{ALIGNED} digits top-{DIGITS_TOP_NEIGHBOURS}"] = round(time.perf_counter() - s, 1)
        cost = {"pairs": scorer.pairs, "us_per_pair": round(1e6 * scorer.pair_seconds / max(scorer.pairs, 1), 1),
                "signatures": scorer.signatures,
                "us_per_signature": round(1e6 * scorer.sig_seconds / max(scorer.signatures, 1), 1)}
        for m in measured:
            for k in ("_copy_sims", "_hard", "_row_of"):
                m.pop(k)
        return {"cells": measured, "scopes": scopes, "at_all_threshold": at_all, "target": target,
                "digits_8px_all_pairs": digits, "digits_8px_top_neighbours": top_neighbours,
                "configured": configured, "cost": cost, "base": ALIGNED_BASE, "top_distinct": ALIGNED_TOP_DISTINCT}
    digits_pool = embeddings[emb][0][0]  # digits at native 8 px: all 1,797 in full mode
    digits = {name: digits_at_threshold(digits_pool, cells[0].labels, t) for name, t in
              [("all", scopes["all"]["threshold"]), ("digits", scopes["digits"]["threshold"]),
               ("near_duplicate_threshold", conf_thresholds["near_duplicate_threshold"])]}
    for name, t in conf_thresholds.items():
        by_cell = [score(m["_copy_sims"], m["_hard"], t) for m in measured]
        configured[name] = {"threshold": t, "pooled": score(copies_all, hard_all, t),
                            "min_cell_recall": min(b["recall"] for b in by_cell),
                            "max_cell_false_drop_rate": max(b["false_drop_rate"] for b in by_cell)}
    for m in measured:
        for k in ("_copy_sims", "_hard", "_row_of"):
            m.pop(k)
    return {"cells": measured, "scopes": scopes, "at_all_threshold": at_all, "target": target,
            "digits_8px_all_pairs": digits, "configured": configured}


def print_per_cell(results: dict[str, dict]) -> None:
    print("## Per cell: hardest distinct vs copies, and the best threshold (false drops <= 1%)\n")
    print("| embedding | cell | distinct median / p95 / p99 / max | copies min / p1 / p5 | threshold | recall "
          "| precision | false drops |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for emb, r in results.items():
        for m in r["cells"]:
            h, c, b = m["hardest_distinct"], m["copies_all"], m["best"]
            print(f"| {emb} | {m['cell']} | {_f(h['median'])} / {_f(h['p95'])} / {_f(h['p99'])} / {_f(h['max'])} "
                  f"| {_f(c['min'])} / {_f(c['p1'])} / {_f(c['p5'])} | {_f(b['threshold'], 4)} | {_f(b['recall'])} "
                  f"| {_f(b['precision'])} | {_f(b['false_drop_rate'])} |")
    print("\n## Copies vs original, per transformation: p1 / median (min)\n")
    print("| embedding | cell | " + " | ".join(TRANSFORMS) + " |")
    print("|---|---|" + "---|" * len(TRANSFORMS))
    for emb, r in results.items():
        for m in r["cells"]:
            cols = [f"{_f(m['copies'][k]['p1'])} / {_f(m['copies'][k]['median'])} ({_f(m['copies'][k]['min'])})"
                    for k in TRANSFORMS]
            print(f"| {emb} | {m['cell']} | " + " | ".join(cols) + " |")


def print_thresholds(results: dict[str, dict]) -> None:
    print("\n## One threshold per scope (the highest per-cell threshold in it: every cell keeps false drops <= 1%)\n")
    print("| embedding | scope | threshold | pooled recall | pooled precision | pooled false drops | worst-cell recall "
          "| worst-cell false drops | recall by transform |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for emb, r in results.items():
        for scope, g in r["scopes"].items():
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in g["recall_by_transform"].items())
            print(f"| {emb} | {scope} | {_f(g['threshold'], 4)} | {_f(g['pooled']['recall'])} "
                  f"| {_f(g['pooled']['precision'])} | {_f(g['pooled']['false_drop_rate'])} "
                  f"| {_f(g['min_cell_recall'])} ({g['worst_cell']}) | {_f(g['max_cell_false_drop_rate'])} | {kinds} |")
    print("\n## Every cell and transformation at the one threshold of scope \"all\": recall by transformation, "
          "and the cell's precision and false drops\n")
    print("| embedding | threshold | cell | " + " | ".join(TRANSFORMS) + " | all copies | precision | false drops |")
    print("|---|---:|---|" + "---:|" * (len(TRANSFORMS) + 3))
    for emb, r in results.items():
        for a in r["at_all_threshold"]:
            cols = " | ".join(_f(a["by_transform"][k]["recall"]) for k in TRANSFORMS)
            print(f"| {emb} | {_f(r['target']['threshold'], 4)} | {a['cell']} | {cols} | {_f(a['all']['recall'])} "
                  f"| {_f(a['all']['precision'])} | {_f(a['all']['false_drop_rate'])} |")
    print(f"\n## Product requirement (precision >= {TARGET['precision']}, recall >= {TARGET['recall']} in every cell and "
          f"transformation, false drops <= {TARGET['false_drops']} in every cell), at the \"all\" threshold\n")
    print("| embedding | threshold | met | pooled precision | lowest cell x transformation recall "
          "| worst-cell false drops | misses (cell, transformation, recall) |")
    print("|---|---:|---|---:|---:|---:|---|")
    for emb, r in results.items():
        g = r["target"]
        misses = "; ".join(f"{c} {k} {v:.2f}" for c, k, v in g["recall_misses"][:8])
        more = len(g["recall_misses"]) - 8
        print(f"| {emb} | {_f(g['threshold'], 4)} | {'yes' if g['met'] else 'no'} | {_f(g['pooled_precision'])} "
              f"| {_f(g['min_cell_transform_recall'])} | {_f(g['max_cell_false_drop_rate'])} "
              f"| {misses}{f' (+{more} more)' if more > 0 else ''} |")


def print_aligned(r: dict) -> None:
    c = r["cost"]
    print(f"\n## Aligned copy score (tasks.curation.copy_score.copy_score, re-scoring pairs proposed by {ALIGNED_BASE})\n")
    print(f"Cost: {c['us_per_pair']} us per pair over {c['pairs']} pairs; {c['us_per_signature']} us per "
          f"signature over {c['signatures']} images (one core, load average {os.getloadavg()[0]:.1f} now). "
          f"Hardest distinct = max of the aligned score over the top-{ALIGNED_TOP_DISTINCT} same-class neighbours "
          f"by {ALIGNED_BASE} cosine.\n")
    print("| cell | hardest distinct p99 / max (top-5) | top-1 only p99 / max | originals where top-5 raised it |")
    print("|---|---|---|---:|")
    for m in r["cells"]:
        h, h1 = m["hardest_distinct"], m["hardest_distinct_top1_only"]
        print(f"| {m['cell']} | {_f(h['p99'], 4)} / {_f(h['max'], 4)} | {_f(h1['p99'], 4)} / {_f(h1['max'], 4)} "
              f"| {h1['originals_where_top5_raised_it']} |")
    print(f"\nDigits at native 8 px, each digit's top-{DIGITS_TOP_NEIGHBOURS} neighbours by {ALIGNED_BASE} cosine "
          "(any label), aligned score at or above the threshold:\n")
    print("| threshold (scope) | digits | pairs scored | with any match | with a same-label match "
          "| with an other-label match | pairs at or above | top pairs (i, j, labels, score) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, d in r["digits_8px_top_neighbours"].items():
        ex = "; ".join(f"{i}-{j} ({a}/{b}) {v:.4f}" for i, j, a, b, v in d["examples"][:3])
        print(f"| {_f(d['threshold'], 4)} ({name}) | {d['digits']} | {d['pairs_scored']} "
              f"| {d['with_any_label_match']} | {d['with_same_label_match']} | {d['with_other_label_match']} "
              f"| {d['pairs_at_or_above']} | {ex} |")


def print_digits_and_configured(results: dict[str, dict]) -> None:
    print("\n## Digits at native 8 px, all pairs: digits with another digit at or above the threshold\n")
    print("| embedding | threshold (scope) | digits | with a same-label match | with any match | same-label pairs |")
    print("|---|---|---:|---:|---:|---:|")
    for emb, r in results.items():
        for name, d in r["digits_8px_all_pairs"].items():
            print(f"| {emb} | {_f(d['threshold'], 4)} ({name}) | {d['digits']} | {d['with_same_label_match']} "
                  f"| {d['with_any_label_match']} | {d['pairs_same_label']} |")
    print("\n## At the configured threshold (conf: curation.near_duplicate_threshold)\n")
    print("| embedding | setting | threshold | pooled recall | worst-cell recall | pooled false drops "
          "| worst-cell false drops |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for emb, r in results.items():
        for name, c in r["configured"].items():
            print(f"| {emb} | {name} | {c['threshold']} | {_f(c['pooled']['recall'])} | {_f(c['min_cell_recall'])} "
                  f"| {_f(c['pooled']['false_drop_rate'])} | {_f(c['max_cell_false_drop_rate'])} |")


if __name__ == "__main__":
    main()
