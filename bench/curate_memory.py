"""Where a curation's memory goes (issue 25): peak RSS raised by each phase, full run and 1% batch in fresh processes.

bench/curate.py's generator writes ``--images`` images and a 1% batch (as bench/curate_scale.py does).
One process curates the full folder; a second, fresh one curates the batch, so the batch's peak is its own and
not the full run's; each ingests in a child process first, as the DAG's ingest task is a process of its own (since
run 37: an ingest's reader threads keep their C heap arenas in the process). Each phase of the curation (the functions
named in ``PHASES``) is wrapped: the table gives the resident memory before and after it, the peak
after it and by how much it raised the process's peak (``ru_maxrss``), its seconds, and the highs of its anonymous
and of its file-backed resident memory (sampled every 5 ms: the pages of a memory-mapped file, the vector files
and the index, count in ``ru_maxrss`` but the kernel can drop them), the high of the C heap's memory in use (what the
libraries asked glibc for and hold: numpy's arrays, Arrow's buffers, faiss's and delta-rs' own; the anonymous high
less it is the allocator's free but kept memory, Python's small-object arenas and the libraries' own mappings), and
the anonymous memory held after it. A phase
that raised the peak is where the memory went.

Usage: PYTHONPATH=.:plugins nice -n 19 python bench/curate_memory.py --images 20000 [--root DIR]
(``--root`` keeps the images and the home; ``--stage full`` then ``--stage batch`` on copies of that
folder compares two commits' batches on the same tables). ``--batch-on KEPT_HOME BATCH``: the batch alone, with
its phases, on a copy of a home bench/curate_scale.py kept after its full run (``--keep-homes``; the million's:
its full run is not run again), with this checkout's code.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench.memory import HighWater, heap_in_use_mb, mallinfo, peak_mb, rss_mb, rss_split_mb  # noqa: E402

PHASES = {
    "tasks.curation.curate": ["plan_in_workdir", "store_caches", "_record_assignments", "_write_snapshot",
                              "write_report_rows", "_galleries", "write_page"],
    "tasks.curation.plan": ["read_raw", "stored_raw", "_features", "open_facts", "fill_stored_facts", "_computed", "read_assignments", "open_record",
                            "screen", "guard_outliers", "_views", "_group", "_known_sets", "_neighbours", "_link_copies",
                            "assign", "nearest_map", "prior_walk", "touched_components", "_decide_duplicates",
                            "separation_by_class", "_dedupe", "over_budget", "bridge_rows", "_decisions",
                            "_kept_facts", "store_features", "store_scores", "store_nearest"],
    "tasks.curation.copy_pairs": ["CopyScores.score_positions", "CopyScores._score", "CopyScores._sign_scanned"],
    "tasks.curation.pair_store": ["StoredScores._scan"],
    "tasks.data.lake": ["_marks"],
}


def _wrap(module, name: str, log: list, depth: list, sampler: HighWater) -> None:
    """Wrap ``name`` of ``module`` (``Class.method``: a method of one of its classes) to log its phase's memory."""
    owner, attr = owner_of(module, name)
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        peak, rss, start = peak_mb(), rss_mb(), time.perf_counter()
        outer = sampler.restart()  # this phase's own highs from here
        depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            _, own = sampler.merge(outer)
            log.append((depth[0], f"{module.__name__.rsplit('.', 1)[-1]}.{name}", rss, rss_mb(), peak_mb(),
                        peak_mb() - peak, time.perf_counter() - start, *own, rss_split_mb()[0]))
            if name == "plan_in_workdir":
                print(f"after the plan: {_heap()}", flush=True)

    setattr(owner, attr, inner)


def ingest_stage(root: Path, stage: str, home: Path | None = None) -> int:
    """The stage's images ingested in this process (as the DAG's ingest task is a process of its own); the raw
    version."""
    from tasks.data.ingest import ingest_landing
    from tasks.settings import load_settings

    settings = load_settings("sit", home=home or root / "home")
    return ingest_landing(settings, run_id=f"mem-{stage}", logical_date=_day(stage), landing=root / stage).raw_version


def _day(stage: str) -> str:
    return "2026-11-21" if stage == "full" else "2026-11-22"


def run_stage(root: Path, stage: str, home: Path | None = None) -> None:
    """One stage: ``full`` (the folder) or ``batch`` (the batch) ingested in a child process, then curated in this
    one, as the DAG's tasks run; ``home``: the home to curate in (default ``root/home``), ``root/stage`` the images."""
    out = subprocess.run([sys.executable, __file__, "--ingest", str(root), stage, str(home or root / "home")],
                         check=True, capture_output=True, text=True).stdout
    raw = int(out.split()[-1])
    from tasks.curation.curate import curate
    from tasks.settings import load_settings

    log = _wrapped_phases()
    settings = load_settings("sit", home=home or root / "home")
    import pyarrow as pa  # after ``tasks``: its process defaults pick Arrow's memory pool

    print(f"\n{stage}: ingested in a child process (raw version {raw}); after imports {rss_mb():.0f} MB resident "
          f"({_split()}), Arrow's pool {pa.default_memory_pool().backend_name}", flush=True)
    day = _day(stage)
    start = time.perf_counter()
    curate(settings, raw, run_id=f"mem-{stage}", logical_date=day)
    print(f"{stage}: curation {time.perf_counter() - start:.1f} s, peak RSS {peak_mb():.0f} MB\n")
    print("| phase | resident before MB | after MB | peak after MB | peak raised by MB | s | high anon MB | high file MB "
          "| high C heap in use MB | anon after MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d, name, before, after, peak, raised, seconds, anon, mapped, in_use, held in log:
        print(f"| {'&nbsp;' * 2 * d}{name} | {before:.0f} | {after:.0f} | {peak:.0f} | {raised:.0f} | {seconds:.2f} | "
              f"{anon:.0f} | {mapped:.0f} | {in_use:.0f} | {held:.0f} |")


def _heap() -> str:
    """Where the anonymous memory is: glibc's heaps (in use and free but kept), its mapped blocks, Arrow's pool."""
    import pyarrow as pa

    pool = pa.default_memory_pool()
    arrow = f"Arrow's pool {pool.bytes_allocated() / 2**20:.0f} MB allocated"
    m = mallinfo()
    if m is None:
        return arrow
    return (f"C heaps {m.arena / 2**20:.0f} MB (in use {m.uordblks / 2**20:.0f}, free and kept "
            f"{m.fordblks / 2**20:.0f}), mapped blocks {m.hblkhd / 2**20:.0f} MB ({m.hblks}), {arrow}; "
            f"anonymous {rss_split_mb()[0]:.0f} MB, C heap in use {heap_in_use_mb():.0f} MB")


def _split() -> str:
    anon, mapped = rss_split_mb()
    return f"anonymous {anon:.0f}, file-backed {mapped:.0f}"


def each_phase() -> Iterator[tuple[ModuleType, str]]:
    """(module, name) of every phase of ``PHASES`` this checkout has (a phase another commit has elsewhere or not at
    all is left out)."""
    import importlib

    for module_name, names in PHASES.items():
        module = importlib.import_module(module_name)
        yield from ((module, name) for name in names if _has(module, name))


def owner_of(module: ModuleType, name: str) -> tuple[object, str]:
    """(what holds ``name``, its last part): ``module`` itself, or the class of ``Class.method``."""
    *path, attr = name.split(".")
    return functools.reduce(getattr, path, module), attr


def _has(module: ModuleType, name: str) -> bool:
    """Whether ``module`` has ``name`` (a dotted name: a class's method)."""
    try:
        getattr(*owner_of(module, name))
    except AttributeError:
        return False
    return True


def _wrapped_phases() -> list:
    """Wrap every phase of ``PHASES``; the log they append to as they end."""
    log: list = []
    depth, sampler = [0], HighWater()
    for module, name in each_phase():
        _wrap(module, name, log, depth, sampler)
    return log


def batch_on(kept: Path, batch: Path) -> None:
    """The batch alone, phase by phase, on a copy of ``kept`` (a home kept after a full run), in a fresh process."""
    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-memory-batch-", dir=kept.parent))
    try:
        shutil.copytree(kept, root / "home", symlinks=True)
        (root / "batch").symlink_to(batch.resolve())
        subprocess.run([sys.executable, __file__, "--run", str(root), "batch"], check=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--root", help="folder for the images and the home (kept); default: a temporary one")
    parser.add_argument("--stage", choices=["full", "batch", "both"], default="both")
    parser.add_argument("--batch-on", nargs=2, metavar=("KEPT_HOME", "BATCH"),
                        help="only the batch, on a copy of a home kept by bench/curate_scale.py --keep-homes")
    args = parser.parse_args()
    if args.batch_on:
        batch_on(Path(args.batch_on[0]), Path(args.batch_on[1]))
        return
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="cd4ml-bench-memory-"))
    if not (root / "full").exists():
        from curate import write_images  # bench/curate.py's generator

        write_images(root / "full", args.images, seed=1, prefix="a")
        write_images(root / "batch", max(1, args.images // 100), seed=2, prefix="b")
    for stage in (["full", "batch"] if args.stage == "both" else [args.stage]):
        subprocess.run([sys.executable, __file__, "--run", str(root), stage], check=True)
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--ingest":
        print(ingest_stage(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])))
    elif len(sys.argv) == 4 and sys.argv[1] == "--run":
        run_stage(Path(sys.argv[2]), sys.argv[3])
    else:
        main()
