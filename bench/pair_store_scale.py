"""Stored pair scores at a million images' table (issue 25): read whole against read by key, time and memory.

A curation's batch asks for the stored pairs of its new images and their candidates (``pair_store.StoredScores.want``),
then of the members of the components it walks; before, it read every stored pair among the eligible images (what
``want_all`` does: the nearest map's full scan still does). This builds a ``curation_pairs`` Delta table like the
one a full curation leaves (``--pairs-per-image`` pairs an image, 7.7 at the generated million; written by
``copy_pairs.store_scores``, as curation writes it), then, each in a fresh process (peak RSS its own):

* ``whole``: every stored pair among the eligible images (the former ``load_scores``), then the batch's partners;
* ``by_key``: the batch's new images and ``--candidates`` stored images each (one scan), then ``--walked`` more
  images (a second scan, the walk's), then the same partners.

Both give the same partners for the batch's images (checked). Memory is the process's peak RSS above what it held
with the eligible list built and the table read once for one image (a curation holds that list and that reader anyway).

Usage: PYTHONPATH=.:plugins python bench/pair_store_scale.py --images 100000 1000000 [--out bench/results/pair_store_scale.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.memory import rss_mb  # noqa: E402


def _shas(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return sorted({f"{rng.getrandbits(256):064x}" for _ in range(n)})


def build(root: Path, n: int, per_image: float, seed: int) -> tuple[str, float]:
    """A pairs table over ``n`` images with about ``per_image`` pairs an image; its uri and the seconds it took."""
    import numpy as np

    from tasks.curation.copy_pairs import FreshPairs, store_scores

    shas = _shas(n, seed)
    rng = np.random.default_rng(seed)
    count = int(n * per_image / 2)  # a pair counts for both its images
    i, j = rng.integers(0, n, count), rng.integers(0, n, count)
    keys = np.unique(np.minimum(i, j)[i != j] * n + np.maximum(i, j)[i != j])
    fresh = FreshPairs()
    start = time.perf_counter()
    for at in range(0, len(keys), 1 << 18):
        part = keys[at:at + (1 << 18)]
        fresh.add([(shas[k // n], shas[k % n]) for k in part.tolist()], rng.random(len(part)).tolist())
    uri = str(root / f"curation_pairs_{n}")
    store_scores(uri, fresh, "bench", {"run_id": "bench"})
    return uri, time.perf_counter() - start


def measure(uri: str, n: int, mode: str, new: int, candidates: int, walked: int, seed: int) -> dict:
    """One mode in this process: seconds, peak RSS above the eligible list, pairs read, scans, the batch's partners."""
    from tasks.curation.copy_pairs import score_config
    from tasks.curation.pair_store import StoredScores

    stored_shas = _shas(n, seed)
    rng = random.Random(seed + 1)
    new_shas = [f"{rng.getrandbits(256):064x}" for _ in range(new)]  # the batch's images: no stored pair yet
    eligible = sorted(stored_shas + new_shas)
    asked = sorted(set(new_shas) | set(rng.sample(stored_shas, min(n, new * candidates))))
    walk = rng.sample(stored_shas, min(n, walked))
    StoredScores(uri, score_config(), eligible).want(eligible[:1])  # the table's reader and Arrow warmed up: not counted
    base = rss_mb()
    start = time.perf_counter()
    scores = StoredScores(uri, score_config(), eligible)
    if mode == "whole":
        scores.want_all()
    else:
        scores.want(asked)
        scores.want(walk)
    partners = {s: scores.partners(s) for s in asked[:2000] + walk[:2000]}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    digest = sum(len(p) for p in partners.values()), round(sum(sum(p.values()) for p in partners.values()), 6)
    return {"mode": mode, "seconds": seconds, "peak_above_mb": peak - base, "pairs_read": scores.count,
            "scans": scores.scans, "asked": len(asked) + len(walk), "partners_checked": digest}


def _in_fresh_process(uri: str, n: int, mode: str, args: argparse.Namespace) -> dict:
    out = subprocess.run([sys.executable, __file__, "--run", uri, str(n), mode, str(args.new_share),
                          str(args.candidates), str(args.walked_share), str(args.seed)],
                         capture_output=True, text=True, check=True, env={"PYTHONPATH": f"{REPO}:{REPO / 'plugins'}",
                                                                          "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--pairs-per-image", type=float, default=15.4, help="pairs an image (both sides): 7.7 M "
                        "pairs at the generated million are 15.4 an image")
    parser.add_argument("--new-share", type=float, default=0.01, help="the batch's new images, a share of the table")
    parser.add_argument("--candidates", type=int, default=16, help="stored candidates asked for a new image")
    parser.add_argument("--walked-share", type=float, default=0.01, help="images of the components walked")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/pair_store_scale.json")
    parser.add_argument("--run", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        uri, n, mode, share, cand, walked, seed = args.run
        print(json.dumps(measure(uri, int(n), mode, int(int(n) * float(share)), int(cand),
                                 int(int(n) * float(walked)), int(seed))))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="cd4ml-bench-pairs-") as root:
        for n in args.images:
            uri, built = build(Path(root), n, args.pairs_per_image, args.seed)
            results = {m: _in_fresh_process(uri, n, m, args) for m in ("whole", "by_key")}
            assert results["whole"]["partners_checked"] == results["by_key"]["partners_checked"], "different partners"
            rows.append({"images": n, "table_build_s": built, **{m: r for m, r in results.items()}})
            print(f"{n:,} images: {json.dumps(rows[-1])}", flush=True)
    _print(rows)
    Path(REPO / args.out if not Path(args.out).is_absolute() else args.out).write_text(json.dumps(
        {"args": {k: v for k, v in vars(args).items() if k != "run"}, "rows": rows}, indent=1))


def _print(rows: list[dict]) -> None:
    print("| images | pairs | mode | pairs read | scans | seconds | peak RSS above the eligible list MiB |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        for m in ("whole", "by_key"):
            x = r[m]
            print(f"| {r['images']:,} | {r['whole']['pairs_read']:,} | {m} | {x['pairs_read']:,} | {x['scans']} | "
                  f"{x['seconds']:.2f} | {x['peak_above_mb']:.0f} |")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        grow = b["images"] / a["images"]
        for m in ("whole", "by_key"):
            t = b[m]["seconds"] / a[m]["seconds"]
            print(f"{m}: x{grow:g} the images: seconds x{t:.2f} (exponent {math.log(t) / math.log(grow):.2f}), "
                  f"memory x{b[m]['peak_above_mb'] / max(1.0, a[m]['peak_above_mb']):.2f}")


if __name__ == "__main__":
    main()
