"""Batch scoring (``tasks.serving.score.score``) against a bare loop calling the pyfunc on the same images.

* Champion: the one of ``--home`` (or ``CD4ML_HOME``) in ``CD4ML_ENV`` (default sit) when given;
  otherwise one built like the serving tests' (``tests/factories/champion.py``: real digits, 16 px grey
  ``small_cnn``, trained, gated and promoted in a temporary home).
* Images: ``--n`` (10,000) distinct PNG files in one flat folder, made from scikit-learn's 1,797
  real digits: upscaled to 32x32 grey (bilinear), shifted by -2..2 pixels and given Gaussian
  noise (sigma 4 grey levels) by a fixed RNG, so every file's sha256 differs (checked); the first
  ``--n-small`` (2,500) of them, the same bytes, in a second folder for the memory comparison.
* Baseline ("bare loop"): ``mlflow.pyfunc.load_model(<pinned uri>)`` once (not timed), then for
  each batch of ``serving.batch_size`` files, in the product's order (sorted names): read the
  bytes, ``model.predict(pd.DataFrame({"image": batch}))``.
* Product: ``score(settings, folder, run_id=..., logical_date="2026-11-22")`` into a fresh lake
  each time, timed whole (champion lookup, model download and load, listing, read, sha256,
  header screen, predict, Delta writes and commits): the throughput ratio is conservative.
* Baseline and product alternate ``--repeats`` (3) times each after an untimed warm-up of both;
  ratio = median baseline seconds / median product seconds (>= 0.9: the product keeps 90% of the
  bare loop's throughput).
* Re-run: the ``--n`` folder scored again into the last product run's lake: 0 new rows, the
  same row count, no new Delta version (it still lists, reads and hashes every file).
* Memory: peak RSS (``VmHWM``; ``ru_maxrss`` is inherited from this process over exec: see
  ``_peak_rss_mb``) of a fresh child process (this script with ``--child``)
  scoring ``--n-small`` and ``--n`` files, and the same for the bare loop.
* Torch threads: ``--threads`` (1: what the champion build leaves and ``training.num_threads`` of the
  tests; children too), set explicitly so a ``--home`` run measures the same. One more pair of
  runs at 2 threads (``--threads2-pairs``, 2) is reported apart (on a busy 2-core machine the
  intra-op threads compete with the Python work between torch calls: noisier).
* ``--profile``: also cProfile one product run (in process) and keep the top functions, and time
  each step of scoring alone (listing, read, sha256, screen, model load, predict) on the same files.

Usage: python bench/score.py [--n 10000] [--n-small 2500] [--repeats 3] [--threads 1] [--threads2-pairs 2]
       [--home DIR] [--profile] [--out bench/results/score.json]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOGICAL_DATE = "2026-11-22"


def _progress(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM`` of its own address space.

    ``ru_maxrss`` of a child started by this (800+ MB) process is useless: Linux carries the
    parent's high-water mark over ``execve`` (``exec_mmap`` folds the old, forked mm's peak into
    the child's ``maxrss``), so every child would report at least the parent's size. ``VmHWM``
    belongs to the new address space. Both are reported.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)  # kB
    return _ru_maxrss_mb()


def _ru_maxrss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def champion_of(home: str | None, scratch: Path, **training: Any) -> tuple[Any, Any, str]:
    """(settings, ServingModel, home) of the given home, or of a champion built like the tests'."""
    if home:
        from tasks.models.champion import serving_model
        from tasks.settings import load_settings

        settings = load_settings(home=home)
        return settings, serving_model(settings), str(Path(home).resolve())
    from tests.factories.champion import champion_home

    built = scratch / "champion-home"
    settings, model = champion_home(str(built), **training)
    return settings, model, str(built)


def write_images(folder: Path, n: int, seed: int = 20261122) -> dict[str, Any]:
    """``n`` distinct 32x32 grey PNGs derived from the real digits (module doc); returns a summary."""
    import numpy as np
    from PIL import Image

    from tasks.data.sample_data import digits_arrays

    digits, _ = digits_arrays()
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    total = 0
    for i in range(n):
        base = np.asarray(Image.fromarray(digits[i % len(digits)], mode="L").resize((32, 32), Image.BILINEAR), np.float32)
        while True:
            dy, dx = rng.integers(-2, 3, size=2)
            pixels = np.roll(base, (int(dy), int(dx)), axis=(0, 1)) + rng.normal(0.0, 4.0, base.shape)
            buffer = io.BytesIO()
            Image.fromarray(np.rint(pixels).clip(0, 255).astype(np.uint8), mode="L").save(buffer, format="PNG")
            data = buffer.getvalue()
            digest = hashlib.sha256(data).hexdigest()
            if digest not in seen:
                break
        seen.add(digest)
        total += len(data)
        (folder / f"img_{i:05d}.png").write_bytes(data)
    return {"files": n, "distinct_sha256": len(seen), "mean_bytes": round(total / n)}


def copy_first(src: Path, dst: Path, n: int) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.iterdir())[:n]:
        (dst / path.name).write_bytes(path.read_bytes())


def with_lake(settings: Any, lake: Path) -> Any:
    return settings.model_copy(update={"storage": settings.storage.model_copy(update={"lake_uri": str(lake)})})


def bare_loop(pyfunc: Any, folder: Path, batch_size: int) -> tuple[float, dict[str, str]]:
    """(seconds, {file name: label}) of the bare loop over the folder's files in sorted order."""
    import pandas as pd

    paths = sorted(str(p) for p in folder.iterdir())
    labels: dict[str, str] = {}
    start = time.perf_counter()
    for i in range(0, len(paths), batch_size):
        batch = paths[i:i + batch_size]
        images = []
        for path in batch:
            with open(path, "rb") as fh:
                images.append(fh.read())
        out = pyfunc.predict(pd.DataFrame({"image": images}))
        labels.update(zip(batch, out["label"].tolist()))
    seconds = time.perf_counter() - start
    return seconds, {Path(p).name: label for p, label in labels.items()}


def product_run(settings: Any, folder: Path, lake: Path, run_id: str) -> tuple[float, Any]:
    from tasks.serving.score import score

    start = time.perf_counter()
    result = score(with_lake(settings, lake), str(folder), run_id=run_id, logical_date=LOGICAL_DATE)
    return time.perf_counter() - start, result


# ---------------------------------------------------------------------------------------------- child


def child(args: argparse.Namespace) -> int:
    """One measurement in a fresh process: prints {"seconds", "peak_rss_mb", ...} as JSON."""
    from tasks.settings import Settings

    settings = Settings.model_validate_json(Path(args.settings).read_text())
    import torch

    torch.set_num_threads(args.threads)

    before = _peak_rss_mb()
    if args.child == "product":
        seconds, result = product_run(settings, Path(args.folder), Path(args.lake), f"bench__child_{args.tag}")
        extra = {"scored": result.scored, "versions": result.versions}
    else:
        import mlflow.pyfunc

        from tasks.models.registry import mlflow_client

        mlflow_client(settings)
        pyfunc = mlflow.pyfunc.load_model(args.model_uri)
        seconds, labels = bare_loop(pyfunc, Path(args.folder), settings.serving.batch_size)
        extra = {"predicted": len(labels)}
    print(json.dumps({"kind": args.child, "files": len(os.listdir(args.folder)), "seconds": round(seconds, 2),
                      "peak_rss_mb": _peak_rss_mb(), "peak_rss_after_imports_mb": before,
                      "ru_maxrss_mb_inherited_from_parent": _ru_maxrss_mb(),
                      "torch_threads": torch.get_num_threads(), **extra}))
    return 0


def in_child(kind: str, folder: Path, scratch: Path, settings_path: Path, model_uri: str, tag: str,
             threads: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--settings", str(settings_path),
               "--folder", str(folder), "--lake", str(scratch / f"lake-child-{tag}"), "--model-uri", model_uri,
               "--tag", tag, "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {kind} {tag} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- main


def profile_product(settings: Any, folder: Path, lake: Path, top: int = 30) -> dict[str, Any]:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    seconds, _ = product_run(settings, folder, lake, "bench__profile")
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({name})", "calls": calls,
                     "tottime_s": round(tottime, 3), "cumtime_s": round(cumtime, 3)})
    by_cum = sorted(rows, key=lambda r: -r["cumtime_s"])[:top]
    by_own = sorted(rows, key=lambda r: -r["tottime_s"])[:top]
    return {"seconds_under_cprofile": round(seconds, 2), "top_cumulative": by_cum, "top_own_time": by_own}


def breakdown(settings: Any, model: Any, folder: Path, repeats: int = 3) -> dict[str, float]:
    """Seconds of each step of scoring ``folder``, each alone with the product's own functions (median of ``repeats``).

    No profiler overhead: what each step costs for the whole folder, so their sum can be set against
    a ``score()`` run (the rest is Arrow/Parquet/Delta and bookkeeping).
    """
    import mlflow.pyfunc
    import pandas as pd

    from tasks.data.images import screen
    from tasks.data.sources import open_source
    from tasks.models.loading import load_predictor

    ing, size = settings.ingest, settings.serving.batch_size
    steps: dict[str, list[float]] = {}
    pyfunc = mlflow.pyfunc.load_model(model.uri)

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        steps.setdefault(name, []).append(now - since)
        return now

    for _ in range(repeats):
        t = time.perf_counter()
        source = open_source(str(folder))
        entries = list(source.entries())
        t = lap("open_source + listing", t)
        data = [source.read(e, settings.ingest.max_file_bytes) for e in entries]
        t = lap("read files", t)
        for d in data:
            hashlib.sha256(d).hexdigest()
        t = lap("sha256", t)
        for d in data:
            screen(d, min_side=ing.min_side, max_side=ing.max_side, max_pixels=ing.max_pixels,
                   keep_modes=ing.keep_modes, convert_modes=ing.convert_modes)
        t = lap("screen (header checks, PIL open)", t)
        predictor = load_predictor(settings, model.uri)
        t = lap("load_predictor (download + build)", t)
        for i in range(0, len(data), size):
            predictor.predict_proba(data[i:i + size])
        t = lap("predictor.predict_proba (decode + network), batches", t)
        for i in range(0, len(data), size):
            pyfunc.predict(pd.DataFrame({"image": data[i:i + size]}))
        lap("pyfunc.predict on DataFrames (bare loop minus reads)", t)
    return {name: round(statistics.median(v), 3) for name, v in steps.items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--n-small", type=int, default=2_500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (main and children)")
    parser.add_argument("--threads2-pairs", type=int, default=2, help="extra baseline/product pairs at 2 threads")
    parser.add_argument("--home", default=os.environ.get("CD4ML_HOME"), help="a CD4ML_HOME with a champion")
    parser.add_argument("--profile", action="store_true", help="also cProfile one product run")
    parser.add_argument("--model", default="small_cnn", help="architecture of the champion built (no --home)")
    parser.add_argument("--image-size", type=int, default=16, help="its input side in pixels (no --home)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "score.json"))
    parser.add_argument("--child", choices=["product", "baseline"], help=argparse.SUPPRESS)
    for hidden in ("--settings", "--folder", "--lake", "--model-uri", "--tag"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    return parser.parse_args()


def timed_runs(args: argparse.Namespace, settings: Any, pyfunc: Any, big: Path, scratch: Path) -> dict[str, Any]:
    """Bare loop and product alternately (``--repeats``), then the pairs at 2 torch threads."""
    import torch

    batch_size = settings.serving.batch_size
    baseline_s, product_s, runs = [], [], []
    labels: dict[str, str] = {}
    last_lake = scratch / "lake-0"
    for r in range(args.repeats):
        seconds, labels = bare_loop(pyfunc, big, batch_size)
        baseline_s.append(seconds)
        _progress(f"run {r + 1}/{args.repeats}: bare loop {seconds:.2f} s")
        last_lake = scratch / f"lake-{r + 1}"
        seconds, result = product_run(settings, big, last_lake, f"bench__score_{r + 1}")
        product_s.append(seconds)
        assert result.scored == args.n and result.quarantined == 0, result.to_dict()
        runs.append({"baseline_s": round(baseline_s[-1], 2), "product_s": round(seconds, 2),
                     "product_versions": result.versions, "loadavg_1m": round(os.getloadavg()[0], 2)})
        _progress(f"run {r + 1}/{args.repeats}: score() {seconds:.2f} s, versions {result.versions}")
    threads2: list[dict[str, float]] = []
    if args.threads2_pairs:
        torch.set_num_threads(2)
        for r in range(args.threads2_pairs):
            b, _ = bare_loop(pyfunc, big, batch_size)
            p, _ = product_run(settings, big, scratch / f"lake-threads2-{r}", f"bench__threads2_{r}")
            threads2.append({"baseline_s": round(b, 2), "product_s": round(p, 2), "ratio": round(b / p, 3),
                             "loadavg_1m": round(os.getloadavg()[0], 2)})
            _progress(f"2 threads, pair {r + 1}: {threads2[-1]}")
        torch.set_num_threads(args.threads)
    return {"baseline_s": baseline_s, "product_s": product_s, "runs": runs, "labels": labels,
            "last_lake": last_lake, "threads2": threads2}


def agreement_and_rerun(args: argparse.Namespace, settings: Any, big: Path, timed: dict[str, Any]) -> dict[str, Any]:
    """Labels of the last product run against the bare loop's; the same files again: nothing new."""
    from tasks.data import lake

    table_uri = with_lake(settings, timed["last_lake"]).predictions_table
    rows = lake.scan(lake.open_table(table_uri), columns=["source_uri", "label"])
    product_labels = dict(zip((u.rsplit("/", 1)[1] for u in rows.column("source_uri").to_pylist()),
                              rows.column("label").to_pylist()))
    labels = timed["labels"]
    agreement = sum(product_labels.get(k) == v for k, v in labels.items()) / len(labels)
    version_before = lake.current_version(table_uri)
    rerun_s, again = product_run(settings, big, timed["last_lake"], "bench__rerun")
    rows_after = lake.scan(lake.open_table(table_uri), columns=["image_key"]).num_rows
    version_after = lake.current_version(table_uri)
    assert again.scored == 0 and again.already_scored == args.n and again.versions == [], again.to_dict()
    assert rows_after == args.n and version_after == version_before, (rows_after, version_before, version_after)
    _progress(f"re-run {rerun_s:.2f} s: 0 new rows, {rows_after} rows, version {version_after} unchanged")
    return {"agreement": agreement, "rerun": {
        "seconds": round(rerun_s, 2), "new_rows": again.scored, "already_scored": again.already_scored,
        "rows_after": rows_after, "delta_version_before": version_before, "delta_version_after": version_after}}


def memory_runs(args: argparse.Namespace, folders: dict[int, Path], scratch: Path, settings_path: Path,
                model_uri: str) -> dict[str, Any]:
    """Peak RSS of a fresh child scoring (or bare-looping) the small and the big folder."""
    memory = {}
    for kind in ("product", "baseline"):
        for n, folder in folders.items():
            memory[f"{kind}_{n}"] = in_child(kind, folder, scratch, settings_path, model_uri, f"{kind}-{n}", args.threads)
            _progress(f"child {kind} {n}: {memory[f'{kind}_{n}']}")
    return memory


def report(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """bench/results JSON and the summary lines."""
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    t, memory, rerun = out["throughput"], out["memory_peak_rss_mb"], out["rerun"]
    print("| path | runs s | median s | images/s |\n|---|---|---:|---:|")
    print(f"| bare loop `pyfunc.predict` | {', '.join(map(str, t['baseline_s']))} | {t['baseline_median_s']} | "
          f"{t['baseline_images_per_s']} |")
    print(f"| `score()` | {', '.join(map(str, t['product_s']))} | {t['product_median_s']} | {t['product_images_per_s']} |")
    print(f"\nratio {t['ratio_baseline_over_product']} (target >= 0.9); labels agree "
          f"{t['label_agreement_baseline_vs_product']:.2%}; re-run {rerun['seconds']:.2f} s, 0 new rows, "
          f"version {rerun['delta_version_after']} unchanged")
    print("peak RSS MB: " + ", ".join(f"{k} {v['peak_rss_mb']}" for k, v in memory.items())
          + f"; product growth {args.n_small} -> {args.n}: {out['product_rss_growth_small_to_n']:+.1%}")
    print(f"load {out['machine']['loadavg_before'][0]} -> {os.getloadavg()[0]:.2f}; wrote {args.out}")


def main() -> int:
    args = parse_args()
    if args.child:
        return child(args)
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="cd4ml-bench-score-") as tmp:
        scratch = Path(tmp)
        t0 = time.perf_counter()  # 1. champion and images
        settings, model, home = champion_of(args.home, scratch, model=args.model, image_size=args.image_size)
        _progress(f"champion {model.uri} in {home} ({time.perf_counter() - t0:.1f} s)")
        settings_path = scratch / "settings.json"
        settings_path.write_text(settings.model_dump_json())
        batch_size = settings.serving.batch_size
        t0 = time.perf_counter()
        big, small = scratch / f"images-{args.n}", scratch / f"images-{args.n_small}"
        images = write_images(big, args.n)
        copy_first(big, small, args.n_small)
        assert images["distinct_sha256"] == args.n, images
        _progress(f"{args.n} + {args.n_small} PNGs written ({time.perf_counter() - t0:.1f} s): {images}")

        import mlflow.pyfunc  # 2. warm both paths, then the timed runs
        import torch

        from tasks.models.registry import mlflow_client

        torch.set_num_threads(args.threads)
        mlflow_client(settings)
        t0 = time.perf_counter()
        pyfunc = mlflow.pyfunc.load_model(model.uri)
        baseline_load_s = time.perf_counter() - t0
        warm = scratch / "warm"
        copy_first(big, warm, batch_size)
        bare_loop(pyfunc, warm, batch_size)  # untimed warm-up of both paths (imports, first torch call)
        product_run(settings, warm, scratch / "lake-warm", "bench__warm")
        timed = timed_runs(args, settings, pyfunc, big, scratch)
        checked = agreement_and_rerun(args, settings, big, timed)  # 3. same labels, a re-run adds nothing

        profile = None
        if args.profile:
            profile = profile_product(settings, big, scratch / "lake-profile")
            profile["steps_alone_s"] = breakdown(settings, model, big)
            _progress(f"steps alone: {profile['steps_alone_s']}")
            _progress(f"profiled product run: {profile['seconds_under_cprofile']} s under cProfile")
        memory = memory_runs(args, {args.n_small: small, args.n: big}, scratch, settings_path, model.uri)  # 4.
        torch_threads = torch.get_num_threads()

    baseline_s, product_s = timed["baseline_s"], timed["product_s"]  # 5. the report
    med_base, med_prod = statistics.median(baseline_s), statistics.median(product_s)
    growth = memory[f"product_{args.n}"]["peak_rss_mb"] / memory[f"product_{args.n_small}"]["peak_rss_mb"] - 1
    report(args, {
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "torch_threads": torch_threads, "loadavg_before": load_before, "loadavg_after": _load()},
        "model": {**model.to_dict(), "architecture": args.model, "image_size": args.image_size,
                  "home": "temporary (tests/factories/champion.py)" if not args.home else home},
        "images": {**images, "kind": "32x32 grey PNG from sklearn load_digits, shifted -2..2 px, noise sigma 4",
                   "n_small": args.n_small},
        "batch_size": batch_size, "commit_every": settings.serving.commit_every,
        "throughput": {
            "baseline_s": [round(s, 2) for s in baseline_s], "product_s": [round(s, 2) for s in product_s],
            "runs_in_order": timed["runs"],
            "baseline_median_s": round(med_base, 2), "product_median_s": round(med_prod, 2),
            "baseline_images_per_s": round(args.n / med_base, 1), "product_images_per_s": round(args.n / med_prod, 1),
            "ratio_baseline_over_product": round(med_base / med_prod, 3), "target": 0.9,
            "baseline_load_model_s_not_counted": round(baseline_load_s, 2),
            "ratio_if_baseline_counted_its_load": round((med_base + baseline_load_s) / med_prod, 3),
            "label_agreement_baseline_vs_product": round(checked["agreement"], 4),
            "at_2_torch_threads": timed["threads2"],
        },
        "rerun": checked["rerun"],
        "memory_peak_rss_mb": memory,
        "memory_note": "peak_rss_mb is VmHWM of a fresh child (ru_maxrss there is the parent's, carried over exec)",
        "product_rss_growth_small_to_n": round(growth, 3),
        "profile": profile,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
