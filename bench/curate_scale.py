"""Curation at growing sizes (issue 25): full run, a 1% batch, peak memory, and the index against the exact search.

For each ``--images`` size, bench/curate.py's generator writes the images once (32x32 grey PNGs
derived from the real digits, 2% planted near-copies, 0.2% bad) and a 1% batch of the same kind
in a second folder. Then, each in a fresh CD4ML_HOME and its own process (so peak RSS is its own):

* ``index``: the default settings (``exact_search_below`` 5,000: the faiss index at these sizes);
* ``exact`` (sizes up to ``--exact-up-to``): the same with ``exact_search_below`` above the size,
  so the neighbour graph comes from the exact cosine product, on the same images.

Each process ingests the full folder (raw v1, not timed as curation), curates it (timed; peak RSS of
the curating process and of its copy-score workers), ingests the batch (raw v2) and curates again
(timed: the 1% batch as a share of the full run of the same process). The decisions (kept images
with their split and component, dropped images with their reason) of both modes are compared at
each size where both ran, and every difference is listed.

Usage: PYTHONPATH=.:plugins nice -n 10 python bench/curate_scale.py --images 10000 100000 [--exact-up-to 10000]
[--out bench/results/curate_scale.json] [--data DIR] (prints a Markdown table; writes the JSON). With ``--data``
the generated images stay in DIR and a later run reuses them (``--generate-only`` writes them and stops): the
1,000,000-image set is written once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

EXACT_BELOW = 10**9  # exact_search_below for the exact mode: above any size here


def _decisions(settings, raw_version: int, report_path: str) -> dict:
    """sha256 -> [split, component] of the kept images, -> [reason, kept image] of the dropped ones and
    -> [kept image] of the possible copies (kept where the class abstained), for one raw version."""
    from tasks.curation.assignments import read_record
    from tasks.curation.tables import COMPONENTS_TABLE, REPORT_TABLE
    from tasks.data import lake

    head = lake.commit_at(settings.curated_table, lake.current_version(settings.curated_table))
    curated = lake.read(settings.curated_table, head.version, columns=["sha256", "split"])
    record = read_record(settings.table_uri(COMPONENTS_TABLE), int(head.metadata["components_version"])
                         ).select(["sha256", "component"])  # the kept images' components, as the commit names them
    component = dict(zip(record.column("sha256").to_pylist(), record.column("component").to_pylist()))
    report = lake.read(settings.table_uri(REPORT_TABLE), lake.current_version(settings.table_uri(REPORT_TABLE)),
                       columns=["raw_version", "sha256", "reason", "kept_sha256"])
    rows = [r for r in report.to_pylist() if r["raw_version"] == raw_version]
    return {"kept": {r["sha256"]: [r["split"], component[r["sha256"]]] for r in curated.to_pylist()},
            "dropped": {r["sha256"]: [r["reason"], r["kept_sha256"]] for r in rows},
            "possible": {p["sha256"]: [p["partner"]] for p in
                         json.loads(Path(report_path).read_text())["decisions"]["possible_copies"]}}


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (the copy-score workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_one(home: Path, full: Path, batch: Path, mode: str, out: Path) -> None:
    """One mode in this process: ingest + curate the full folder, then the batch; writes ``out`` (JSON)."""
    from tasks.curation.curate import curate
    from tasks.data.ingest import ingest_landing
    from tasks.settings import load_settings

    base = load_settings("sit", home=home)
    update = {"exact_search_below": EXACT_BELOW} if mode == "exact" else {}
    settings = base.model_copy(update={"curation": base.curation.model_copy(update=update)})
    result: dict = {"mode": mode}
    start = time.perf_counter()
    raw1 = ingest_landing(settings, run_id="scale-1", logical_date="2026-11-21", landing=full).raw_version
    result["ingest_s"] = time.perf_counter() - start
    start, cpu = time.perf_counter(), _cpu_seconds()
    done = curate(settings, raw1, run_id="scale-full", logical_date="2026-11-21")
    result["full_s"] = time.perf_counter() - start
    result["full_cpu_s"] = _cpu_seconds() - cpu  # this process and its copy-score workers: less moved by the load
    result["full_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["workers_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result["full_kept"], result["full_dropped"] = done.kept, done.dropped_by_reason
    result["full_decisions"] = _decisions(settings, raw1, done.report_path)
    if os.environ.get("CD4ML_BENCH_KEEP_HOME"):  # the home after the full run: a later batch runs on a copy
        shutil.copytree(home, Path(os.environ["CD4ML_BENCH_KEEP_HOME"]) / f"{home.name}_after_full", symlinks=True)
    result.update(_run_batch(settings, batch))
    out.write_text(json.dumps(result))


def _run_batch(settings, batch: Path, profile: Path | None = None) -> dict:
    """Ingest the batch folder and curate it (timed: seconds, CPU seconds, the process's peak RSS, decisions);
    with ``profile``, the curation's cProfile statistics are written there."""
    import cProfile

    from tasks.curation.curate import curate
    from tasks.data.ingest import ingest_landing

    raw2 = ingest_landing(settings, run_id="scale-2", logical_date="2026-11-22", landing=batch).raw_version
    profiler = cProfile.Profile() if profile else None
    start, cpu = time.perf_counter(), _cpu_seconds()
    if profiler:
        profiler.enable()
    done = curate(settings, raw2, run_id="scale-batch", logical_date="2026-11-22")
    if profiler:
        profiler.disable()
        profiler.dump_stats(str(profile))
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    report = json.loads(Path(done.report_path).read_text())
    return {"batch_s": seconds, "batch_cpu_s": cpu,
            "batch_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "batch_kept": done.kept, "batch_dropped": done.dropped_by_reason,
            "batch_decisions": _decisions(settings, raw2, done.report_path),
            "batch_snapshot": _snapshot_write(settings.curated_table, done.curated_version),
            "search": report.get("similarity", {}).get("search"),
            "copies": report.get("copies"),  # the stored pairs it read, in how many scans; pairs scored
            "components": report.get("decisions", {}).get("components")}  # walked now, reused


def _snapshot_write(uri: str, version: int) -> dict:
    """What the batch's snapshot commit did: data files added and removed (removed > 0: the snapshot was rewritten)."""
    lines = [json.loads(line) for line in (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    return {"files_added": sum("add" in a for a in lines), "files_removed": sum("remove" in a for a in lines),
            "rows_added": sum(json.loads(a["add"].get("stats") or "{}").get("numRecords", 0) for a in lines if "add" in a)}


def batch_on(kept: Path, batch: Path, profile: Path | None) -> dict:
    """The 1% batch alone, on a copy of a home kept after its full run (``--keep-homes``): this checkout's code.

    Prints and returns its seconds, CPU seconds and peak RSS (the process's own: a fresh one); with
    ``profile``, the batch's cProfile statistics are written there.
    """
    from tasks.settings import load_settings

    home = Path(tempfile.mkdtemp(prefix="cd4ml-bench-batch-")) / kept.name
    shutil.copytree(kept, home, symlinks=True)
    try:
        settings = load_settings("sit", home=home)
        migrated = _migrate_snapshot(settings)
        result = {**_run_batch(settings, batch, profile), "snapshot_migrated_first_s": migrated}
    finally:
        shutil.rmtree(home.parent, ignore_errors=True)
    print(json.dumps({k: v for k, v in result.items() if k != "batch_decisions"}))
    return result


def _migrate_snapshot(settings) -> float | None:
    """A home kept before the component left the curated snapshot: the snapshot written without it first, untimed, as
    the first batch after the upgrade does (once), so that the timed batch is a batch; its seconds, or None."""
    import pyarrow as pa

    from tasks.curation.tables import CURATED_SCHEMA
    from tasks.data import lake

    uri = settings.curated_table
    table = lake.open_table(uri)
    if "component" not in table.schema().to_arrow().names:
        return None
    start, head = time.perf_counter(), lake.commit_at(uri, table.version())

    def batches():
        for block in lake.scan_blocks(uri, head.version, CURATED_SCHEMA.names, 1 << 16):
            yield pa.RecordBatch.from_arrays([block.column(n).combine_chunks() for n in CURATED_SCHEMA.names],
                                             schema=CURATED_SCHEMA)

    lake.overwrite_stream(uri, CURATED_SCHEMA, batches, head.metadata, lake.stats_columns_config(CURATED_SCHEMA))
    return time.perf_counter() - start


def _differences(a: dict, b: dict, listed_by_both: bool = False) -> list[str]:
    """Every image whose decision differs between two runs (kept split/component, drop reason, possible copy).

    ``listed_by_both``: possible copies are compared only for images both reports list (a batch lists those
    of the components it walked; the untouched ones are listed by the curation that decided them).
    """
    out = []
    both = set(a.get("possible", {})) & set(b.get("possible", {}))
    for sha in sorted(set(a["kept"]) | set(a["dropped"]) | set(b["kept"]) | set(b["dropped"])):
        compare = not listed_by_both or sha in both
        da = [a["kept"].get(sha) or a["dropped"].get(sha), a.get("possible", {}).get(sha) if compare else None]
        db = [b["kept"].get(sha) or b["dropped"].get(sha), b.get("possible", {}).get(sha) if compare else None]
        if da != db:
            out.append(f"{sha[:12]}: exact {da} / index {db}")
    return out


def generated(data: Path, n: int, side: int = 32) -> tuple[Path, Path]:
    """The ``n`` images and their 1% batch under ``data``, written once (a ``.mix.json`` marks a finished set)."""
    from curate import write_images  # bench/curate.py's generator

    name = f"{n}" if side == 32 else f"{n}_{side}px"
    full, batch = data / f"full_{name}", data / f"batch_{name}"
    done = data / f".mix_{name}.json"
    if done.exists():
        return full, batch
    shutil.rmtree(full, ignore_errors=True)
    shutil.rmtree(batch, ignore_errors=True)
    start = time.perf_counter()
    mix = write_images(full, n, seed=1, prefix="a", side=side)
    write_images(batch, max(1, n // 100), seed=2, prefix="b", side=side)
    seconds = time.perf_counter() - start
    done.write_text(json.dumps({"mix": mix, "seconds": seconds}))
    print(f"{n:,} images {mix} written in {seconds:.0f} s", file=sys.stderr, flush=True)
    return full, batch


def _measure(root: Path, n: int, modes: list[str], keep: Path | None = None, data: Path | None = None,
             keep_homes: Path | None = None, side: int = 32) -> dict[str, dict]:
    full, batch = generated(data or root, n, side)
    results = {}
    for mode in modes:
        out = root / f"{mode}_{n}.json"
        home = root / f"home_{mode}_{n}"
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins'}"}
        if keep_homes is not None:
            env["CD4ML_BENCH_KEEP_HOME"] = str(keep_homes)
        subprocess.run([sys.executable, __file__, "--run", str(home), str(full), str(batch), mode, str(out)],
                       check=True, env=env)
        results[mode] = json.loads(out.read_text())
        if keep is not None:  # with every decision: to compare two commits on the same images
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out, keep / out.name)
        print(f"{n:,} {mode}: full {results[mode]['full_s']:.1f} s, batch {results[mode]['batch_s']:.1f} s",
              file=sys.stderr, flush=True)
        shutil.rmtree(home, ignore_errors=True)
    if data is None:  # generated for this run only
        shutil.rmtree(full, ignore_errors=True)
        shutil.rmtree(batch, ignore_errors=True)
    return results


def _print(sizes: list[int], runs: dict[int, dict[str, dict]], load: tuple[float, float]) -> dict:
    print(f"\n{os.cpu_count()} cores, load average {load[0]:.1f} before / {load[1]:.1f} after\n")
    print("| images | mode | full curation s | CPU s | images/s | peak RSS MB (workers) | 1% batch s | batch CPU s "
          "| batch / full (s; CPU) | kept | dropped |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in sizes:
        for mode, r in runs[n].items():
            print(f"| {n:,} | {mode} | {r['full_s']:.1f} | {r['full_cpu_s']:.1f} | {n / r['full_s']:.0f} | "
                  f"{r['full_peak_rss_mb']:.0f} ({r['workers_peak_rss_mb']:.0f}) | {r['batch_s']:.1f} | "
                  f"{r['batch_cpu_s']:.1f} | {r['batch_s'] / r['full_s']:.1%}; {r['batch_cpu_s'] / r['full_cpu_s']:.1%} | "
                  f"{r['full_kept']:,} | {r['full_dropped']} |")
    summary: dict = {"exponents": {}, "differences": {}}
    index_sizes = [n for n in sizes if "index" in runs[n]]
    for a, b in zip(index_sizes, index_sizes[1:]):
        ta, tb = runs[a]["index"]["full_s"], runs[b]["index"]["full_s"]
        summary["exponents"][f"{a}->{b}"] = math.log(tb / ta) / math.log(b / a)
        ca, cb = runs[a]["index"]["full_cpu_s"], runs[b]["index"]["full_cpu_s"]
        summary["exponents"][f"{a}->{b} cpu"] = math.log(cb / ca) / math.log(b / a)
        print(f"\ngrowth exponent of the full curation (index), {a:,} -> {b:,}: "
              f"{summary['exponents'][f'{a}->{b}']:.2f} in seconds, {summary['exponents'][f'{a}->{b} cpu']:.2f} "
              f"in CPU seconds ({ca:.0f} -> {cb:.0f})")
    for n in sizes:
        if "exact" in runs[n] and "index" in runs[n]:
            for stage in ("full", "batch"):
                diff = _differences(runs[n]["exact"][f"{stage}_decisions"], runs[n]["index"][f"{stage}_decisions"])
                summary["differences"][f"{n}/{stage}"] = diff
                print(f"\n{n:,} images, {stage} run: {len(diff)} decisions differ between exact search and index")
                for line in diff[:20]:
                    print(f"- {line}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--exact-up-to", type=int, default=10_000, help="also run the exact search up to this size")
    parser.add_argument("--out", default="bench/results/curate_scale.json", help="the JSON written (from the repo)")
    parser.add_argument("--keep", help="a folder to copy each run's JSON into, with every decision")
    parser.add_argument("--data", help="a folder that keeps the generated images between runs (written once a size)")
    parser.add_argument("--keep-homes", help="a folder to copy each home into after its full run (for --batch-on)")
    parser.add_argument("--batch-on", nargs=2, metavar=("KEPT_HOME", "BATCH"),
                        help="only the batch, on a copy of a home kept by --keep-homes, with this checkout's code")
    parser.add_argument("--profile", help="with --batch-on: write the batch's cProfile statistics here")
    parser.add_argument("--generate-only", action="store_true", help="write the images into --data and stop")
    parser.add_argument("--side", type=int, default=32,
                        help="pixels a side: 32 grey (default); more: colour PNGs of about a photo's bytes")
    parser.add_argument("--run", nargs=5, metavar=("HOME", "FULL", "BATCH", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        home, full, batch, mode, out = args.run
        run_one(Path(home), Path(full), Path(batch), mode, Path(out))
        return
    if args.batch_on:
        result = batch_on(Path(args.batch_on[0]), Path(args.batch_on[1]), Path(args.profile) if args.profile else None)
        if args.keep:
            Path(args.keep).write_text(json.dumps(result))
        return
    data = Path(args.data) if args.data else None
    if args.generate_only:
        if data is None:
            parser.error("--generate-only needs --data")
        for n in args.images:
            generated(data, n, args.side)
        return
    root = Path(tempfile.mkdtemp(prefix="cd4ml-bench-scale-"))
    load_before = os.getloadavg()
    keep = Path(args.keep) if args.keep else None
    runs = {n: _measure(root, n, (["exact"] if n <= args.exact_up_to else []) + ["index"], keep, data,
                     Path(args.keep_homes) if args.keep_homes else None, args.side) for n in args.images}
    summary = _print(args.images, runs, (load_before[0], os.getloadavg()[0]))
    summary["load_average"] = [load_before[0], os.getloadavg()[0]]
    slim = {n: {m: {k: v for k, v in r.items() if not k.endswith("_decisions")} for m, r in modes.items()}
            for n, modes in runs.items()}
    target = REPO / args.out
    target.write_text(json.dumps({"runs": slim, **summary}, indent=1, sort_keys=True) + "\n")
    print(f"\nwrote {target}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
