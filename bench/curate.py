"""Curation of 10,000 images against the bare fastdup call on the same folder, then a 1% batch.

In one process, after one warm-up import of fastdup (so no row pays the ~1.3 s import):

* bare fastdup: ``fastdup.create(work_dir, input_dir=folder).run()`` with its defaults (its
  own model, statistics, HNSW k-NN, components): the floor a fastdup-based curation pays;
* full curation, ``embedding: fastdup`` (the comparable mode: the same model over the same
  images) and ``embedding: pixels`` (the default for digits), each in its own CD4ML_HOME, so
  each starts with no stored features and no assignment record;
* the same two modes after 1% new images are added and ingested (incremental).

Ingest is not timed (it is the step before). Images: 32x32 grey PNGs derived from the real
digits (random rotation, shift, scale and pixel noise, so most are distinct), plus planted
near-duplicates (JPEG re-encodes and brightened copies, 2%) and bad images (0.2%: black,
white, blurred). The new batch is 1% more of the same kind.

Usage: python bench/curate.py [--images 10000] [--new-share 0.01] [--keep]   (prints a Markdown table)
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("FASTDUP_PRODUCTION", "1")
os.environ.setdefault("SENTRY_OPT_OUT", "1")


def _augmented(src: np.ndarray, rng: np.random.Generator) -> Image.Image:
    img = Image.fromarray(src, mode="L").resize((32, 32), Image.BILINEAR)
    tx, ty = rng.uniform(-3, 3, 2)
    img = img.rotate(rng.uniform(-15, 15), resample=Image.BILINEAR, translate=(tx, ty))
    side = int(round(32 * rng.uniform(0.85, 1.15)))
    scaled = img.resize((side, side), Image.BILINEAR)
    canvas = Image.new("L", (32, 32))
    canvas.paste(scaled, ((32 - side) // 2, (32 - side) // 2))
    noisy = np.asarray(canvas, dtype=np.float32) + rng.normal(0, 10, (32, 32))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), mode="L")


def _save(folder: Path, label: int, name: str, img: Image.Image, fmt: str = "PNG", **kw) -> Path:
    target = folder / str(label) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    target.write_bytes(buf.getvalue())
    return target


def _photo(img: Image.Image, side: int, rng: np.random.Generator) -> Image.Image:
    """A 32x32 grey image as a ``side`` x ``side`` colour one whose PNG is about a photo's size (faint colour noise:
    about 100 KB at 256 px); the identity at 32 px."""
    if side == 32:
        return img
    grey = np.asarray(img.resize((side, side), Image.BICUBIC), dtype=np.int16)[..., None]
    noisy = grey + rng.integers(-8, 9, (side, side, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), mode="RGB")


def write_images(folder: Path, n: int, seed: int, prefix: str, side: int = 32) -> dict[str, int]:
    """``n`` images under ``folder/<label>/``: 97.8% augmented digits, 2% near-copies, 0.2% bad; ``side`` px a side
    (32: grey, the default; more: colour, about a photo's bytes: ``_photo``)."""
    from tasks.data.sample_data import digits_arrays

    images, labels = digits_arrays()
    rng = np.random.default_rng(seed)

    def save(folder: Path, label: int, name: str, img: Image.Image, fmt: str = "PNG", **kw) -> Path:
        return _save(folder, label, name, _photo(img, side, rng), fmt, **kw)

    n_bad = max(1, n // 500)
    n_dup = max(1, n // 50)
    n_base = n - n_bad - n_dup
    made: list[tuple[Image.Image, int]] = []
    for i in range(n_base):
        k = int(rng.integers(len(images)))
        img = _augmented(images[k], rng)
        save(folder, int(labels[k]), f"{prefix}{i:06d}.png", img)
        made.append((img, int(labels[k])))
    for i in range(n_dup):
        img, label = made[int(rng.integers(len(made)))]
        if i % 2:
            save(folder, label, f"{prefix}dup{i:05d}.jpg", img, "JPEG", quality=90)
        else:
            save(folder, label, f"{prefix}dup{i:05d}.png", ImageEnhance.Brightness(img).enhance(1.1))
    for i in range(n_bad):  # faint noise keeps the bytes unique: identical files under two labels are ingest rejects
        img, label = made[i]
        faint = rng.integers(0, 4, (32, 32)).astype(np.uint8)
        bad = [Image.fromarray(faint, mode="L"), Image.fromarray(255 - faint, mode="L"),
               img.filter(ImageFilter.GaussianBlur(3))]
        save(folder, label, f"{prefix}bad{i:05d}.png", bad[i % 3])
    return {"augmented": n_base, "near_copies": n_dup, "bad": n_bad}


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--new-share", type=float, default=0.01)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    import fastdup  # warm import: every timed row below starts with fastdup loaded

    from tasks.curation.curate import curate
    from tasks.data.ingest import ingest_landing
    from tasks.settings import load_settings

    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-curate-"))
    landing = root / "landing"
    mix = write_images(landing, args.images, seed=1, prefix="a")
    load_before = os.getloadavg()

    bare_seconds, _ = _timed(lambda: fastdup.create(work_dir=str(root / "bare"), input_dir=str(landing)).run())

    modes = ("fastdup", "pixels")
    settings = {}
    full: dict[str, tuple[float, object]] = {}
    for mode in modes:
        base = load_settings("sit", home=root / f"home_{mode}")
        settings[mode] = base.model_copy(update={"curation": base.curation.model_copy(update={"embedding": mode})})
        raw = ingest_landing(settings[mode], run_id="bench-1", logical_date="2026-11-21", landing=landing).raw_version
        full[mode] = _timed(lambda m=mode, r=raw: curate(settings[m], r, run_id="bench-full", logical_date="2026-11-21"))

    new = max(1, int(round(args.images * args.new_share)))
    batch = write_images(landing, new, seed=2, prefix="b")
    incremental: dict[str, tuple[float, object]] = {}
    for mode in modes:
        raw = ingest_landing(settings[mode], run_id="bench-2", logical_date="2026-11-22", landing=landing).raw_version
        incremental[mode] = _timed(lambda m=mode, r=raw: curate(settings[m], r, run_id="bench-inc",
                                                                logical_date="2026-11-22"))
    load_after = os.getloadavg()

    print(f"\n{args.images:,} images ({mix}), then {new} new ({batch}); {os.cpu_count()} cores, "
          f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after; fastdup {fastdup.__version__}\n")
    print("| run | seconds | vs bare fastdup | vs own full run | kept | dropped by reason |")
    print("|---|---|---|---|---|---|")
    print(f"| bare `fastdup.create(...).run()` ({args.images:,}) | {bare_seconds:.1f} | 1.00x | - | - | - |")
    for label, results in (("full curation", full), (f"+{new} new images", incremental)):
        for mode in modes:
            seconds, result = results[mode]
            own = "-" if results is full else f"{seconds / full[mode][0]:.1%}"
            print(f"| {label}, `embedding: {mode}` | {seconds:.1f} | {seconds / bare_seconds:.2f}x | {own} | "
                  f"{result.kept:,} | {result.dropped_by_reason} |")
    if args.keep:
        print(f"\nkept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
