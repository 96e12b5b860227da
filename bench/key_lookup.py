"""Finding a block of sha256s among a curation's eligible images: Arrow's hash lookup against a binary search.

A batch codes the rows it reads (stored pairs, stored features, the snapshot's rows) as positions among every eligible
image of the table. ``pc.index_in`` against the eligible images as an Arrow array hashes the whole value set on every
call; ``sha_list.Keys.positions`` searches the eligible images' byte array (64 bytes a sha256, held by the plan
anyway) for the block's own bytes (the sha256 column's data buffer, no copy). For each size, in a fresh process each
(so a high is its own): a block of ``--block`` sha256s (most of them eligible) looked up ``--calls`` times, the
seconds of a call (best of the calls) and the process's anonymous memory high above what it held before the lookups.

Usage: PYTHONPATH=.:plugins .venv/bin/python bench/key_lookup.py [--sizes 100000 1000000] [--block 524288]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _one(size: int, block_rows: int, calls: int, how: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import tasks  # noqa: F401  (Arrow's memory pool, as a curation's process has it)
    from bench.memory import HighWater
    from tasks.curation.sha_list import Keys

    rng = np.random.default_rng(0)
    eligible = sorted(bytes(r).hex() for r in rng.integers(0, 256, size=(size, 32), dtype=np.uint8))
    picks = rng.integers(0, size, block_rows).tolist()
    block = pa.array([eligible[i] if k % 10 else "f" * 64 for k, i in enumerate(picks)], pa.string())
    keys = Keys.of(eligible)  # the plan holds it (``asked``): not counted
    best = float("inf")
    with HighWater() as high:
        before = high.split[0]
        for _ in range(calls):
            start = time.perf_counter()
            if how == "arrow":
                codes = pc.fill_null(pc.index_in(block, value_set=pa.array(eligible, pa.string())), -1).to_numpy()
            else:
                codes = keys.positions(block)
            best = min(best, time.perf_counter() - start)
            del codes
    print(f"{best:.3f} {high.split[0] - before:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--block", type=int, default=2 * 262_144, help="sha256s a lookup (both key columns of a block)")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    print("| eligible images | lookup | s a call | anonymous high above before, MB |")
    print("|---:|---|---:|---:|")
    for size in args.sizes:
        for how in ("arrow", "keys"):
            out = subprocess.run([sys.executable, __file__, "--one", str(size), str(args.block), str(args.calls), how],
                                 check=True, capture_output=True, text=True).stdout.split()
            name = "Arrow `index_in` (value set made a call)" if how == "arrow" else "`Keys.positions` (binary search)"
            print(f"| {size:,} | {name} | {float(out[0]):.3f} | {float(out[1]):.0f} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--one":
        _one(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
