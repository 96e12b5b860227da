"""Copy scores inside an Airflow task's process: the workers ``spawn`` started before, and ``tasks.worker_pool``'s.

In a task's process Airflow 3 bars the metadata database (its URL is ``airflow-db-not-allowed:///``), and a worker
started by plain ``spawn`` re-runs the caller's main script, ``airflow``, whose import fails on that URL: the pool
broke and curation scored every pair on one core. This runs, in a fresh process made like a task's (Airflow imported,
then the URL barred), ``CopyScores.score_many`` on the same pairs of noise images twice: with the pool plain
``spawn`` gives (the code before) and with ``tasks.worker_pool.spawn_pool`` (now), one after the other, and prints
each one's wall time and whether the workers scored or the task fell over to one process.

Usage: PYTHONPATH=.:plugins python bench/task_workers.py [--images 170] [--repeats 2]
(170 noise images give 14,365 pairs, about a topology stack test's sit curation: 13,801 pairs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TASK = textwrap.dedent('''
    import io
    import itertools
    import json
    import logging
    import multiprocessing
    import os
    import sys
    import time
    from concurrent.futures import ProcessPoolExecutor

    import airflow  # noqa: F401  (a task's process has Airflow imported ...)

    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = "airflow-db-not-allowed:///"  # ... and the database barred

    from tasks.curation import copy_pairs
    from tasks.curation.copy_pairs import CopyScores
    from tests.factories.curation import noise_pngs

    mode, n = sys.argv[1], int(sys.argv[2])
    if mode == "plain":  # the pool as it was made before tasks.worker_pool
        copy_pairs.spawn_pool = lambda w: ProcessPoolExecutor(w, mp_context=multiprocessing.get_context("spawn"))
    log = io.StringIO()
    logging.basicConfig(stream=log, level=logging.WARNING, force=True)  # airflow set up its own
    images = {f"{i:064d}": data for i, data in enumerate(noise_pngs(n, 32))}
    pairs = list(itertools.combinations(sorted(images), 2))
    start = time.perf_counter()
    scores = CopyScores(images.__getitem__, workers=2)
    scores.score_many(pairs)
    wall = time.perf_counter() - start
    print(json.dumps({"mode": mode, "pairs": scores.fresh.count, "wall_s": round(wall, 2),
                      "fell_over": "in this process" in log.getvalue()}))
''')


def run(mode: str, images: int, workdir: Path) -> dict:
    script = workdir / "task_like.py"
    script.write_text(TASK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins")])}
    done = subprocess.run([sys.executable, str(script), mode, str(images)], capture_output=True, text=True,
                          env=env, cwd=workdir, timeout=3600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=170)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "cd4ml-task-workers"
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [run(mode, args.images, workdir) for _ in range(args.repeats) for mode in ("plain", "spawn_pool")]
    for row in rows:
        print(json.dumps(row))
    by = {m: min(r["wall_s"] for r in rows if r["mode"] == m) for m in ("plain", "spawn_pool")}
    print(f"best of {args.repeats}: plain spawn {by['plain']} s, spawn_pool {by['spawn_pool']} s "
          f"({by['spawn_pool'] / by['plain']:.2f}x)")


if __name__ == "__main__":
    main()
