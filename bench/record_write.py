"""A batch's write of the assignment record (``curation_components``): the MERGE (before) against the append (issue 25).

A 1% batch adds a row for each new image and renames the members of the components it merges. Before, those rows
were MERGEd into the table (``lake.upsert_rows``): delta-rs rewrote every file holding a changed row, and a batch's
new sha256s fall in every file. Now (``assignments.store_record``) they are appended in one commit, each stamped
with the version it makes; an image's newest row is its row.

For each ``--images`` size: a synthetic record of that many images (random sha256s, components of 1 to 4 members,
train/val/test), written once as the curation writes it whole, in the old schema (no ``written`` column) and in the
new one. Each mode then runs in a fresh process on its own copy: the record read as a curation reads it
(``read_assignments``), then the batch written: ``--batch`` (a share) new images and ``--renames`` (a share) of the
recorded images renamed. Measured: the write's seconds, the resident memory it raised (sampled every 5 ms, above
the resident memory before it), the files its commit removed and the bytes it wrote.

Usage: PYTHONPATH=.:plugins python bench/record_write.py --images 100000 1000000 [--out bench/results/record_write.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.memory import HighWater  # noqa: E402


def _shas(n: int, seed: int) -> list[str]:
    import numpy as np

    raw = np.random.default_rng(seed).bytes(32 * n)
    return sorted({raw[i:i + 32].hex() for i in range(0, 32 * n, 32)})


def _assignments(shas: list[str], first: int, run: str) -> dict:
    from tasks.curation.assignments import Assignment

    out, splits = {}, ("train", "val", "test")
    for i, sha in enumerate(shas):
        key = shas[i - i % 3]  # components of up to 3 members, keyed by a member
        out[sha] = Assignment(key, splits[hash(key) % 3], first, run)
    return out


def _home(root: Path, mode: str):
    """The settings of ``root/mode``: its record is that home's ``curation_components``."""
    from tasks.settings import load_settings

    return load_settings("sit", home=root / mode)


def _rows(shas: list[str]):
    from tasks.curation.tables import RawFacts, RawRows

    return RawRows.of(RawFacts(s, "7", 32, 32) for s in shas)


def build(root: Path, n: int) -> None:
    """The two stored records of ``n`` images (in the homes ``root/old`` and ``root/new``), and the batch's new
    sha256s (``root/batch.json``)."""
    from tasks.curation.assignments import Record, RecordAfter, store_record
    from tasks.curation.tables import COMPONENTS_TABLE
    from tasks.data import lake

    shas = _shas(n, 1)
    new, old = _home(root, "new"), _home(root, "old")
    meta = {"split_salt": new.curation.split_salt}
    store_record(new.table_uri(COMPONENTS_TABLE), RecordAfter(Record(_rows(shas)), _assignments(shas, 1, "full")),
                 None, meta)
    table = lake.read(new.table_uri(COMPONENTS_TABLE), 0)
    lake.overwrite(old.table_uri(COMPONENTS_TABLE), table.drop_columns(["written"]), meta)  # the old schema
    (root / "batch.json").write_text(json.dumps(sorted(set(_shas(max(1, n // 100), 2)) - set(shas))))


def measure(root: Path, mode: str, renames: float) -> dict:
    """In this process, on a copy of ``mode``'s home: the record read, then the batch written the ``mode`` way
    (``old``: the MERGE, ``new``: the append)."""
    from tasks.curation.assignments import RecordAfter, read_assignments, record_table, store_record
    from tasks.curation.tables import COMPONENTS_TABLE
    from tasks.data import lake

    shutil.copytree(root / mode, root / "work")
    settings = _home(root, "work")
    uri, meta = settings.table_uri(COMPONENTS_TABLE), {"split_salt": settings.curation.split_salt}
    new = json.loads((root / "batch.json").read_text())
    stored = lake.read(uri, lake.current_version(uri), columns=["sha256"]).column("sha256").to_pylist()
    record, _ = read_assignments(settings, _rows(sorted(stored + new)))
    renamed = stored[::round(1 / renames)] if renames else []
    changes = {**{s: record[stored[0]]._replace(first_raw_version=2, run_id="batch") for s in new},
               **{s: record[s]._replace(component=new[0]) for s in renamed}}
    after = RecordAfter(record, changes)
    files_before = set(lake.open_table(uri).file_uris())
    with HighWater() as high:
        start = time.perf_counter()
        if mode == "old":
            written = lake.upsert_rows(uri, record_table(after, 0, sorted(changes)).drop_columns(["written"]),
                                       "sha256", meta)
        else:
            written = store_record(uri, after, set(changes), meta)
        seconds = time.perf_counter() - start
    files_after = set(lake.open_table(uri, written).file_uris())
    assert read_assignments(settings, _rows(sorted(stored + new)))[0][new[0]].run_id == "batch"
    return {"mode": mode, "images": len(stored), "new": len(new), "renamed": len(renamed),
            "seconds": round(seconds, 3), "resident_before_mb": round(high.before, 1),
            "raised_mb": round(high.high - high.before, 1), "files_before": len(files_before),
            "files_removed": len(files_before - files_after), "files_added": len(files_after - files_before),
            "bytes_written": sum(os.path.getsize(f.removeprefix("file://")) for f in files_after - files_before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--batch", type=float, default=0.01, help="new images, a share of the record")
    parser.add_argument("--renames", type=float, default=0.001, help="recorded images renamed, a share")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--measure", nargs=2, metavar=("ROOT", "MODE"), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), args.measure[1], args.renames)))
        return
    results = []
    for n in args.images:
        with tempfile.TemporaryDirectory(prefix="record-write-") as tmp:
            root = Path(tmp)
            build(root, n)
            for mode in ("old", "new"):
                shutil.rmtree(root / "work", ignore_errors=True)
                out = subprocess.run([sys.executable, __file__, "--measure", str(root), mode, "--renames",
                                      str(args.renames)], check=True, capture_output=True, text=True).stdout
                results.append(json.loads(out.strip().splitlines()[-1]))
                print(json.dumps(results[-1]), flush=True)
    _table(results)
    if args.out:
        args.out.write_text(json.dumps({"batch": args.batch, "renames": args.renames, "results": results}, indent=1))


def _table(results: list[dict]) -> None:
    print("| images | mode | rows written | s | raised MB | files removed / before | MB written |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['images']:,} | {r['mode']} | {r['new'] + r['renamed']:,} | {r['seconds']:.2f} | "
              f"{r['raised_mb']:.0f} | {r['files_removed']} / {r['files_before']} | {r['bytes_written'] / 2**20:.1f} |")


if __name__ == "__main__":
    main()
