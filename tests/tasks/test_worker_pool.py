"""Spawned workers start whatever the caller's main script is: one whose re-run fails (an Airflow task's ``airflow``
script under Airflow 3's task environment) and one without a main guard (whose re-run would start the work again)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# As in a task's process: Airflow imported, then the metadata database barred (the URL Airflow 3 gives a task), so a
# re-run of this script in a worker (``import airflow``) fails on the URL.
AIRFLOW_TASK = textwrap.dedent('''
    import os
    import sys

    import airflow  # noqa: F401

    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = "airflow-db-not-allowed:///"

    if sys.argv[1] == "plain":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    else:
        from tasks.worker_pool import spawn_pool
        pool = spawn_pool(2)
    with pool:
        print("results", list(pool.map(abs, [-1, -2, -3, -4])))
''')

NO_GUARD = textwrap.dedent('''
    import os

    from tasks.worker_pool import spawn_pool

    print("ran in", "worker" if os.environ.get("SEEN") else "caller")  # a re-run in a worker would print this again
    os.environ["SEEN"] = "1"
    with spawn_pool(2) as pool:
        print("results", list(pool.map(abs, range(-8, 0))))
''')


def _run(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "main_script.py"
    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins'}"}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)


@pytest.mark.parametrize("pool", ["plain", "ours"])
def test_workers_start_in_an_airflow_task_process(tmp_path: Path, pool: str) -> None:
    done = _run(tmp_path, AIRFLOW_TASK, pool)
    if pool == "plain":  # the failure this module exists for, so that the test below can fail
        assert done.returncode != 0
        assert "BrokenProcessPool" in done.stderr and "SQLAlchemy URL" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-2000:]
    assert "results [1, 2, 3, 4]" in done.stdout


def test_a_main_script_without_a_guard_runs_once(tmp_path: Path) -> None:
    done = _run(tmp_path, NO_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["ran in caller", f"results {list(range(8, 0, -1))}"]
