"""Start `cd4ml up` for a test or a benchmark: its own home, settings, ports and databases, nothing shared.

Used by tests/stack (scale-out, browser) and bench/stack_overhead.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.dags.airflow_services import AirflowHandle, q

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def write_conf(target: Path, sit_extra: str = "", approvers: str | None = None) -> Path:
    """A copy of conf/ whose sit.yaml gets ``sit_extra`` and, with ``approvers``, needs a person's approval."""
    target.mkdir(parents=True)
    for name in ("base.yaml", "sit.yaml", "uat.yaml", "prod.yaml"):
        text = (REPO / "conf" / name).read_text()
        if name == "sit.yaml":
            if approvers is not None:
                assert "\nrelease:" not in text  # sit keeps release's defaults (approval none): one section added
                text += f"release:\n  approval: required\n  approvers: {approvers}\n"
            text += sit_extra
        (target / name).write_text(text)
    return target


def stack_env(home: Path, mode: str, conf: Path, **extra: str) -> dict[str, str]:
    """The environment a user would have: none of this process's AIRFLOW_/MLFLOW_/CD4ML_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLFLOW", "CD4ML"))}
    env.update({"CD4ML_HOME": str(home / "cd4ml"), "CD4ML_ENV": "sit", "CD4ML_STACK": mode,
                "CD4ML_CONF_DIR": str(conf), "FASTDUP_PRODUCTION": "1", "GIT_PYTHON_REFRESH": "quiet",
                "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}", "PATH": f"{BIN}:{env.get('PATH', '')}", **extra})
    return env


def start(env: dict[str, str], log: Path, port: int, mlflow_port: int, timeout: float = 420) -> subprocess.Popen:
    """`cd4ml up` in its own session; returns once it says the stack is up (fails with its log otherwise)."""
    with open(log, "w") as out:
        up = subprocess.Popen([str(BIN / "cd4ml"), "up", "--port", str(port), "--mlflow-port", str(mlflow_port)],
                              env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while "stack up" not in log.read_text():
        if up.poll() is not None or time.monotonic() > deadline:
            up.kill()
            raise RuntimeError(f"cd4ml up did not come up (exit {up.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(1)
    return up


def drop_databases(prefix: str) -> None:
    """Drop the PostgreSQL databases a scale-out stack created under ``prefix``."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{prefix}\\_%",))
        for (name,) in cur.fetchall():
            cur.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    conn.close()


def asset_run(h: AirflowHandle, dag_id: str, timeout: float = 600) -> str:
    """The one run an Asset event created for ``dag_id``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = h.request("GET", f"/api/v2/dags/{q(dag_id)}/dagRuns", user="admin")["dag_runs"]
        if runs:
            assert len(runs) == 1, [r["dag_run_id"] for r in runs]
            return runs[0]["dag_run_id"]
        time.sleep(1)
    raise TimeoutError(f"no {dag_id} run was triggered by its Asset")
