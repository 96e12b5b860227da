"""Running whole DAGs and the `cd4ml` command in a test's own homes (tests/dags/test_dags_run*.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.dags.conftest import run_airflow

DATE = "2026-11-21"


def cd4ml(args: list[str], env: dict) -> str:
    """`cd4ml ARGS` in ``env``: its stdout (the test fails with its stderr otherwise)."""
    cli = Path(sys.executable).parent / "cd4ml"
    proc = subprocess.run([str(cli), *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def dag_test(dag_id: str, env: dict, conf: dict | None = None, expect_rc: int = 0) -> str:
    """`airflow dags test DAG DATE`: its output, after checking its exit code."""
    args = ["dags", "test", dag_id, DATE] + (["-c", json.dumps(conf)] if conf else [])
    proc = run_airflow(args, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect_rc, f"{dag_id} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def status(env: dict) -> dict:
    """`cd4ml status` of sit."""
    return json.loads(cd4ml(["status", "--env", "sit"], env))["environments"]["sit"]
