"""The sha256 lists beside the vector files and the index: Python strings (before) against one byte array (issue 25).

A view's vector file and its faiss index each keep a ``.shas`` file, row ``r`` = the image on line ``r``. A
curation opens both for each of the two views and asks: which eligible images have no row (to append), each
eligible image's row (the file), each indexed row's eligible position (the search). Before, each list was read
as Python strings, with a dict (rows) or a set (indexed) and a dict of the eligible positions built on it; now
(``tasks.curation.sha_list``) a list is one ``S64`` array and a lookup is one binary search of the listed rows
among the sorted eligible images.

Each mode runs in a fresh process on the same files: a list of ``--images`` sha256s (stored order: batches of
1% appended, each sorted, as curations write them) and the eligible images (all of them, sorted). Measured: the
seconds of one view's lookups (the file and the index: two lists), and the resident memory they hold
(``statm`` after, above before; and the peak of the process above its start).

Usage: PYTHONPATH=.:plugins python bench/sha_list_scale.py --images 100000 1000000 [--out bench/results/sha_list_scale.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.memory import peak_mb, rss_mb  # noqa: E402


def write_lists(folder: Path, n: int) -> None:
    """The eligible images (``n`` sha256s) and two stored lists (a file's and an index's) of all but the last 1%:
    earlier batches of 1% appended, each in sha256 order (a batch's lists before it extends them)."""
    shas = [hashlib.sha256(f"image {i}".encode()).hexdigest() for i in range(n)]
    batch = max(1, n // 100)
    stored = [s for start in range(0, n - batch, batch) for s in sorted(shas[start:start + batch])]
    for name in ("file", "index"):
        (folder / f"{name}.shas").write_text("".join(f"{s}\n" for s in stored))
    (folder / "eligible.txt").write_text("\n".join(sorted(shas)) + "\n")


def _strings(folder: Path, eligible: list[str]) -> tuple:
    """The code before: lists of strings, a dict of rows, a set of indexed images, a dict of eligible positions."""
    import numpy as np

    listed = (folder / "file.shas").read_text().split()
    row_of = {s: r for r, s in enumerate(listed)}
    missing = sorted(s for s in eligible if s not in row_of)
    rows = np.fromiter((row_of.get(s, -1) for s in eligible), dtype=np.int64, count=len(eligible))
    indexed = (folder / "index.shas").read_text().split()
    known = set(indexed)
    new = [r for r, s in enumerate(eligible) if s not in known]
    pos = {sha: i for i, sha in enumerate(eligible)}
    at = np.fromiter((pos.get(sha, -1) for sha in indexed), dtype=np.int32, count=len(indexed))
    del pos
    return listed, row_of, indexed, known, missing, rows, new, at


def _arrays(folder: Path, eligible: list[str]) -> tuple:
    """This code: ``ShaList`` read as one buffer, lookups by binary search among the sorted eligible images."""
    import numpy as np

    from tasks.curation.sha_list import Keys, ShaList

    asked = Keys.of(eligible)
    listed = ShaList.read(folder / "file.shas")
    rows = listed.rows_of(asked)
    missing = sorted(eligible[p] for p in np.flatnonzero(rows < 0).tolist())
    indexed = ShaList.read(folder / "index.shas")
    new = np.flatnonzero(indexed.rows_of(asked) < 0).tolist()
    at = indexed.located(asked).astype(np.int32)
    return listed, indexed, missing, rows, new, at


def run_one(folder: Path, mode: str) -> dict:
    eligible = (folder / "eligible.txt").read_text().split()
    import numpy as np  # noqa: F401  (imported before the baseline)

    from tasks.curation import sha_list  # noqa: F401

    rss, peak, start = rss_mb(), peak_mb(), time.perf_counter()
    held = (_strings if mode == "strings" else _arrays)(folder, eligible)
    seconds = time.perf_counter() - start
    out = {"mode": mode, "seconds": round(seconds, 3), "held_mb": round(rss_mb() - rss, 1),
           "peak_above_mb": round(peak_mb() - peak, 1), "rows_checksum": int(held[-3].sum()),
           "positions_checksum": int(held[-1].astype("int64").sum()), "missing": len(held[-4]), "new": len(held[-2])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--out", default="bench/results/sha_list_scale.json")
    parser.add_argument("--run", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(Path(args.run[0]), args.run[1])))
        return
    results = []
    for n in args.images:
        with tempfile.TemporaryDirectory(prefix="cd4ml-sha-list-") as tmp:
            write_lists(Path(tmp), n)
            for mode in ("strings", "arrays", "strings", "arrays"):  # each twice, interleaved: load drifts
                done = subprocess.run([sys.executable, __file__, "--run", tmp, mode], check=True,
                                      capture_output=True, text=True)
                results.append({"images": n, **json.loads(done.stdout)})
    for n in args.images:
        by_mode = {m: [r for r in results if r["images"] == n and r["mode"] == m] for m in ("strings", "arrays")}
        same = ("rows_checksum", "positions_checksum", "missing", "new")
        if any(by_mode["strings"][0][k] != by_mode["arrays"][0][k] for k in same):
            raise SystemExit(f"{n}: the two modes found different rows")
    print("| images | mode | seconds (two runs) | held MiB | peak above MiB |\n|---|---|---|---:|---:|")
    for n in args.images:
        for mode in ("strings", "arrays"):
            runs = [r for r in results if r["images"] == n and r["mode"] == mode]
            seconds = " / ".join(f"{r['seconds']:.2f}" for r in runs)
            print(f"| {n:,} | {mode} | {seconds} | "
                  f"{max(r['held_mb'] for r in runs):,.0f} | {max(r['peak_above_mb'] for r in runs):,.0f} |")
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
