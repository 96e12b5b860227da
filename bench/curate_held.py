"""What a batch's curation holds, by the line that allocated it (issue 25: a batch's memory should not grow with the
table): ``tracemalloc`` snapshots (numpy reports its arrays' data to it) taken as chosen plan phases start, on a copy
of a home bench/curate_scale.py kept after its full run.

Each site is printed with its bytes, its allocations and its bytes per image of the table (the raw rows after the
batch's ingest): a site whose bytes per image stay the same from the 100,000's table to the million's grows with the
table. Memory-mapped stores (the raw rows, the facts, the record, the vector files and the index) are pages of their
files, not allocations: they are not listed. Tracing slows the batch about 6x; its seconds are not the batch's.

Usage: PYTHONPATH=.:plugins python bench/curate_held.py KEPT_HOME BATCH [--at nearest_map _decide_duplicates]
[--top 25] [--peaks [--phases tasks.curation.outliers:judge tasks.curation.bulk_limits:_robust_z ...]]

``--peaks``: also each plan phase's traced high (bench/curate_memory.py's ``PHASES``): what was traced as it started
and the most traced while it ran, MB and bytes per table image. Set beside curate_memory.py's anonymous highs of the
same phases, the difference is what no traced allocation holds: native libraries' own memory (faiss, Arrow's pool)
and what the allocators keep.
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
sys.path.insert(0, str(REPO / "bench"))

import curate_memory  # noqa: E402
from curate_memory import each_phase, owner_of  # noqa: E402


def top_sites(snapshot: tracemalloc.Snapshot, images: int, top: int) -> list[str]:
    """The ``top`` sites by bytes held, each with its four innermost frames."""
    stats = snapshot.statistics("traceback")
    lines = [f"held {sum(s.size for s in stats) / 1e6:.1f} MB in {len(stats)} sites ({images:,} table images)"]
    for stat in stats[:top]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in list(stat.traceback)[::-1][:4])
        lines.append(f"{stat.size / 1e6:8.2f} MB {stat.count:8d} {stat.size / max(images, 1):7.2f} B/image  {frames}")
    return lines


def _snap_at(module, name: str, images: list[int], top: int) -> None:
    owner, attr = owner_of(module, name)
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        print(f"\n== as {name} starts")
        print("\n".join(top_sites(tracemalloc.take_snapshot(), images[0], top)), flush=True)
        return fn(*args, **kwargs)

    setattr(owner, attr, inner)


class PhasePeaks:
    """Each wrapped phase's traced memory as it starts and its own high (nested phases included), in call order."""

    def __init__(self) -> None:
        self.open: list[int] = []  # each running phase's high before a nested phase reset the traced high
        self.rows: list[tuple[int, str, int, int]] = []

    def wrap(self, module, name: str) -> None:
        owner, attr = owner_of(module, name)
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            start, high = tracemalloc.get_traced_memory()
            if self.open:
                self.open[-1] = max(self.open[-1], high)
            self.open.append(start)
            row = len(self.rows)
            self.rows.append((len(self.open) - 1, name, start, start))  # in call order; its high as it ends
            tracemalloc.reset_peak()  # not reset again as it ends: the enclosing phases' highs include it
            try:
                return fn(*args, **kwargs)
            finally:
                self.rows[row] = (*self.rows[row][:3], max(self.open.pop(), tracemalloc.get_traced_memory()[1]))

        setattr(owner, attr, inner)

    def table(self, images: int) -> list[str]:
        lines = [f"{'phase':<28} {'at start MB':>11} {'high MB':>8} {'high B/image':>12}"]
        for depth, name, start, high in self.rows:
            lines.append(f"{'  ' * depth + name:<28} {start / 1e6:11.1f} {high / 1e6:8.1f} {high / max(images, 1):12.1f}")
        return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kept_home")
    parser.add_argument("batch")
    parser.add_argument("--at", nargs="*", default=["nearest_map", "_decide_duplicates"], help="plan phases")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--peaks", action="store_true", help="each plan phase's traced high")
    parser.add_argument("--phases", nargs="*", default=[], metavar="MODULE:NAME",
                        help="with --peaks: these phases instead of curate_memory.py's (a function or Class.method "
                             "as MODULE calls it, e.g. tasks.curation.outliers:judge)")
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
        peaks = PhasePeaks() if args.peaks else None
        if peaks:
            _wrap_phases(peaks, args.phases)
        tracemalloc.start(6)
        curate(settings, raw, run_id="held", logical_date="2026-11-22")
        if peaks:
            print("\n== each phase's traced high\n" + "\n".join(peaks.table(images[0])), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _wrap_phases(peaks: PhasePeaks, chosen: list[str]) -> None:
    """curate_memory.py's phases, or ``chosen`` (``module:name``, a name as that module calls it), each wrapped."""
    if chosen:
        phases: dict[str, list[str]] = {}
        for spec in chosen:
            module, _, name = spec.partition(":")
            phases.setdefault(module, []).append(name)
        curate_memory.PHASES = phases
    for module, name in each_phase():
        peaks.wrap(module, name)


if __name__ == "__main__":
    main()
