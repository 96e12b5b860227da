"""Calibration of the data-relative bad-image rules (``tasks.curation.bulk_limits``) on real image families.

Families (real images that ship inside installed packages; nothing is downloaded):

* ``digits``: scikit-learn's 1,797 8x8 grey digits; class = the digit;
* ``photos``: tiles of scikit-learn's ``china`` and ``flower`` photos of random sizes 48-150 px
  (colour); class = the photo (the 2-class colour dataset of issue 23);
* ``textures``: tiles 48-150 px of scikit-image's ``brick`` and ``grass`` (grey); class = texture;
* held out (never looked at while choosing the numbers): ``skimage_photos`` (tiles 48-150 px of
  ``coffee``, ``chelsea``, ``astronaut``: colour), ``camera_gravel`` (tiles of ``camera`` and
  ``gravel``: grey) and ``faces`` (``skimage.data.lfw_subset``: 200 25x25 grey crops, 100 faces
  and 100 non-faces; class = face or not).

Into each family, bad images are planted (about 1% of the family per kind, spread over the
classes, each made from a random good image of the family): ``black`` and ``white`` frames,
``blur`` (Gaussian, sigma = the shorter side / 16, at least 1 px), ``over`` (x3 exposure,
clipped) and ``under`` (x0.12 exposure). Every image is encoded (PNG; JPEG q90 for the colour
tiles) and measured from its bytes the way curation does (``compute_features``' decode and
``image_stats``), then the whole family goes through ``tasks.curation.outliers.relative_screen``
at each candidate ``sigmas``.

Reported per family and sigmas: good images flagged (count and share, target <= 1%; a source
image that is itself one colour is counted apart: the constant rule drops it, rightly), recall of
each planted kind (a planted image counts when flagged by any rule), and the rules that abstained
(rule/family/class, ``*`` = the whole family).

Usage: python bench/outlier_calibration.py [--sigmas 4,5,6] [--seeds 0,1,2] [--gap 1] [--out PATH]
(prints Markdown tables, writes bench/results/outlier_calibration.json)
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.curation.curation_features import decode_stats  # noqa: E402
from tasks.curation.outliers import CONSTANT_STD, Measured, outlier_reason, relative_screen  # noqa: E402
from tasks.settings import OutlierSettings  # noqa: E402

CALIBRATION = ("digits", "photos", "textures")
HELD_OUT = ("skimage_photos", "camera_gravel", "faces")
KINDS = ("black", "white", "blur", "over", "under")
PLANT_SHARE = 0.01


SCALES = (1.0, 0.75, 0.5)


def _tiles(photos: dict[str, np.ndarray], rng: np.random.Generator, per_class: int) -> list[tuple[str, Image.Image]]:
    """``per_class`` square crops per photo of random sides 48-150 px at random places and scales (1, 0.75, 0.5).

    Crops may overlap (they are different images, not copies: another framing and size); a crop
    is re-drawn when it does not fit the scaled photo.
    """
    out = []
    for label, photo in photos.items():
        img = Image.fromarray(photo)
        scaled = [img.resize((round(img.width * s), round(img.height * s)), Image.BILINEAR) for s in SCALES]
        got = 0
        while got < per_class:
            src = scaled[int(rng.integers(len(scaled)))]
            side = int(rng.integers(48, 151))
            if side > min(src.size):
                continue
            x, y = int(rng.integers(src.width - side + 1)), int(rng.integers(src.height - side + 1))
            out.append((label, src.crop((x, y, x + side, y + side))))
            got += 1
    return out


def family(name: str, rng: np.random.Generator) -> tuple[list[tuple[str, Image.Image]], str]:
    """(class, image) of one family and the encoding used for it."""
    import skimage.data as ski
    from sklearn.datasets import load_sample_image

    from tasks.data.sample_data import digits_arrays

    if name == "digits":
        images, labels = digits_arrays()
        return [(str(int(y)), Image.fromarray(x, mode="L")) for x, y in zip(images, labels)], "PNG"
    if name == "photos":
        return _tiles({"china": load_sample_image("china.jpg"), "flower": load_sample_image("flower.jpg")}, rng, 150), "JPEG"
    if name == "textures":
        return _tiles({"brick": ski.brick(), "grass": ski.grass()}, rng, 150), "PNG"
    if name == "skimage_photos":
        return _tiles({"coffee": ski.coffee(), "chelsea": ski.chelsea(), "astronaut": ski.astronaut()}, rng, 100), "JPEG"
    if name == "camera_gravel":
        return _tiles({"camera": ski.camera(), "gravel": ski.gravel()}, rng, 100), "PNG"
    if name == "faces":
        faces = ski.lfw_subset()
        return [("face" if i < 100 else "other", Image.fromarray(np.rint(f * 255).astype(np.uint8), mode="L"))
                for i, f in enumerate(faces)], "PNG"
    raise ValueError(name)


def planted(kind: str, img: Image.Image) -> Image.Image:
    if kind == "black":
        return Image.new(img.mode, img.size, 0)
    if kind == "white":
        return Image.new(img.mode, img.size, (255,) * len(img.getbands()) if img.mode != "L" else 255)
    if kind == "blur":
        return img.filter(ImageFilter.GaussianBlur(max(1.0, min(img.size) / 16)))
    factor = 3.0 if kind == "over" else 0.12
    return Image.fromarray(np.clip(np.asarray(img, dtype=np.float64) * factor, 0, 255).astype(np.uint8), mode=img.mode)


def encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def measure(name: str, seed: int, sigma_grid: list[float], gap: float = 1.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    good, fmt = family(name, rng)
    n_plant = max(1, round(PLANT_SHARE * len(good)))
    rows: list[tuple[str, str, str | None, bytes]] = []  # (id, label, planted kind, bytes)
    for i, (label, img) in enumerate(good):
        rows.append((f"g{i}", label, None, encode(img, fmt)))
    for kind in KINDS:
        for j in rng.choice(len(good), n_plant, replace=False):
            label, img = good[int(j)]
            rows.append((f"{kind}{j}", label, kind, encode(planted(kind, img), fmt)))
    t0 = time.perf_counter()
    stats = {rid: decode_stats(data) for rid, _, _, data in rows}
    seconds = time.perf_counter() - t0
    measured = {rid: Measured(s.family, s.width, s.height, s.mean, s.contrast, s.blur) for rid, s in stats.items()}
    labels = {rid: label for rid, label, _, _ in rows}
    out = []
    for sigmas in sigma_grid:
        limits = OutlierSettings(relative_sigmas=sigmas, relative_gap=gap)
        # as curation does: the absolute rules first (constant images), the relative ones on the rest
        flagged = {rid: bad for rid, m in measured.items() if (bad := outlier_reason(m, limits)) is not None}
        relative, abstained = relative_screen({r: m for r, m in measured.items() if r not in flagged}, labels, limits)
        flagged.update(relative)
        # a source image that is itself one colour (lfw_subset has a black and two near-flat frames) is
        # flagged by the absolute constant rule, rightly: counted apart, not as a good image lost
        constant = {r for r, m in measured.items() if r.startswith("g") and m.contrast < CONSTANT_STD}
        good_flagged = sorted(r for r in flagged if r.startswith("g") and r not in constant)
        n_good = len(good) - len(constant)
        result = {"family": name, "held_out": name in HELD_OUT, "sigmas": sigmas, "gap": gap, "seed": seed,
                  "good": n_good,
                  "source_constant": len(constant),
                  "good_flagged": len(good_flagged), "good_flagged_share": len(good_flagged) / n_good,
                  "good_flagged_reasons": sorted({flagged[r][0] for r in good_flagged}),
                  "planted_per_kind": n_plant, "stats_ms_per_image": 1000 * seconds / len(rows),
                  "abstained": [f"{a['rule']}/{a['family']}/{a['label']}" for a in abstained]}
        for kind in KINDS:
            ids = [rid for rid, _, k, _ in rows if k == kind]
            result[f"recall_{kind}"] = sum(r in flagged for r in ids) / len(ids)
        out.append(result)
    return out


def table(results: list[dict]) -> str:
    head = ("| family | held out | sigmas | good | constant in source | good flagged | share | planted per kind | " + " | ".join(f"recall {k}" for k in KINDS)
            + " | abstained |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(f"| {r['family']} | {'yes' if r['held_out'] else 'no'} | {r['sigmas']:g} | {r['good']} | "
                     f"{r['source_constant']} | {r['good_flagged']} | {r['good_flagged_share']:.2%} | {r['planted_per_kind']} | "
                     + " | ".join(f"{r[f'recall_{k}']:.0%}" for k in KINDS)
                     + f" | {', '.join(r['abstained']) or '-'} |")
    return "\n".join(lines)


def pooled(results: list[dict]) -> str:
    """One row per family and sigmas over every seed: good images flagged and planted recall, pooled."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in results:
        groups.setdefault((r["family"], r["sigmas"]), []).append(r)
    head = ("| family | held out | sigmas | gap | seeds | good flagged | share | "
            + " | ".join(f"recall {k}" for k in KINDS) + " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (family, sigmas), rows in groups.items():
        flagged, good = sum(r["good_flagged"] for r in rows), sum(r["good"] for r in rows)
        planted = sum(r["planted_per_kind"] for r in rows)
        recall = [sum(r[f"recall_{k}"] * r["planted_per_kind"] for r in rows) / planted for k in KINDS]
        lines.append(f"| {family} | {'yes' if rows[0]['held_out'] else 'no'} | {sigmas:g} | {rows[0]['gap']:g} | "
                     f"{len(rows)} | {flagged} of {good} | {flagged / good:.2%} | "
                     + " | ".join(f"{x:.0%}" for x in recall) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigmas", default="4,5,6")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated; more than one prints the pooled table")
    parser.add_argument("--gap", type=float, default=1.0, help="curation.outliers.relative_gap")
    parser.add_argument("--families", default=",".join(CALIBRATION + HELD_OUT))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "outlier_calibration.json"))
    args = parser.parse_args()
    grid = [float(s) for s in args.sigmas.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    results = [r for seed in seeds for name in args.families.split(",") for r in measure(name, seed, grid, args.gap)]
    print(table(results) if len(seeds) == 1 else pooled(results))
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
