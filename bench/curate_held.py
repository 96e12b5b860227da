"""What a batch's curation holds, by the line that allocated it (issue 25: a batch's memory should not grow with the
table): ``tracemalloc`` snapshots (numpy reports its arrays' data to it) taken as chosen plan phases start, on a copy
of a home bench/curate_scale.py kept after its full run.

Each site is printed with its bytes, its allocations and its bytes per image of the table (the raw rows after the
batch's ingest): a site whose bytes per image stay the same from the 100,000's table to the million's grows with the
table. Memory-mapped stores (the raw rows, the facts, the record, the vector files and the index) are pages of their
files, not allocations: they are not listed. Tracing slows the batch about 6x; its seconds are not the batch's.

Usage: PYTHONPATH=.:plugins python bench/curate_held.py KEPT_HOME BATCH [--at nearest_map _decide_duplicates]
[--top 25]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def top_sites(snapshot: tracemalloc.Snapshot, images: int, top: int) -> list[str]:
    """The ``top`` sites by bytes held, each with its four innermost frames."""
    stats = snapshot.statistics("traceback")
    lines = [f"held {sum(s.size for s in stats) / 1e6:.1f} MB in {len(stats)} sites ({images:,} table images)"]
    for stat in stats[:top]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in list(stat.traceback)[::-1][:4])
        lines.append(f"{stat.size / 1e6:8.2f} MB {stat.count:8d} {stat.size / max(images, 1):7.2f} B/image  {frames}")
    return lines


def _snap_at(module, name: str, images: list[int], top: int) -> None:
    fn = getattr(module, name)

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        print(f"\n== as {name} starts")
        print("\n".join(top_sites(tracemalloc.take_snapshot(), images[0], top)), flush=True)
        return fn(*args, **kwargs)

    setattr(module, name, inner)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kept_home")
    parser.add_argument("batch")
    parser.add_argument("--at", nargs="+", default=["nearest_map", "_decide_duplicates"], help="plan phases")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    from tasks.curation import plan
    from tasks.curation.curate import curate
    from tasks.data import lake
    from tasks.data.ingest import ingest_landing
    from tasks.settings import load_settings

    kept = Path(args.kept_home)
    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-held-", dir=kept.parent))
    try:
        shutil.copytree(kept, root / "home", symlinks=True)
        settings = load_settings("sit", home=root / "home")
        raw = ingest_landing(settings, run_id="held", logical_date="2026-11-22", landing=Path(args.batch)).raw_version
        images = [lake.open_table(settings.raw_table, raw).count()]
        for name in args.at:
            _snap_at(plan, name, images, args.top)
        tracemalloc.start(6)
        curate(settings, raw, run_id="held", logical_date="2026-11-22")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
