"""Curation on image families it was not tuned on: distinct images lost, planted copies found, classes abstained.

Real images that ship inside installed packages (nothing is downloaded), chosen to be hard for copy
detection; class = the label a team would give them:

* calibration families (``copy_similarity`` and ``copy_min_separation`` were set on these):
  ``digits 8px`` (scikit-learn's digits, native), ``digits 32px`` (upscaled bilinear),
  ``photos 32-64px`` (tiles of china, flower and astronaut; class = photo);
* held out: ``strokes 28px`` (pen strokes drawn at 4x and reduced to 28 px: class 1 one straight
  stroke, class 7 a bar and a slanted stroke, class 0 an ellipse outline, each with its own width
  (0.75-2.5 px), slant, length and place: thin single strokes by different "writers" on a uniform
  background, the complaint's case), ``glyphs 28px`` (the digits 0-9 rendered with Pillow's bundled
  font at random sizes, offsets, slants and stroke widths), ``textures 32/64px`` (non-overlapping
  tiles of scikit-image's brick, grass and gravel; class = texture), ``faces 25px``
  (scikit-image's ``lfw_subset``: 100 faces and 100 non-faces), ``photos 48-150px`` (a team's
  colour photos: 2 classes, warm = coffee, chelsea, astronaut and cool = rocket, china, flower,
  tiles of 48, 96 and 150 px).

Each family: a pool of distinct images (tiles never overlap; no image is planted twice) lands,
is ingested into a fresh home and curated (raw v1, as ``cd4ml_curate`` does); then one planted
copy of ``COPY_SHARE`` of the pool images (the transformation cycles through resize, rescale,
jpeg, brightness, shift, crop: ``bench.dedup_calibration.make_copy``) lands and the raw version
holding both is curated (raw v2). Counted from the second curation's report rows and JSON:
distinct images dropped as ``near_duplicate`` (of the family and of its worst class), recall of
planted copies (dropped as a duplicate of their own original) in the classes where the rule did
not abstain, classes where it abstained and why; and the same family with the pair threshold alone
(``copy_min_separation`` off: the rule before), in the same run, as the baseline. Bad-image rules
are off (``min_blur`` 0, ``min_mean`` 0, ``max_mean`` 255, and no relative rule: ``relative_min_images``
above any pool): this measures duplicates. ``max_class_drop_share`` is 1 here, so the numbers are the separation rule's alone;
planted copies are 12% of each class, far above the default guard's 2%, and the column
"guard 2%" says which classes the default guard would have abstained in on top (it can only
keep more). A last row curates the full 1,797 demo digits with the default settings (what
``make demo`` curates).

Usage: PYTHONPATH=.:plugins nice -n 10 python bench/curation_families.py [--quick] [--seed 0]
(prints a Markdown table, writes bench/results/curation_families.json). Affordable on 2 shared
cores: pools are subsampled (420 images a family; photo tiles capped per photo and size; the 200
faces), ~4 min in all. --quick: pools of ~150 images, no demo-digits row (~1.5 min; most classes
then have fewer than copy_min_class_images and abstain).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("FASTDUP_PRODUCTION", "1")

from bench.dedup_calibration import TRANSFORMS, _encode, _stdout_to_stderr, make_copy  # noqa: E402

RESULTS = REPO / "bench" / "results" / "curation_families.json"
COPY_SHARE = 0.12
DUPLICATE = ("near_duplicate", "exact_duplicate")
CALIBRATION = ("digits 8px", "digits 32px", "photos 32-64px")


# ---------------------------------------------------------------- families (PIL images and labels)


def _digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    from tasks.data.sample_data import digits_arrays

    images, labels = digits_arrays()
    pick = np.sort(rng.choice(len(images), min(n, len(images)), replace=False))
    return images[pick], labels[pick]


def digits_family(n: int, size: int, rng: np.random.Generator) -> list[tuple[Image.Image, str]]:
    images, labels = _digits(n, rng)
    out = []
    for im, lab in zip(images, labels):
        img = Image.fromarray(im, mode="L")
        out.append((img if size == 8 else img.resize((size, size), Image.BILINEAR), str(int(lab))))
    return out


def strokes_family(n: int, rng: np.random.Generator) -> list[tuple[Image.Image, str]]:
    """Thin pen strokes on a uniform background, each by another "writer": width, slant, length and place vary.

    Class 1: one straight stroke; class 7: a bar and a slanted stroke; class 0: an ellipse outline.
    """
    out = []
    for i in range(n):
        label = ("1", "7", "0")[i % 3]
        big = Image.new("L", (112, 112), 0)  # drawn at 4x, then reduced: anti-aliased, sub-pixel widths
        draw = ImageDraw.Draw(big)
        width = int(rng.integers(3, 11))
        cx, cy = 56 + rng.uniform(-10, 10), 56 + rng.uniform(-8, 8)
        slant = math.radians(rng.uniform(-20, 20))
        length = rng.uniform(60, 84)
        dx, dy = math.sin(slant) * length / 2, math.cos(slant) * length / 2
        if label == "1":
            draw.line([(cx - dx, cy + dy), (cx + dx, cy - dy)], fill=255, width=width)
        elif label == "7":
            top = cy - dy
            bar = rng.uniform(30, 50)
            draw.line([(cx + dx - bar, top), (cx + dx, top), (cx - dx, cy + dy)], fill=255, width=width, joint="curve")
        else:
            rx, ry = rng.uniform(18, 30), rng.uniform(30, 42)
            draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], outline=255, width=width)
        out.append((big.resize((28, 28), Image.BOX), label))
    return out


def glyphs_family(n: int, rng: np.random.Generator) -> list[tuple[Image.Image, str]]:
    """The digits 0-9 in Pillow's bundled font: random size, offset, slant and stroke width."""
    out = []
    for i in range(n):
        ch = str(i % 10)
        font = ImageFont.load_default(size=int(rng.integers(14, 23)))
        img = Image.new("L", (56, 56), 0)
        ImageDraw.Draw(img).text((28 + rng.uniform(-4, 4), 28 + rng.uniform(-4, 4)), ch, fill=255, font=font,
                                 anchor="mm", stroke_width=int(rng.integers(0, 2)), stroke_fill=255)
        img = img.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
        out.append((img.resize((28, 28), Image.BILINEAR), ch))
    return out


def _tiles(name: str, im: np.ndarray, sizes: tuple[int, ...], cap: int, rng: np.random.Generator
           ) -> list[tuple[Image.Image, str]]:
    """Non-overlapping tiles (a tile's size drawn from ``sizes``, laid out on that size's own grid band)."""
    img = Image.fromarray(im)
    grey = np.asarray(img.convert("L"), dtype=np.float64)
    out = []
    band = im.shape[0] // len(sizes)  # each size gets its own horizontal band: tiles never overlap
    for k, size in enumerate(sizes):
        for y in range(k * band, (k + 1) * band - size + 1, size):
            for x in range(0, im.shape[1] - size + 1, size):
                if grey[y:y + size, x:x + size].std() >= 8.0:  # flat tiles are look-alikes by any measure
                    out.append((img.crop((x, y, x + size, y + size)), name))
    if len(out) > cap:
        out = [out[i] for i in np.sort(rng.choice(len(out), cap, replace=False))]
    return out


def photo_family(names: tuple[str, ...], sizes: tuple[int, ...], cap: int, rng: np.random.Generator
                 ) -> list[tuple[Image.Image, str]]:
    from bench.dedup_calibration import _photos

    photos = dict(_photos())
    return [t for name in names for t in _tiles(name, photos[name], sizes, cap, rng)]


def two_class_photos(cap: int, rng: np.random.Generator) -> list[tuple[Image.Image, str]]:
    """A team's colour photos: 2 classes (3 photos each), tiles of 48, 96 and 150 px."""
    out = []
    for label, names in (("warm", ("coffee", "chelsea", "astronaut")), ("cool", ("rocket", "china", "flower"))):
        out += [(img, label) for img, _ in photo_family(names, (48, 96, 150), cap, rng)]
    return out


def faces_family(n: int, rng: np.random.Generator) -> list[tuple[Image.Image, str]]:
    from skimage import data as skdata

    faces = skdata.lfw_subset()  # 100 faces then 100 non-faces, float 0..1
    pick = np.sort(rng.choice(len(faces), min(n, len(faces)), replace=False))
    return [(Image.fromarray(np.rint(faces[i] * 255).astype(np.uint8), mode="L"), "face" if i < 100 else "other")
            for i in pick]


def families(quick: bool, seed: int) -> dict[str, list[tuple[Image.Image, str]]]:
    n = 150 if quick else 420
    cap = 25 if quick else 70
    rng = lambda k: np.random.default_rng([seed, k])  # noqa: E731
    return {
        "digits 8px": digits_family(n, 8, rng(0)),
        "digits 32px": digits_family(n, 32, rng(1)),
        "photos 32-64px": photo_family(("china", "flower", "astronaut"), (32, 64), cap * 2, rng(2)),
        "strokes 28px": strokes_family(n, rng(3)),
        "glyphs 28px": glyphs_family(n, rng(4)),
        "textures 32/64px": photo_family(("brick", "grass", "gravel"), (32, 64), cap * 2, rng(5)),
        "faces 25px": faces_family(n, rng(6)),
        "photos 48-150px": two_class_photos(cap, rng(7)),
    }


# ---------------------------------------------------------------- one family through ingest and curate


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


MIN_SEPARATION: float | None = None  # --min-separation: calibration runs only
BASELINE = {"copy_min_separation": -1e9, "copy_min_class_images": 1}  # the pair threshold alone (before)


def _settings(home: Path, labels: list[str], defaults: bool, baseline: bool = False):
    from tasks.settings import load_settings

    s = load_settings("sit", home=home)
    ingest = s.ingest.model_copy(update={"allowed_labels": tuple(sorted(set(labels)))})
    if defaults:
        return s.model_copy(update={"ingest": ingest})
    off = s.curation.outliers.model_copy(update={"min_blur": 0.0, "min_mean": 0.0, "max_mean": 255.0,
                                                 "relative_min_images": 10**9})  # no relative bad-image rule
    update = {} if MIN_SEPARATION is None else {"copy_min_separation": MIN_SEPARATION}
    cur = s.curation.model_copy(update={"outliers": off, "max_class_drop_share": 1.0,
                                        **(BASELINE if baseline else update)})
    return s.model_copy(update={"ingest": ingest, "curation": cur})


def _land(folder: Path, items: list[tuple[str, str, bytes]]) -> None:
    for name, label, data in items:
        (folder / label).mkdir(parents=True, exist_ok=True)
        (folder / label / name).write_bytes(data)


def _curate(settings, landing: Path, run: str, day: str):
    from tasks.curation.curate import REPORT_TABLE, curate
    from tasks.data import lake
    from tasks.data.ingest import ingest_landing

    raw = ingest_landing(settings, run_id=f"ing-{run}", logical_date=day, landing=landing).raw_version
    result = curate(settings, raw, run_id=f"cur-{run}", logical_date=day)
    uri = settings.table_uri(REPORT_TABLE)
    rows = (lake.read(uri, lake.current_version(uri), filter=[("curated_version", "=", result.curated_version)])
            .to_pylist() if lake.exists(uri) else [])
    return result, rows, json.loads(Path(result.report_path).read_text())


def run_family(name: str, items: list[tuple[Image.Image, str]], root: Path, seed: int, baseline: bool = False
               ) -> dict:
    """Pool, then pool + planted copies, in a fresh home; what the second curation dropped and abstained."""
    rng = np.random.default_rng([seed, 99, len(items)])
    pool = [(f"p{i:05d}.png", lab, _encode(img)) for i, (img, lab) in enumerate(items)]
    originals = sorted(rng.choice(len(items), max(1, round(COPY_SHARE * len(items))), replace=False).tolist())
    copies, kind_of, original_of = [], {}, {}
    for n, i in enumerate(originals):
        kind = TRANSFORMS[n % len(TRANSFORMS)]
        data, _ = make_copy(items[i][0], kind, rng)
        copies.append((f"c{n:05d}.{'jpg' if kind == 'jpeg' else 'png'}", items[i][1], data))
        kind_of[_sha(data)], original_of[_sha(data)] = kind, _sha(pool[i][2])
    home = root / (name.replace(" ", "_").replace("/", "_") + ("_baseline" if baseline else ""))
    settings = _settings(home, [lab for _, lab in items], defaults=False, baseline=baseline)
    _land(home / "landing", pool)
    first, first_rows, _ = _curate(settings, home / "landing", "pool", "2026-11-21")
    _land(home / "landing", copies)
    started = time.perf_counter()
    second, rows, report = _curate(settings, home / "landing", "copies", "2026-11-22")
    seconds = time.perf_counter() - started
    return summarise(name, items, pool, rows, first_rows, report, kind_of, original_of, seconds)


def summarise(name: str, items, pool, rows, first_rows, report, kind_of, original_of, seconds: float) -> dict:
    pool_label = {_sha(d): lab for _, lab, d in pool}
    by_class = Counter(pool_label.values())
    lost = [r for r in rows if r["reason"] in DUPLICATE and r["sha256"] in pool_label]
    lost_first = [r for r in first_rows if r["reason"] in DUPLICATE]
    lost_by_class = Counter(pool_label[r["sha256"]] for r in lost)
    found = {r["sha256"] for r in rows if r["reason"] in DUPLICATE and r["kept_sha256"] == original_of.get(r["sha256"])}
    decisions = report.get("decisions", {})
    abstained = {a["label"]: a["why"] for a in decisions.get("abstained", []) if a["rule"] == "near_duplicate"}
    copy_label = {s: pool_label[o] for s, o in original_of.items()}
    live = [s for s in kind_of if copy_label[s] not in abstained]
    recall_by_kind = {}
    for kind in TRANSFORMS:
        mine = [s for s in live if kind_of[s] == kind]
        recall_by_kind[kind] = (sum(s in found for s in mine), len(mine))
    near = Counter(r["label"] for r in rows if r["reason"] == "near_duplicate")
    all_class = Counter(pool_label.values()) + Counter(copy_label.values())
    guard = sorted(lab for lab, k in near.items() if k > math.floor(0.02 * all_class[lab] + 1e-9))
    worst = max(by_class, key=lambda c: (lost_by_class[c] / by_class[c], c))
    return {
        "family": name, "held_out": name not in CALIBRATION, "pool": len(pool), "classes": len(by_class),
        "copies": len(kind_of), "distinct_dropped": len(lost), "distinct_dropped_share": len(lost) / len(pool),
        "distinct_dropped_first_curation": len(lost_first),
        "worst_class": worst, "worst_class_share": lost_by_class[worst] / by_class[worst],
        "recall_live": (len(found & set(live)), len(live)), "recall_by_transform": recall_by_kind,
        "copies_in_abstained_classes": len(kind_of) - len(live), "found_in_abstained": len(found - set(live)),
        "abstained": abstained, "guard_2pct_would_abstain": guard,
        "separation": decisions.get("separation", {}), "possible_copies": len(decisions.get("possible_copies", [])),
        "label_conflicts": sum(r["reason"] == "label_conflict" for r in rows), "seconds_second_curation": round(seconds, 1),
    }


def demo_digits(root: Path) -> dict:
    """The 1,797 digits with the default settings, curated once: what ``make demo`` loses."""
    from tasks.data.sample_data import write_digits

    home = root / "demo"
    write_digits(home / "landing")
    settings = _settings(home, [str(i) for i in range(10)], defaults=True)
    result, rows, report = _curate(settings, home / "landing", "demo", "2026-11-21")
    return {"images": result.kept + len(rows), "dropped_by_reason": result.dropped_by_reason,
            "abstained": {a["label"]: a["why"] for a in report["decisions"]["abstained"]
                          if a["rule"] == "near_duplicate"},
            "possible_copies": len(report["decisions"]["possible_copies"])}


def _ratio(hit_total: tuple[int, int]) -> str:
    hit, total = hit_total
    return f"{hit}/{total}" if total else "-"


def _lost(r: dict) -> str:
    return (f"{r['distinct_dropped']} ({100 * r['distinct_dropped_share']:.1f}%; {r['worst_class']} "
            f"{100 * r['worst_class_share']:.1f}%)")


def print_table(results: list[dict], baselines: list[dict], demo: dict | None) -> None:
    print("Before = the pair threshold alone (copy_min_separation off), same images, same run.\n")
    print("| family | held out | pool / classes | distinct dropped before (worst class) | recall before "
          "| distinct dropped (worst class) | recall (not abstained) | "
          + " | ".join(TRANSFORMS) + " | abstained classes | guard 2% | 2nd curation s |")
    print("|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(TRANSFORMS) + "---|---|---:|")
    for r, b in zip(results, baselines):
        kinds = " | ".join(_ratio(r["recall_by_transform"][k]) for k in TRANSFORMS)
        ab = f"{len(r['abstained'])}/{r['classes']}" + (f" ({', '.join(sorted(r['abstained']))[:60]})"
                                                         if r["abstained"] else "")
        print(f"| {r['family']} | {'yes' if r['held_out'] else 'calibration'} | {r['pool']} / {r['classes']} "
              f"| {_lost(b)} | {_ratio(b['recall_live'])} | {_lost(r)} | {_ratio(r['recall_live'])} | {kinds} | {ab} "
              f"| {', '.join(r['guard_2pct_would_abstain']) or '-'} | {r['seconds_second_curation']} |")
    if demo:
        print(f"\nDemo digits, default settings: {demo['images']} images, dropped {demo['dropped_by_reason']}, "
              f"abstained in {len(demo['abstained'])} classes, {demo['possible_copies']} possible copies listed")
    print("\nWhy the rule abstained (one class per family):")
    for r in results:
        for label, why in sorted(r["abstained"].items())[:1]:
            print(f"- {r['family']}, class {label}: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated family names (default: all)")
    parser.add_argument("--min-separation", type=float, default=None,
                        help="calibration: override curation.copy_min_separation (0 = the threshold alone)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    global MIN_SEPARATION
    MIN_SEPARATION = args.min_separation
    logging.basicConfig(level=logging.ERROR)
    t0 = time.perf_counter()
    fams = families(args.quick, args.seed)
    if args.only:
        fams = {k: v for k, v in fams.items() if k in args.only.split(",")}
    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-families-"))
    try:
        with _stdout_to_stderr(), contextlib.redirect_stdout(sys.stderr):  # fastdup's banners
            results = [run_family(name, items, root, args.seed) for name, items in fams.items()]
            baselines = [run_family(name, items, root, args.seed, baseline=True) for name, items in fams.items()]
            demo = None if args.quick or args.only else demo_digits(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"# Curation on image families ({'quick' if args.quick else 'full'}, seed {args.seed})\n")
    print_table(results, baselines, demo)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seed": args.seed, "quick": args.quick, "families": results, "baseline": baselines, "demo": demo,
                                    "seconds": round(time.perf_counter() - t0, 1)}, indent=1, default=str))
    print(f"\nwrote {args.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
