"""The scale-out mode for real: `cd4ml up` with CD4ML_STACK=scaleout on this machine's PostgreSQL and Redis.

One stack (the product's own launcher: PostgreSQL metadata DB, CeleryExecutor with two workers,
FAB auth manager, MLflow server with basic-auth on PostgreSQL, Optuna on PostgreSQL), driven
only through the REST API:

* ingest is triggered with Params; one Celery worker is SIGKILLed (its whole process group)
  while it runs the ingest task; the scheduler notices the lost heartbeat and the retry succeeds
  on a live worker; curate and train follow through Assets; tuning trials run on both workers;
  no table gains a duplicate row.
* who gets in: no token, a wrong password, a viewer and a non-approver are refused and nothing
  changes; MLflow refuses requests without credentials.
* stopping `cd4ml up` leaves no process behind.

Marked ``stack``: `make test` runs them (about 6 minutes); they skip, saying why, only when
PostgreSQL or Redis do not answer.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from tests.dags.airflow_services import AirflowHandle, free_port, q, trigger, wait_for_run, wait_for_task_state
from tests.stack import harness
from tests.stack.harness import BIN

pytestmark = pytest.mark.stack

REDIS_DB = "11"
FAST_CONF = """
ingest: {schedule: null}
training: {epochs: 3, patience: 2}
tuning: {on_by_default: true, n_trials: 2, epochs_per_trial: 2, pruner: none}
"""


def _services_or_skip() -> None:
    psycopg2 = pytest.importorskip("psycopg2")
    redis = pytest.importorskip("redis")
    try:
        psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=3).close()
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=3).ping()
    except (psycopg2.OperationalError, redis.RedisError) as exc:
        pytest.skip(f"PostgreSQL (5432) or Redis (6379) is not answering: {exc}")


def _alive(pgid: int) -> list[int]:
    from tasks.ops.stack import group_pids

    return group_pids(pgid)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict]:
    _services_or_skip()
    import redis

    home = tmp_path_factory.mktemp("scaleout")
    # a person approves sit's champion here, so the approval path runs under FAB
    conf = harness.write_conf(home / "conf", FAST_CONF, approvers="['role:Approver']")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    port, mlflow_port = free_port(), free_port()
    env = harness.stack_env(home, "scaleout", conf, CD4ML_PG_PREFIX=prefix, CD4ML_REDIS_DB=REDIS_DB,
                            CD4ML_HEARTBEAT_TIMEOUT="15")
    redis.Redis(host="127.0.0.1", port=6379, db=int(REDIS_DB)).flushdb()
    subprocess.run([str(BIN / "cd4ml"), "sample-data", "--with-bad-files"], env=env, check=True, capture_output=True)
    state_file = home / "cd4ml" / "stack" / "scaleout" / "stack.json"
    info = {"home": home, "env": env, "log": home / "up.log", "port": port, "mlflow_port": mlflow_port,
            "prefix": prefix}
    up = None
    try:
        up = info["up"] = harness.start(env, info["log"], port, mlflow_port)
        secrets = dict(line.split("=", 1) for line in (home / "cd4ml" / "stack" / "secrets.env").read_text()
                       .splitlines() if "=" in line and not line.startswith("#"))
        info["secrets"] = secrets
        info["groups"] = json.loads(state_file.read_text())["groups"]
        info["handle"] = AirflowHandle(
            home=str(home), base_url=f"http://127.0.0.1:{port}", env=env,
            users={"admin": ("Admin", secrets["CD4ML_ADMIN_PASSWORD"]),
                   "approver": ("User", secrets["CD4ML_APPROVER_PASSWORD"])})
        yield info
    finally:
        try:
            if up is not None:
                up.send_signal(signal.SIGTERM)
                up.wait(timeout=90)
        finally:
            groups = json.loads(state_file.read_text())["groups"] if state_file.exists() else info.get("groups", {})
            leftovers = {name: _alive(pgid) for name, pgid in (info.get("groups") or groups).items()}
            for pids in leftovers.values():
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
            harness.drop_databases(prefix)
            redis.Redis(host="127.0.0.1", port=6379, db=int(REDIS_DB)).flushdb()
        assert up is not None and up.returncode == 0, info["log"].read_text()[-3000:]
        assert not any(leftovers.values()), f"processes outlived cd4ml up: {leftovers}"


def _running_ti(h: AirflowHandle, dag_id: str, run_id: str, task_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, ti = h.raw("GET", f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}")
        if status == 200 and ti["state"] == "running" and ti.get("pid") and ti.get("hostname"):
            return ti
        time.sleep(0.3)
    raise TimeoutError(f"{task_id} of {run_id} never ran")


def _tries(h: AirflowHandle, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict]:
    path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}"
    if map_index >= 0:
        path += f"/{map_index}"
    return h.request("GET", f"{path}/tries")["task_instances"]


def _mapped(h: AirflowHandle, dag_id: str, run_id: str, task_id: str) -> list[dict]:
    path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances?task_id={q(task_id)}"
    return [t for t in h.request("GET", path)["task_instances"] if t["task_id"] == task_id]


def test_chain_survives_a_killed_worker_without_duplicates(stack) -> None:
    h: AirflowHandle = stack["handle"]
    for dag_id in ("cd4ml_ingest", "cd4ml_curate", "cd4ml_train"):
        h.wait_for_dag(dag_id, timeout=180)
        h.unpause(dag_id)
    run = trigger(h, "cd4ml_ingest", {"dataset_version_name": "digits-1"}, user="admin")

    # SIGKILL the whole worker (Celery parent, pool child and the task process) while it ingests.
    ti = _running_ti(h, "cd4ml_ingest", run, "ingest")
    victim = ti["hostname"].split("@")[0]
    assert victim in ("worker-1", "worker-2"), ti["hostname"]
    # At once: a small ingest can finish within a second of being seen running (seen once in CI).
    os.killpg(stack["groups"][victim], signal.SIGKILL)

    assert wait_for_run(h, "cd4ml_ingest", run, timeout=600) == "success"
    tries = _tries(h, "cd4ml_ingest", run, "ingest")
    assert [t["state"] for t in tries][-1] == "success" and len(tries) >= 2, tries
    assert tries[0]["hostname"].startswith(victim) and tries[0]["state"] in ("failed", "up_for_retry"), tries[0]
    print(f"ingest: try 1 on {tries[0]['hostname']} (killed), retried on {tries[-1]['hostname']}")

    curate = harness.asset_run(h, "cd4ml_curate")
    assert wait_for_run(h, "cd4ml_curate", curate, timeout=600) == "success"
    train = harness.asset_run(h, "cd4ml_train")

    # sit requires a person here (conf above): only the role Approver may answer; others get 403.
    wait_for_task_state(h, "cd4ml_train", train, "approve", {"awaiting_input"}, timeout=1200)
    time.sleep(3)  # let the scheduler process the worker's deferral first (see airflow_services)
    _user(stack, "other", "User")
    for user in ("other", "admin"):
        status, body = h.raw("PATCH", _hitl(train), {"chosen_options": ["Approve"], "params_input": {}}, user=user)
        assert status == 403, (user, status, body)
    assert h.request("GET", _hitl(train), user="admin")["response_received"] is False
    status, body = h.raw("PATCH", _hitl(train), {"chosen_options": ["Approve"], "params_input": {"reason": "ok"}},
                         user="approver")
    assert status == 200, body
    assert wait_for_run(h, "cd4ml_train", train, timeout=300) == "success"

    trials = _mapped(h, "cd4ml_train", train, "tune_trial")
    assert len(trials) == 2 and all(t["state"] == "success" for t in trials), trials
    # The trials wait for the drift gate, so they are the run's only tasks left to start: queued together, one
    # a worker (prefetch 1, acks late). The stack has a slot a worker (parallelism 2): while another task holds
    # one (drift_check beside them once did), they queue one at a time on the other, and that task must be named.
    workers = {t["hostname"].split("@")[0] for t in trials}
    if workers != {"worker-1", "worker-2"}:
        holders = _slot_holders(h, trials)
        assert holders, f"trials ran on {workers} while the other worker was free: {trials}"
        print(f"trials ran on {workers}: the other slot was held by {holders}")

    _assert_no_duplicates(stack)
    assert "restarting it" in stack["log"].read_text()  # the killed worker came back, as its pod would


def _slot_holders(h: AirflowHandle, trials: list[dict]) -> list[str]:
    """The tasks (of any run) that ran on another worker while the later trial waited to start: what kept the other
    slot."""
    first, later = sorted(trials, key=lambda t: t["start_date"])
    wait_from = datetime.datetime.fromisoformat(first["start_date"])
    # Those started before the later trial, newest first: a page (the API caps it at 100) holds any that overlapped.
    path = (f"/api/v2/dags/~/dagRuns/~/taskInstances?start_date_lt={q(later['start_date'])}"
            "&order_by=-start_date&limit=100")
    others = [t for t in h.request("GET", path)["task_instances"]
              if t["task_id"] != "tune_trial" and t.get("hostname") and t["hostname"] != first["hostname"]]
    return [f"{t['dag_id']}.{t['task_id']} on {t['hostname']}" for t in others
            if t.get("end_date") is None or datetime.datetime.fromisoformat(t["end_date"]) > wait_from]


def _assert_no_duplicates(stack) -> None:
    import pyarrow.compute as pc

    from tasks.data import lake
    from tasks.settings import load_settings

    os.environ.update({k: stack["env"][k] for k in ("CD4ML_HOME", "CD4ML_CONF_DIR")})
    settings = load_settings("sit")
    keys = {settings.raw_table: "sha256", settings.curated_table: "sha256"}
    for uri, key in keys.items():
        table = lake.read(uri, lake.current_version(uri), [key])
        assert table.num_rows == pc.count_distinct(table.column(key)).as_py(), f"duplicate {key} in {uri}"
    assert lake.read(settings.raw_table, lake.current_version(settings.raw_table), ["sha256"]).num_rows == 1797
    assert lake.current_version(settings.raw_table) == 0  # one commit, although the first try was killed
    rejects = lake.read(settings.rejects_table, lake.current_version(settings.rejects_table))
    assert rejects.num_rows == 2


def test_nobody_gets_in_where_they_do_not_belong(stack) -> None:
    h: AirflowHandle = stack["handle"]
    base = h.base_url
    status, _ = _http("GET", f"{base}/api/v2/dags")
    assert status == 401
    status, body = _http("POST", f"{base}/auth/token", {"username": "admin", "password": "wrong"})
    assert status == 401, body

    # A viewer may look, not act: triggering and unpausing are refused and nothing changes.
    _user(stack, "viewer", "Viewer")
    before = h.request("GET", f"/api/v2/dags/{q('cd4ml_rollback')}/dagRuns", user="admin")["total_entries"]
    status, _ = h.raw("POST", f"/api/v2/dags/{q('cd4ml_rollback')}/dagRuns", {"logical_date": None,
                      "conf": {"reason": "viewer tries"}}, user="viewer")
    assert status == 403
    status, _ = h.raw("PATCH", f"/api/v2/dags/{q('cd4ml_rollback')}", {"is_paused": False}, user="viewer")
    assert status == 403
    assert h.request("GET", f"/api/v2/dags/{q('cd4ml_rollback')}/dagRuns", user="admin")["total_entries"] == before

    # MLflow: no credentials or a wrong password -> 401; the stack's own credentials work.
    mlflow = f"http://127.0.0.1:{stack['mlflow_port']}/api/2.0/mlflow/experiments/search"
    assert _http("POST", mlflow, {"max_results": 5})[0] == 401
    assert _http("POST", mlflow, {"max_results": 5}, basic=("admin", "wrong"))[0] == 401
    status, body = _http("POST", mlflow, {"max_results": 5},
                         basic=("admin", stack["secrets"]["MLFLOW_TRACKING_PASSWORD"]))
    assert status == 200, body


def _hitl(run_id: str) -> str:
    return f"/api/v2/dags/cd4ml_train/dagRuns/{q(run_id)}/taskInstances/approve/-1/hitlDetails"


def _user(stack, name: str, role: str) -> None:
    """A FAB user made the way an operator would (`airflow users create`)."""
    password = f"{name}-{uuid.uuid4().hex[:8]}"
    subprocess.run([str(BIN / "airflow"), "users", "create", "--username", name, "--password", password,
                    "--role", role, "--firstname", name, "--lastname", "test", "--email", f"{name}@cd4ml.local"],
                   env=_airflow_env(stack), check=True, capture_output=True)
    stack["handle"].users[name] = (role, password)


def _airflow_env(stack) -> dict:
    from tasks.ops.stack import plan

    return plan("scaleout", home=stack["env"]["CD4ML_HOME"], port=stack["port"], mlflow_port=stack["mlflow_port"],
                base_env=stack["env"]).env


def _http(method: str, url: str, body=None, basic: tuple[str, str] | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if basic:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(basic).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
