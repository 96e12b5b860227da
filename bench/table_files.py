"""What a curation cache's file count costs a batch (issue 25): should the append-only tables be compacted?

A batch appends one commit (one or more Parquet files) to ``curation_pairs`` and ``curation_embeddings``; nothing
rewrites them, so after a year of daily batches each holds hundreds of small files. A batch reads them by scanning
their key columns (``lake.scan_blocks``: the copy scores' ``StoredScores``, the features' ``stored_rows``). This
builds one pairs-shaped table (``copy_pairs.PAIRS_SCHEMA``, random sha256 pairs) of ``--rows`` rows in each of
``--commits`` appends (``lake.append_stream``, as ``store_scores`` writes), each in a fresh folder, then times in
this process: the table opened (``lake.current_version``) and one scan of its two key columns, best of three.

Usage: PYTHONPATH=.:plugins python bench/table_files.py [--rows 200000] [--commits 1 100 365 1000] [--root DIR]
(prints a Markdown table; the ratios are against the single-file table of the same run).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tasks  # noqa: E402,F401  (the product's process defaults, before pyarrow)


def _rows(n: int, seed: int):
    import numpy as np
    import pyarrow as pa

    from tasks.curation.copy_pairs import PAIRS_SCHEMA

    rng = np.random.default_rng(seed)
    a = [hashlib.sha256(rng.bytes(8)).hexdigest() for _ in range(n)]
    b = [hashlib.sha256(rng.bytes(8)).hexdigest() for _ in range(n)]
    low, high = zip(*[(min(x, y), max(x, y)) for x, y in zip(a, b)]) if n else ((), ())
    return pa.table({"sha256_a": list(low), "sha256_b": list(high), "config": ["bench"] * n,
                     "score": rng.random(n), "run_id": [f"batch-{seed}"] * n}, schema=PAIRS_SCHEMA)


def build(uri: str, rows: int, commits: int) -> float:
    """``rows`` rows in ``commits`` appends, as a curation's ``store_scores`` commits them; seconds taken."""
    from tasks.curation.copy_pairs import PAIRS_SCHEMA
    from tasks.data import lake

    start = time.perf_counter()
    per = rows // commits
    for k in range(commits):
        n = per if k < commits - 1 else rows - per * (commits - 1)
        table = lake.open_table(uri) if lake.exists(uri) else None
        lake.append_stream(uri, _rows(n, k).to_reader(65_536), {"step": "bench"}, table,
                           lake.stats_columns_config(PAIRS_SCHEMA))
    return time.perf_counter() - start


def read_once(uri: str) -> tuple[float, float, int]:
    """(seconds to open the newest version, seconds to scan the key columns, data files)."""
    from tasks.data import lake

    start = time.perf_counter()
    version = lake.current_version(uri)
    opened = time.perf_counter()
    for _ in lake.scan_blocks(uri, version, ["sha256_a", "sha256_b"], lake.LOOKUP_BLOCK_ROWS):
        pass
    scanned = time.perf_counter()
    files = len(lake.open_table(uri, version).file_uris())
    return opened - start, scanned - opened, files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--commits", type=int, nargs="+", default=[1, 100, 365, 1000])
    parser.add_argument("--root", help="folder for the tables (default: a temporary one, removed)")
    args = parser.parse_args()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="cd4ml-bench-files-"))
    print(f"{args.rows:,} rows a table\n")
    print("| commits | files | build s | open s | key-column scan s | scan / one file's | per file ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    try:
        for commits in args.commits:
            uri = str(root / f"pairs_{commits}")
            shutil.rmtree(uri, ignore_errors=True)
            built = build(uri, args.rows, commits)
            runs = [read_once(uri) for _ in range(3)]
            opened, scanned = min(r[0] for r in runs), min(r[1] for r in runs)
            files = runs[0][2]
            base = scanned if base is None else base
            per_file = (scanned - base) / max(files - 1, 1) * 1000 if commits > 1 else 0.0
            print(f"| {commits:,} | {files:,} | {built:.1f} | {opened:.3f} | {scanned:.3f} | {scanned / base:.2f}x "
                  f"| {per_file:.2f} |", flush=True)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
