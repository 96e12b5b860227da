"""Airflow's real services on one machine, sized to it, started and stopped as one (`cd4ml up`).

Two modes, chosen by ``CD4ML_STACK`` (or ``--mode``), each an env file in ``conf/stack/``:

* ``embedded`` (default): SQLite metadata DB, LocalExecutor, SimpleAuthManager; MLflow stays on
  its local SQLite store (its UI on :5000 reads the same store). Nothing else to run.
* ``scaleout``: the production shape on this machine's services: Airflow's metadata DB on
  PostgreSQL, CeleryExecutor with Redis as broker and ``--workers`` Celery workers, the FAB auth
  manager with roles (``cd4ml_airflow.auth``), an MLflow tracking server with its basic-auth
  app whose tracking, registry and user stores are on PostgreSQL, and the Optuna study on
  PostgreSQL. Databases are created when missing.

Secrets are never in the repository: the env file names no password; passwords, the JWT secret,
the API secret key and the Fernet key come from the environment or, when absent, are generated
once into ``$CD4ML_HOME/stack/secrets.env`` (mode 0600) and reused.

Sizing: task slots = min(cores, memory GiB / 3) and at least 2 (a training task holds about
1-2 GB). Embedded: LocalExecutor parallelism = slots (stock Airflow starts 32 worker
processes, 4.2 GiB on this 2-core machine). Scale-out: one Celery worker process per slot
(``--workers`` overrides), each with the ``solo`` pool, i.e. one task at a time from its main
thread (conf/stack/scaleout.env says why not prefork or threads); parallelism = workers.

Every component runs in its own process group. The supervisor restarts a component that dies
(a killed Celery worker comes back, as its pod would) at most ``MAX_RESTARTS`` times in ten
minutes, and on SIGINT/SIGTERM stops every group, waits, then SIGKILLs what is left: nothing
outlives ``cd4ml up``. ``$CD4ML_HOME/stack/stack.json`` lists the live process groups
(``cd4ml down`` stops a stack started elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tasks.errors import DataError

REPO_ROOT = Path(__file__).resolve().parents[2]
STACK_DIR = REPO_ROOT / "conf" / "stack"
MODES = ("embedded", "scaleout")
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
SECRET_NAMES = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY",
                "CD4ML_ADMIN_PASSWORD", "CD4ML_APPROVER_PASSWORD", "MLFLOW_TRACKING_PASSWORD",
                "MLFLOW_FLASK_SERVER_SECRET_KEY", "CD4ML_MLFLOW_READER_PASSWORD")


class StackError(DataError, RuntimeError):
    """The stack cannot start (a service is unreachable, a port is taken); the message says which."""


@dataclass(frozen=True)
class Sizing:
    slots: int
    parallelism: int
    worker_concurrency: int
    workers: int


def size_for(cpus: int, mem_bytes: int, mode: str, workers: int | None = None) -> Sizing:
    """Task slots for this machine (module doc): never the stock 32 worker processes."""
    slots = max(2, min(cpus, int(mem_bytes / 2**30 // 3)))
    if mode == "embedded":
        return Sizing(slots, slots, 0, 0)
    workers = workers or slots
    return Sizing(slots, workers, 1, workers)  # the solo pool: one task per worker process


def machine() -> tuple[int, int]:
    return os.cpu_count() or 1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ------------------------------------------------------------------------------------- settings
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}$]*))?\}")  # innermost first: defaults may nest


def read_env_file(path: Path, env: Mapping[str, str]) -> dict[str, str]:
    """KEY=value lines; ``${VAR}`` / ``${VAR:-default}`` expand from ``env`` and earlier lines."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise StackError(f"{path}:{number}: not KEY=value: {line!r}")
        scope = {**env, **values}

        def expand(match: re.Match[str], scope: Mapping[str, str] = scope, number: int = number) -> str:
            name, default = match.group(1), match.group(2)
            if name in scope and scope[name] != "":
                return scope[name]
            if default is None:
                raise StackError(f"{path}:{number}: ${{{name}}} is not set")
            return default

        value = value.strip()
        while (expanded := _VAR.sub(expand, value)) != value:
            value = expanded
        values[key.strip()] = value
    return values


def stack_secrets(state_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Each secret from the environment, else from (or generated into) ``secrets.env`` (0600)."""
    path = state_dir / "secrets.env"
    stored = read_env_file(path, {}) if path.exists() else {}
    missing = [name for name in SECRET_NAMES if not env.get(name) and not stored.get(name)]
    if missing:
        for name in missing:
            stored[name] = _fernet_key() if name == "AIRFLOW__CORE__FERNET_KEY" else secrets.token_urlsafe(24)
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("# generated by `cd4ml up`; environment variables of the same name win\n")
            out.writelines(f"{k}={v}\n" for k, v in sorted(stored.items()))
    return {name: env.get(name) or stored[name] for name in SECRET_NAMES}


def _fernet_key() -> str:
    import base64

    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


@dataclass
class Stack:
    mode: str
    home: Path
    port: int
    mlflow_port: int
    sizing: Sizing
    env: dict[str, str]
    commands: dict[str, list[str]]
    state_dir: Path
    log_dir: Path
    databases: tuple[str, ...] = ()
    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (role, password)


def plan(mode: str | None = None, *, home: str | None = None, port: int = 8080, mlflow_port: int = 5000,
         workers: int | None = None, base_env: Mapping[str, str] | None = None) -> Stack:
    """Everything ``up`` will run, without running it: env, commands, databases, users."""
    base = dict(os.environ if base_env is None else base_env)
    mode = mode or base.get("CD4ML_STACK") or "embedded"
    if mode not in MODES:
        raise StackError(f"CD4ML_STACK={mode!r}: one of {', '.join(MODES)}")
    home_dir = Path(home or base.get("CD4ML_HOME") or REPO_ROOT / ".cd4ml").resolve()
    state_dir = home_dir / "stack" / mode
    cpus, mem = machine()
    sizing = size_for(cpus, mem, mode, workers)
    scope = {**base, "CD4ML_HOME": str(home_dir), "CD4ML_REPO": str(REPO_ROOT), "CD4ML_API_PORT": str(port),
             "CD4ML_MLFLOW_PORT": str(mlflow_port), "CD4ML_PARALLELISM": str(sizing.parallelism)}
    file_env = read_env_file(STACK_DIR / f"{mode}.env", scope)
    env = {k: v for k, v in base.items() if not k.startswith("AIRFLOW__")}
    env.update(file_env)
    env.update({k: v for k, v in base.items() if k.startswith("AIRFLOW__")})  # an operator's override wins
    env.update({"CD4ML_HOME": str(home_dir), "CD4ML_STACK": mode})
    secret_values = stack_secrets(home_dir / "stack", base)
    env.update({k: v for k, v in secret_values.items() if k.startswith("AIRFLOW__")})
    users = {"admin": ("Admin", secret_values["CD4ML_ADMIN_PASSWORD"]),
             "approver": ("User", secret_values["CD4ML_APPROVER_PASSWORD"])}
    airflow = str(Path(sys.executable).parent / "airflow")
    commands = {
        "api-server": [airflow, "api-server", "--host", env.get("CD4ML_API_HOST", "127.0.0.1"), "--port", str(port),
                       "--workers", "1"],
        "scheduler": [airflow, "scheduler"],
        "dag-processor": [airflow, "dag-processor"],
        "triggerer": [airflow, "triggerer"],
    }
    databases: tuple[str, ...] = ()
    mlflow = str(Path(sys.executable).parent / "mlflow")
    if mode == "embedded":  # the MLflow UI on the local store the tasks write to
        commands["mlflow-ui"] = [mlflow, "server", "--backend-store-uri", env["CD4ML_MLFLOW_UI_STORE"],
                                 "--default-artifact-root", env["CD4ML_MLFLOW_UI_ARTIFACTS"],
                                 "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"]
    if mode == "scaleout":
        env["MLFLOW_TRACKING_PASSWORD"] = secret_values["MLFLOW_TRACKING_PASSWORD"]
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = secret_values["MLFLOW_TRACKING_PASSWORD"]
        env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = secret_values["MLFLOW_FLASK_SERVER_SECRET_KEY"]  # CSRF
        env["CD4ML_MLFLOW_READER_PASSWORD"] = secret_values["CD4ML_MLFLOW_READER_PASSWORD"]  # scoring, serving
        for n in range(1, sizing.workers + 1):
            commands[f"worker-{n}"] = [airflow, "celery", "worker", "--concurrency", "1",
                                       "--celery-hostname", f"worker-{n}@%h", "--skip-serve-logs"]
        commands["mlflow"] = [mlflow, "server", "--app-name", "basic-auth",
                              "--backend-store-uri", env["CD4ML_MLFLOW_BACKEND_URI"],
                              "--artifacts-destination", env["CD4ML_MLFLOW_ARTIFACTS"],
                              "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"]
        databases = tuple(env[k] for k in ("CD4ML_PG_AIRFLOW_DB", "CD4ML_PG_MLFLOW_DB", "CD4ML_PG_MLFLOW_AUTH_DB",
                                           "CD4ML_PG_OPTUNA_DB"))
    return Stack(mode, home_dir, port, mlflow_port, sizing, env, commands, state_dir, state_dir / "logs",
                 databases, users)


# ------------------------------------------------------------------------------------ bootstrap
def _pg_params(stack: Stack, dbname: str) -> dict[str, object]:
    """Connection parameters for one database of the stack's PostgreSQL server (PGPASSWORD: libpq reads it)."""
    return dict(host=stack.env["CD4ML_PG_HOST"], port=int(stack.env["CD4ML_PG_PORT"]),
                user=stack.env["CD4ML_PG_USER"], dbname=dbname, connect_timeout=5)


def create_databases(stack: Stack) -> list[str]:
    """CREATE DATABASE for each missing one on the stack's PostgreSQL server; returns those created."""
    import psycopg2

    params = _pg_params(stack, "postgres")
    try:
        conn = psycopg2.connect(**params)
    except psycopg2.OperationalError as exc:
        raise StackError(f"PostgreSQL at {params['host']}:{params['port']} is unreachable: {str(exc).strip()}") from exc
    conn.autocommit = True
    created = []
    with conn.cursor() as cur:  # not `with conn`: that opens a transaction, and CREATE DATABASE refuses one
        for name in stack.databases:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}"')
                created.append(name)
    conn.close()
    return created


def check_broker(stack: Stack) -> None:
    import redis

    try:
        redis.Redis.from_url(stack.env["AIRFLOW__CELERY__BROKER_URL"], socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise StackError(f"the Celery broker {stack.env['CD4ML_REDIS_HOST']} is unreachable: {exc}") from exc


def _run(stack: Stack, args: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    airflow = str(Path(sys.executable).parent / "airflow")
    proc = subprocess.run([airflow, *args], env=stack.env, capture_output=True, text=True, timeout=900)
    stack.log_dir.mkdir(parents=True, exist_ok=True)
    with open(stack.log_dir / "bootstrap.log", "a") as log:
        log.write(f"$ airflow {' '.join(a if 'password' not in p else '***' for p, a in zip([''] + args, args))}\n"
                  f"{proc.stdout}{proc.stderr}\n")
    if check and proc.returncode != 0:
        raise StackError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}; "
                         f"see {stack.log_dir / 'bootstrap.log'}")
    return proc


# A verified (user, password) is remembered this long by the server process (MLflow's own cache, keyed by an HMAC of
# the password): without it every request spends a scrypt check (about 120 ms of CPU here). A password set or a user
# deleted through the API is forgotten at once by the worker that handled it (`cd4ml up` runs one worker); a change
# made beside the API (SQL) is honoured after at most this long.
AUTH_CACHE_TTL_S = 30


def mlflow_auth_ini(database_uri: str) -> str:
    """The basic-auth app's ini for a user store; no password in it."""
    return ("[mlflow]\n"
            "default_permission = READ\n"  # signed-in users read (the reader account no more); owners and admins edit
            f"database_uri = {database_uri}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n")


def write_mlflow_auth_config(stack: Stack) -> Path:
    """The basic-auth app's ini: user store on PostgreSQL; the admin's name and password come from the environment."""
    path = Path(stack.env["MLFLOW_AUTH_CONFIG_PATH"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mlflow_auth_ini(stack.env["CD4ML_MLFLOW_AUTH_DB_URI"]))
    return path


def bootstrap(stack: Stack) -> None:
    """Databases, broker check, ``airflow db migrate``, users and roles (FAB), or the passwords file (simple)."""
    if stack.mode == "scaleout":
        created = create_databases(stack)
        if created:
            print(f"created databases: {', '.join(created)}")
        check_broker(stack)
        write_mlflow_auth_config(stack)
    Path(stack.env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    _run(stack, ["db", "migrate"], "airflow db migrate")
    if stack.mode == "embedded":
        path = Path(stack.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
        path.write_text(json.dumps({u: pw for u, (_, pw) in stack.users.items()}) + "\n")
        path.chmod(0o600)
        return
    _ensure(stack, ["roles", "create", "Approver"], "airflow roles create Approver",
            "SELECT 1 FROM ab_role WHERE name = %s", ("Approver",))
    for name, (role, password) in stack.users.items():
        _ensure(stack, user_create_args(name, role, password), f"airflow users create {name}",
                "SELECT 1 FROM ab_user WHERE username = %s", (name,))
    _ensure(stack, ["users", "add-role", "--username", "approver", "--role", "Approver"],
            "airflow users add-role approver Approver",
            "SELECT 1 FROM ab_user_role ur JOIN ab_user u ON u.id = ur.user_id JOIN ab_role r ON r.id = ur.role_id "
            "WHERE u.username = %s AND r.name = %s", ("approver", "Approver"))


def user_create_args(name: str, role: str, password: str) -> list[str]:
    """``airflow users create`` arguments. Each value is attached to its option (``--password=...``): a generated
    password may start with "-" (``secrets.token_urlsafe``), which argparse reads as an option when it stands alone."""
    return ["users", "create", f"--username={name}", f"--password={password}", f"--role={role}",
            f"--firstname={name}", "--lastname=cd4ml", f"--email={name}@cd4ml.local"]


def _ensure(stack: Stack, args: list[str], what: str, present_sql: str, present_args: tuple[str, ...],
            attempts: int = 3) -> None:
    """Run an FAB command until the metadata DB holds what it makes (a rerun finds it there and skips it).

    Whether it is there is read from the FAB tables, never from the command's message; a failed try is
    retried (three stacks bootstrapping at once on two cores have seen one fail), then reported.
    """
    if _fab_has(stack, present_sql, present_args):
        return
    for attempt in range(1, attempts + 1):
        proc = _run(stack, args, what, check=False)
        if _fab_has(stack, present_sql, present_args):
            return
        if attempt < attempts:
            time.sleep(2.0 * attempt)
    raise StackError(f"{what} failed ({attempts} tries, last exit {proc.returncode}): "
                     f"{proc.stderr.strip().splitlines()[-1:]}; see {stack.log_dir / 'bootstrap.log'}")


def _fab_has(stack: Stack, sql: str, args: tuple[str, ...]) -> bool:
    """Whether the FAB tables of the stack's Airflow database hold a row for ``sql`` (no table yet: no row)."""
    import psycopg2
    import psycopg2.errors

    conn = psycopg2.connect(**_pg_params(stack, stack.env["CD4ML_PG_AIRFLOW_DB"]))
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchone() is not None
    except psycopg2.errors.UndefinedTable:
        return False
    finally:
        conn.close()


# ----------------------------------------------------------------------------------- processes
def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, _ppid, group = stat[stat.rfind(")") + 2:].split()[:3]
            if int(group) == pgid and state != "Z":  # a zombie is gone, only not yet reaped
                pids.append(int(entry))
    return pids


def stop_groups(pgids: list[int], timeout: float = 30.0) -> None:
    """SIGTERM every process group, wait for them to drain, SIGKILL whatever is left."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(group_pids(g) for g in pgids):
        time.sleep(0.5)
    for pgid in pgids:
        if group_pids(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Supervisor:
    stack: Stack
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    restarts: dict[str, list[float]] = field(default_factory=dict)
    stopping: bool = False

    def start(self, name: str) -> None:
        self.stack.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.stack.log_dir / f"{name}.log", "ab") as log:
            env = {**self.stack.env, "CD4ML_WORKER_NAME": name} if name.startswith("worker-") else self.stack.env
            self.procs[name] = subprocess.Popen(self.stack.commands[name], env=env, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
        self.write_state()

    def write_state(self) -> None:
        state = {"mode": self.stack.mode, "supervisor": os.getpid(), "api": f"http://127.0.0.1:{self.stack.port}",
                 "groups": {name: p.pid for name, p in self.procs.items()}}
        (self.stack.state_dir / "stack.json").write_text(json.dumps(state, indent=1) + "\n")

    def check(self, say: Callable[[str], None] = print) -> None:
        """Restart what died; give up (StackError) after MAX_RESTARTS in RESTART_WINDOW_S."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            stop_groups([proc.pid], timeout=5)  # its children go with it
            recent = [t for t in self.restarts.get(name, []) if time.monotonic() - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                raise StackError(f"{name} exited {proc.returncode} {len(recent) + 1} times in "
                                 f"{RESTART_WINDOW_S / 60:.0f} min; see {self.stack.log_dir / (name + '.log')}")
            self.restarts[name] = [*recent, time.monotonic()]
            say(f"{name} exited with {proc.returncode}; restarting it ({len(recent) + 1}/{MAX_RESTARTS})")
            time.sleep(min(2 ** len(recent), 30))  # back off: a broken setting must not spin
            self.start(name)

    def stop(self) -> None:
        self.stopping = True
        stop_groups([p.pid for p in self.procs.values()])
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        (self.stack.state_dir / "stack.json").unlink(missing_ok=True)


def wait_healthy(stack: Stack, sup: Supervisor, timeout: float = 300.0) -> None:
    """Until the API server says the scheduler (and triggerer, dag processor) are healthy, and MLflow answers."""
    deadline = time.monotonic() + timeout
    urls = [f"http://127.0.0.1:{stack.port}/api/v2/monitor/health", f"http://127.0.0.1:{stack.mlflow_port}/health"]
    pending = list(urls)
    while pending:
        sup.check()
        url = pending[0]
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                body = resp.read().decode()
            if "monitor/health" not in url or json.loads(body).get("scheduler", {}).get("status") == "healthy":
                pending.pop(0)
                continue
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise StackError(f"{url} not healthy after {timeout:.0f} s; logs in {stack.log_dir}")
        time.sleep(1)


def ensure_registry_reader(stack: Stack, say: Callable[[str], None] = print) -> None:
    """The MLflow account scoring and serving sign in as: read-only (tasks/ops/registry_accounts.py)."""
    from tasks.models.identity import reader_credentials
    from tasks.ops.registry_accounts import RegistryAccountError, ensure_reader

    reader = reader_credentials(dict(stack.env))
    if reader is None:
        raise StackError("scale-out needs the registry's read-only account: CD4ML_MLFLOW_READER_USERNAME/PASSWORD")
    try:
        outcome = ensure_reader(stack.env["MLFLOW_TRACKING_URI"],
                                (stack.env["MLFLOW_TRACKING_USERNAME"], stack.env["MLFLOW_TRACKING_PASSWORD"]), reader)
    except RegistryAccountError as exc:
        raise StackError(f"MLflow read-only account: {exc}") from None
    say(f"MLflow read-only account {reader[0]} (scoring, serving): {outcome}")


def up(stack: Stack, *, until: Callable[[], bool] | None = None, say: Callable[[str], None] = print) -> int:
    """Bootstrap, start every component, report where to go, supervise until a signal (or ``until()``)."""
    stack.state_dir.mkdir(parents=True, exist_ok=True)
    bootstrap(stack)
    sup = Supervisor(stack)
    stop = {"signal": None}

    def on_signal(signum, _frame) -> None:
        stop["signal"] = signum

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for name in stack.commands:
            sup.start(name)
        wait_healthy(stack, sup)
        if stack.mode == "scaleout":
            ensure_registry_reader(stack, say)
        say(banner(stack))
        while stop["signal"] is None and not (until and until()):
            sup.check(say)
            time.sleep(1)
        return 0
    finally:
        say(f"stopping {len(sup.procs)} components ...")
        sup.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def down(home: str | None = None, mode: str | None = None) -> list[str]:
    """Stop a stack started by ``cd4ml up`` in another shell (its ``stack.json``)."""
    stack = plan(mode, home=home)
    path = stack.state_dir / "stack.json"
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    try:
        os.kill(int(state["supervisor"]), signal.SIGTERM)
    except ProcessLookupError:
        stop_groups(list(state["groups"].values()))
        path.unlink(missing_ok=True)
    return list(state["groups"])


def banner(stack: Stack) -> str:
    s = stack.sizing
    where = ("LocalExecutor, parallelism " + str(s.parallelism) if stack.mode == "embedded" else
             f"CeleryExecutor, {s.workers} workers, one task each")
    lines = [
        f"cd4ml {stack.mode} stack up ({where}; {s.slots} task slots for this machine)",
        f"  Airflow UI and REST API: http://127.0.0.1:{stack.port}   users: "
        + ", ".join(f"{u} ({r})" for u, (r, _) in stack.users.items())
        + f"; passwords in {stack.home / 'stack' / 'secrets.env'} (CD4ML_ADMIN_PASSWORD / CD4ML_APPROVER_PASSWORD)",
        f"  logs: {stack.log_dir}    stop: Ctrl-C here, or `cd4ml down`",
    ]
    if stack.mode == "scaleout":
        lines.insert(2, f"  MLflow (basic-auth): http://127.0.0.1:{stack.mlflow_port}   user "
                        f"{stack.env['MLFLOW_TRACKING_USERNAME']}, password MLFLOW_TRACKING_PASSWORD")
    else:
        lines.insert(2, f"  MLflow UI: http://127.0.0.1:{stack.mlflow_port} (the local store under {stack.home})")
    return "\n".join(lines)
