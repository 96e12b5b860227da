"""Real Airflow services for tests: scheduler, DAG processor and API server, driven over the REST API.

Used where ``airflow dags test`` cannot go: Human-in-the-loop tasks (``dags test`` never applies
a response timeout and cannot be answered without an API server).

Real processes, no mocks: `airflow db migrate`, then scheduler, dag-processor and api-server
(the triggerer only where asked: it runs deadline callbacks; in 3.3 HITL tasks park in
AWAITING_INPUT and the scheduler resolves their timeouts).

Dependency-free beyond the Airflow venv (stdlib urllib only).

    from harness import start_airflow, trigger, wait_for_task_state, answer_hitl, wait_for_run
    h = start_airflow("/tmp/hitl_proto/home", "/tmp/hitl_proto/dags")
    try:
        h.wait_for_dag("hitl_demo"); h.unpause("hitl_demo")
        run_id = trigger(h, "hitl_demo", {"timeout_s": 60})
        wait_for_task_state(h, "hitl_demo", run_id, "approve", {"awaiting_input"}, 120)
        answer_hitl(h, "hitl_demo", run_id, "approve", "Approve", user="approver")
        print(wait_for_run(h, "hitl_demo", run_id, 120))
    finally:
        h.stop()
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tasks.ops.stack import group_pids

VENV_BIN = Path(sys.executable).parent
AIRFLOW = str(VENV_BIN / "airflow")

# user -> (role, password). Passwords are pre-seeded into the SimpleAuthManager passwords file,
# so nothing random has to be scraped from logs.
DEFAULT_USERS = {
    "approver": ("admin", "approver-pw"),
    "other": ("admin", "other-pw"),
    "viewer": ("viewer", "viewer-pw"),
}

FINISHED_RUN_STATES = {"success", "failed"}
FINISHED_TI_STATES = {"success", "failed", "skipped", "upstream_failed", "removed"}


class HTTPError(RuntimeError):
    def __init__(self, status: int, body: str, method: str, url: str):
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_env(home: str, dags_folder: str, port: int, users=DEFAULT_USERS, env_extra=None) -> dict:
    home = str(Path(home).resolve())
    base_url = f"http://localhost:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(
        {
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags_folder).resolve()),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            # auth: named SimpleAuthManager users with a pre-seeded passwords file
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, (r, _) in users.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": f"{home}/passwords.json",
            # every component must share these so scheduler-minted task JWTs validate in the api-server
            "AIRFLOW__API_AUTH__JWT_SECRET": "hitl-proto-jwt-secret-0123456789abcdef",
            "AIRFLOW__API__SECRET_KEY": "hitl-proto-secret-key",
            "AIRFLOW__API__BASE_URL": base_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            # workers (task supervisors) talk to this
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
            # speed knobs
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # New and changed files are parsed at the next refresh; an unchanged file again after 60 s, so a first
            # parse that failed heals within wait_for_dag's 120 s. Every 5 s cost 15 CPU-s per 90 s per deployment.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
            # the HITL timeout sweep runs every trigger_timeout_check_interval (default 15 s)
            "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "2",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        }
    )
    env.update(env_extra or {})
    return env


@dataclass
class AirflowHandle:
    home: str
    base_url: str
    env: dict
    users: dict
    procs: dict = field(default_factory=dict)  # name -> Popen
    _tokens: dict = field(default_factory=dict)

    # ---------------------------------------------------------------- HTTP
    def token(self, user: str = "approver") -> str:
        tok = self._tokens.get(user)
        if tok:
            return tok
        _, password = self.users[user]
        status, body = _http(
            "POST", f"{self.base_url}/auth/token", {"username": user, "password": password}
        )
        if status != 201:
            raise HTTPError(status, body, "POST", "/auth/token")
        tok = json.loads(body)["access_token"]
        self._tokens[user] = tok
        return tok

    def request(self, method: str, path: str, body=None, user: str = "approver", expect=(200,)):
        """Call the REST API as `user`. Returns parsed JSON (or None). Raises HTTPError if status not in expect."""
        url = f"{self.base_url}{path}"
        status, text = _http(method, url, body, token=self.token(user) if user else None)
        if expect and status not in expect:
            raise HTTPError(status, text, method, path)
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return text

    def raw(self, method: str, path: str, body=None, user: str | None = "approver"):
        """Like request() but never raises: returns (status, parsed_or_text)."""
        status, text = _http(method, f"{self.base_url}{path}", body, token=self.token(user) if user else None)
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    # ------------------------------------------------------------ helpers
    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.raw("GET", f"/api/v2/dags/{q(dag_id)}")
            if status == 200:
                return body
            if time.monotonic() > deadline:
                raise TimeoutError(f"dag {dag_id} not parsed after {timeout}s (last {status} {body})")
            time.sleep(1)

    def unpause(self, dag_id: str) -> dict:
        return self.request("PATCH", f"/api/v2/dags/{q(dag_id)}", {"is_paused": False})

    def task_states(self, dag_id: str, run_id: str) -> dict:
        body = self.request("GET", f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in body["task_instances"]}

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict:
        return self.request(
            "GET",
            f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}/{map_index}/hitlDetails",
        )

    # ---------------------------------------------------------- shutdown
    def stop(self, timeout: float = 30) -> None:
        """SIGTERM every process group, wait, then SIGKILL leftovers."""
        for _name, p in self.procs.items():
            if p.poll() is None:
                _killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _name, p in self.procs.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # children may outlive the leader: always sweep each group
        time.sleep(0.5)
        for _name, p in self.procs.items():
            if group_pids(p.pid):
                _killpg(p.pid, signal.SIGKILL)
            if p.poll() is None:
                p.wait(timeout=5)
        for f in getattr(self, "_logfiles", []):
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def q(s: str) -> str:
    return urllib.parse.quote(str(s), safe="")


def _http(method: str, url: str, body=None, token: str | None = None, timeout: float = 30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _killpg(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _seed_passwords(path: str, users: dict) -> None:
    existing = {}
    if os.path.exists(path):
        try:
            existing = json.loads(Path(path).read_text() or "{}")
        except json.JSONDecodeError:
            existing = {}
    existing.update({u: pw for u, (_, pw) in users.items()})
    Path(path).write_text(json.dumps(existing) + "\n")


def start_airflow(
    home: str,
    dags_folder: str,
    env_extra: dict | None = None,
    port: int | None = None,
    users: dict = DEFAULT_USERS,
    ready_timeout: float = 180,
    components: tuple = ("api-server", "scheduler", "dag-processor"),
) -> AirflowHandle:
    """db migrate, then start scheduler, dag-processor, api-server (each in its own process group).

    `components` lets you start a subset (e.g. only ("api-server",) next to `airflow dags test`).
    """
    Path(home).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = build_env(home, dags_folder, port, users, env_extra)
    _seed_passwords(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"], users)
    logdir = Path(home) / "proc_logs"
    logdir.mkdir(exist_ok=True)

    mig = subprocess.run(
        [AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600
    )
    (logdir / "db_migrate.log").write_text(mig.stdout + mig.stderr)
    if mig.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{mig.stderr[-3000:]}")

    handle = AirflowHandle(home=str(home), base_url=f"http://localhost:{port}", env=env, users=users)
    handle._logfiles = []
    cmds = {
        "api-server": [AIRFLOW, "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1"],
        "scheduler": [AIRFLOW, "scheduler"],
        "dag-processor": [AIRFLOW, "dag-processor"],
        "triggerer": [AIRFLOW, "triggerer"],  # deadline callbacks (AsyncCallback) run here
    }
    cmds = {k: v for k, v in cmds.items() if k in components}
    try:
        for name, cmd in cmds.items():
            lf = open(logdir / f"{name}.log", "ab")
            handle._logfiles.append(lf)
            handle.procs[name] = subprocess.Popen(
                cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group -> killpg() reaches all children
            )
        deadline = time.monotonic() + ready_timeout
        while True:
            for name, p in handle.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited early rc={p.returncode}; see {logdir}/{name}.log")
            try:
                status, body = _http("GET", f"{handle.base_url}/api/v2/monitor/health", timeout=3)
                if status == 200:
                    health = json.loads(body)
                    if "scheduler" not in cmds or health.get("scheduler", {}).get("status") == "healthy":
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("api-server/scheduler not healthy in time")
            time.sleep(1)
    except BaseException:
        handle.stop()
        raise
    return handle


def trigger(handle: AirflowHandle, dag_id: str, conf: dict | None = None, run_id: str | None = None,
            user: str = "approver") -> str:
    body = {"logical_date": None, "conf": conf or {}}
    if run_id:
        body["dag_run_id"] = run_id
    resp = handle.request("POST", f"/api/v2/dags/{q(dag_id)}/dagRuns", body, user=user)
    return resp["dag_run_id"]


def wait_for_task_state(handle, dag_id, run_id, task_id, states, timeout=120, poll=0.5) -> str:
    states = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + timeout
    last = None
    while True:
        status, body = handle.raw(
            "GET", f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}"
        )
        if status == 200:
            last = body["state"]
            if last in states:
                return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{task_id} not in {states} after {timeout}s (last={last})")
        time.sleep(poll)


def wait_for_awaiting_input(handle, dag_id, run_id, task_id="approve", timeout=120, settle_s=3.0) -> None:
    """Wait until the HITL task is parked in awaiting_input, then sleep `settle_s`.

    The settle delay matters in 3.3.2: if the answer lands before the scheduler has processed the
    executor's "success" event of the worker that parked the task (up to ~1 scheduler loop, ~1 s),
    the scheduler re-queues the task and then applies that stale event -> "task instance's state
    attribute is queued" -> task marked FAILED. Waiting > 1 scheduler loop avoids it.
    """
    wait_for_task_state(handle, dag_id, run_id, task_id, {"awaiting_input"}, timeout, poll=0.25)
    if settle_s:
        time.sleep(settle_s)


def answer_hitl(handle, dag_id, run_id, task_id, option, user="approver", params_input=None,
                map_index: int = -1, expect=(200,)):
    """PATCH the HITL detail. Returns (status, body); raises HTTPError if status not in expect."""
    options = [option] if isinstance(option, str) else list(option)
    path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}/{map_index}/hitlDetails"
    status, body = handle.raw("PATCH", path, {"chosen_options": options, "params_input": params_input or {}},
                              user=user)
    if expect and status not in expect:
        raise HTTPError(status, json.dumps(body), "PATCH", path)
    return status, body


def wait_for_run(handle, dag_id, run_id, timeout=180, poll=1.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        body = handle.request("GET", f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}")
        if body["state"] in FINISHED_RUN_STATES:
            return body["state"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {body['state']} after {timeout}s")
        time.sleep(poll)
