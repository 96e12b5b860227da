"""The demo chain under Airflow's real scheduler, and Airflow's own share of its wall time.

For each mode (``embedded``: SQLite + LocalExecutor; ``scaleout``: PostgreSQL + Celery on Redis
with two workers + the MLflow server), in a fresh CD4ML_HOME:

1. ``cd4ml up`` (the product's launcher), the digits sample in the landing zone;
2. ``cd4ml_ingest`` triggered through the REST API; ``cd4ml_curate`` and ``cd4ml_train`` follow
   through their Assets (sit: no approval);
3. from the REST API, every task instance's start and end: **task time** is the union of those
   intervals (a task's process start-up, imports and code), **Airflow's time** is the rest of the
   chain's wall time (ingest run queued -> train run ended): scheduling, queueing, executor and
   worker pick-up, the Asset hand-offs.

Baseline in the same run: the same chain with ``airflow dags test`` (one process per DAG, no
scheduler), as ``make demo`` does.

    python bench/stack_overhead.py [--modes embedded scaleout] [--out bench/results/stack_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from tests.dags.airflow_services import AirflowHandle, free_port, q, trigger, wait_for_run  # noqa: E402
from tests.stack import harness  # noqa: E402

BIN = Path(sys.executable).parent
DATE = "2026-11-21"
CONF = "\ningest: {schedule: null}\n"


def _env(home: Path, mode: str) -> dict[str, str]:
    conf = harness.write_conf(home / "conf", CONF)
    return harness.stack_env(home, mode, conf, CD4ML_PG_PREFIX=f"bench{os.getpid()}", CD4ML_REDIS_DB="12")


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def run_stack(mode: str) -> dict:
    from tasks.ops.stack import plan

    home = Path(tempfile.mkdtemp(prefix=f"cd4ml-bench-{mode}-"))
    env = _env(home, mode)
    port, mlflow_port = free_port(), free_port()
    subprocess.run([str(BIN / "cd4ml"), "sample-data"], env=env, check=True, capture_output=True)
    started = time.monotonic()
    up = harness.start(env, home / "up.log", port, mlflow_port)
    try:
        up_s = time.monotonic() - started
        stack = plan(mode, home=env["CD4ML_HOME"], port=port, mlflow_port=mlflow_port, base_env=env)
        h = AirflowHandle(home=str(home), base_url=f"http://127.0.0.1:{port}", env=stack.env,
                          users={u: (r, pw) for u, (r, pw) in stack.users.items()})
        for dag_id in ("cd4ml_ingest", "cd4ml_curate", "cd4ml_train"):
            h.wait_for_dag(dag_id, timeout=300)
            h.unpause(dag_id)
        runs = {"cd4ml_ingest": trigger(h, "cd4ml_ingest", {}, user="admin")}
        assert wait_for_run(h, "cd4ml_ingest", runs["cd4ml_ingest"], timeout=900) == "success"
        for dag_id in ("cd4ml_curate", "cd4ml_train"):
            runs[dag_id] = harness.asset_run(h, dag_id, timeout=900)
            assert wait_for_run(h, dag_id, runs[dag_id], timeout=1800) == "success", dag_id
        intervals, per_task = [], {}
        for dag_id, run_id in runs.items():
            tis = h.request("GET", f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances?limit=100",
                            user="admin")["task_instances"]
            for ti in tis:
                if ti["start_date"] and ti["end_date"]:
                    intervals.append((_ts(ti["start_date"]), _ts(ti["end_date"])))
                    per_task[f"{dag_id}.{ti['task_id']}"] = round(per_task.get(f"{dag_id}.{ti['task_id']}", 0)
                                                                  + ti["duration"], 2)
        first = h.request("GET", f"/api/v2/dags/cd4ml_ingest/dagRuns/{q(runs['cd4ml_ingest'])}", user="admin")
        last = h.request("GET", f"/api/v2/dags/cd4ml_train/dagRuns/{q(runs['cd4ml_train'])}", user="admin")
        wall = _ts(last["end_date"]) - _ts(first["queued_at"])
        busy = _union(intervals)
        return {"mode": mode, "stack_up_s": round(up_s, 1), "chain_wall_s": round(wall, 1),
                "task_time_s": round(busy, 1), "airflow_s": round(wall - busy, 1),
                "airflow_share": round((wall - busy) / wall, 3), "task_instances": len(intervals),
                "slowest_tasks": dict(sorted(per_task.items(), key=lambda kv: -kv[1])[:6])}
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=120)
        if mode == "scaleout":
            harness.drop_databases(env["CD4ML_PG_PREFIX"])


def run_dags_test() -> dict:
    """The baseline: the same chain as `make demo` (airflow dags test, no scheduler)."""
    home = Path(tempfile.mkdtemp(prefix="cd4ml-bench-dagstest-"))
    env = _env(home, "embedded")
    env.update({"AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    subprocess.run([str(BIN / "cd4ml"), "sample-data"], env=env, check=True, capture_output=True)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    started = time.monotonic()
    for dag_id in ("cd4ml_ingest", "cd4ml_curate", "cd4ml_train"):
        subprocess.run([str(BIN / "airflow"), "dags", "test", dag_id, DATE], env=env, check=True,
                       capture_output=True)
    return {"mode": "airflow dags test (make demo)", "chain_wall_s": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["embedded", "scaleout"])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "stack_overhead.json"))
    args = parser.parse_args()
    results = [run_dags_test()] + [run_stack(mode) for mode in args.modes]
    for r in results:
        print(json.dumps(r))
    Path(args.out).write_text(json.dumps({"date": datetime.now().isoformat(timespec="seconds"),
                                          "cpus": os.cpu_count(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
