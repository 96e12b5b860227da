"""How long each DAG file takes to parse, against bare baselines, measured in one run.

* cold: ``python dags/<file>`` in a fresh interpreter (what the Airflow guide times), median
  of N runs, against ``python -c "import airflow.sdk"`` (the floor any DAG file pays).
* warm: the DagBag re-parse of that one file inside a warm process, as the DAG processor does
  every 30 s; median of N.

Usage: python bench/dag_parse.py [--repeats 5]   (prints a Markdown table)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAGS = sorted(p for p in (REPO / "dags").glob("*.py") if not p.name.startswith("_"))


def _cold(args: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _warm(path: Path, repeats: int) -> float:
    from airflow.dag_processing.dagbag import DagBag

    DagBag(dag_folder=str(path))  # first parse pays the shared imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        bag = DagBag(dag_folder=str(path))
        times.append(time.perf_counter() - start)
        assert not bag.import_errors, bag.import_errors
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cd4ml-bench-"))
    os.environ.update({"AIRFLOW_HOME": str(home / "airflow"), "CD4ML_HOME": str(home / "cd4ml"),
                       "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags")})
    base_python = _cold(["-c", "pass"], args.repeats)
    base_sdk = _cold(["-c", "import airflow.sdk"], args.repeats)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, median of {args.repeats}\n")
    print("| DAG file | cold parse (s) | ratio to `import airflow.sdk` | warm DagBag re-parse (ms) |")
    print("|---|---|---|---|")
    print(f"| baseline `python -c pass` | {base_python:.2f} | {base_python / base_sdk:.2f}x | - |")
    print(f"| baseline `import airflow.sdk` | {base_sdk:.2f} | 1.00x | - |")
    for path in DAGS:
        cold = _cold([str(path)], args.repeats)
        warm = _warm(path, args.repeats)
        print(f"| `dags/{path.name}` | {cold:.2f} | {cold / base_sdk:.2f}x | {warm * 1000:.0f} |")


if __name__ == "__main__":
    main()
