"""sit, uat and prod as three separate deployments on this machine (`cd4ml topology up|down|status`).

Each environment is its own scale-out stack (`cd4ml up`, tasks/ops/stack.py) with its own
``CD4ML_HOME`` (``<root>/<env>``), ``CD4ML_ENV``, Airflow API and MLflow ports, PostgreSQL databases
(``CD4ML_PG_PREFIX`` per environment), Redis database for Celery and generated secrets. They share
nothing but two things, as the Terraform's deployments do:

* the queue: one Redis pub/sub channel per hop (``<channel_prefix>-sit-to-uat``,
  ``<channel_prefix>-uat-to-prod``), reached through the Connection ``cd4ml_queue``; sit and uat
  announce their champion on it (``release.publish``), uat and prod listen (``release.upstream_event``);
* the read-only accounts: uat reads sit's MLflow as sit's ``cd4ml-reader``, prod reads uat's as uat's
  (the Connection ``cd4ml_upstream_registry``, an ``AIRFLOW_CONN_*`` variable of that stack only).
  The password comes from the upstream stack's ``secrets.env`` (0600) and is never printed.

Each stack's settings folder (``<root>/<env>/conf``) is generated from the settings folder in use
(``CD4ML_CONF_DIR`` or conf/) plus the hop's ``release`` section merged into ``<env>.yaml``: uat and
prod run ``deploy_model`` with the upstream's MLflow URL. Each stack's secrets are generated first
(a downstream's Connection needs its upstream's reader password), then the three start together (the
reader account itself is created when its stack is up; the downstream uses it only to import) and
stop in the reverse order, downstream first. The description
(ports, prefixes, Redis databases, workers) has code defaults below; a YAML file
(``--file`` or ``CD4ML_TOPOLOGY``) overrides any of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.ops.stack import SECRET_NAMES, StackError, group_pids, stack_secrets, stop_groups
from tasks.settings import deep_merge, load_settings, resolve_conf_dir

ENVIRONMENTS = ("sit", "uat", "prod")
UPSTREAM = {"uat": "sit", "prod": "uat"}
DOWNSTREAM = {up: down for down, up in UPSTREAM.items()}
QUEUE_CONN = "cd4ml_queue"
REGISTRY_CONN = "cd4ml_upstream_registry"
STATE_FILE = "topology.json"
UP_TIMEOUT_S = 900.0
# What a stack inherits from the shell that starts the topology: never another stack's names or secrets.
INHERITED = ("CD4ML_PG_HOST", "CD4ML_PG_PORT", "CD4ML_PG_USER", "CD4ML_HEARTBEAT_TIMEOUT", "CD4ML_DATASET")
_BIN = Path(sys.executable).parent


class TopologyError(StackError):
    """The topology cannot be planned or started; the message says which environment and why."""


class EnvironmentSpec(BaseModel):
    """One environment's stack: where it answers and which databases it owns."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    port: int = Field(ge=1024, le=65535, description="Airflow API server and UI.")
    mlflow_port: int = Field(ge=1024, le=65535, description="MLflow tracking server (basic-auth).")
    pg_prefix: str = Field(pattern=r"^[a-z][a-z0-9_]{0,40}$", description="CD4ML_PG_PREFIX: its PostgreSQL databases.")
    redis_db: int = Field(ge=0, le=15, description="CD4ML_REDIS_DB: the Redis database of its Celery broker.")


class TopologySpec(BaseModel):
    """The three stacks; every default here, a file overrides what it names."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    root: str = Field("{home}/topology", description="Folder of the environments' homes (<root>/<env>); "
                      "{home} = CD4ML_HOME (default ./.cd4ml).")
    channel_prefix: str = Field("cd4ml", pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
                                description="Channels <prefix>-sit-to-uat and <prefix>-uat-to-prod.")
    redis: str = Field("127.0.0.1:6379", pattern=r"^[A-Za-z0-9_.-]+:[0-9]{1,5}$",
                       description="host:port of the Redis server: the queue and each stack's Celery broker.")
    workers: int = Field(1, ge=1, le=8, description="Celery workers per stack (one task each).")
    sit: EnvironmentSpec = Field(EnvironmentSpec(port=8080, mlflow_port=5000, pg_prefix="cd4ml_sit", redis_db=1),
                                 description="sit's stack.")
    uat: EnvironmentSpec = Field(EnvironmentSpec(port=8081, mlflow_port=5001, pg_prefix="cd4ml_uat", redis_db=2),
                                 description="uat's stack.")
    prod: EnvironmentSpec = Field(EnvironmentSpec(port=8082, mlflow_port=5002, pg_prefix="cd4ml_prod", redis_db=3),
                                  description="prod's stack.")


def read_spec(path: str | os.PathLike[str] | None = None) -> TopologySpec:
    """The code defaults, overridden by the YAML file ``path`` (or ``CD4ML_TOPOLOGY``) when given."""
    path = path or os.environ.get("CD4ML_TOPOLOGY")
    data: Any = {}
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise TopologyError(f"topology file {path}: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise TopologyError(f"topology file {path} must hold a mapping")
    defaults = TopologySpec().model_dump()
    for env in ENVIRONMENTS:  # an environment named in the file keeps the defaults it does not name
        if isinstance(data.get(env), dict):
            data[env] = {**defaults[env], **data[env]}
    try:
        spec = TopologySpec(**data)
    except ValidationError as exc:
        raise TopologyError(f"topology file {path}: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())) from None
    _check_distinct(spec)
    return spec


def _check_distinct(spec: TopologySpec) -> None:
    """Nothing shared: every port, prefix and Redis database belongs to one environment."""
    envs = [getattr(spec, env) for env in ENVIRONMENTS]
    ports = [e.port for e in envs] + [e.mlflow_port for e in envs]
    for what, values in (("port", ports), ("pg_prefix", [e.pg_prefix for e in envs]),
                         ("redis_db", [e.redis_db for e in envs])):
        if len(set(values)) != len(values):
            raise TopologyError(f"the topology's environments share a {what}: {values}")


def hop_channel(spec: TopologySpec, upstream: str) -> str:
    return f"{spec.channel_prefix}-{upstream}-to-{DOWNSTREAM[upstream]}"


@dataclass(frozen=True)
class Member:
    """One environment of the topology, planned."""

    env: str
    home: Path
    conf_dir: Path
    spec: EnvironmentSpec

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.mlflow_port}"

    @property
    def secrets_file(self) -> Path:
        return self.home / "stack" / "secrets.env"


def root_dir(spec: TopologySpec, environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    home = Path(environ.get("CD4ML_HOME") or Path.cwd() / ".cd4ml").resolve()
    return Path(spec.root.format(home=home)).resolve()


def members(spec: TopologySpec, environ: Mapping[str, str] | None = None) -> list[Member]:
    root = root_dir(spec, environ)
    return [Member(env, root / env, root / env / "conf", getattr(spec, env)) for env in ENVIRONMENTS]


# ------------------------------------------------------------------------------------- settings
def release_section(spec: TopologySpec, env: str) -> dict[str, Any]:
    """The hop's ``release`` keys of ``env``: announce downstream, import from upstream."""
    own = getattr(spec, env)
    section: dict[str, Any] = {"airflow_api_url": f"http://localhost:{own.port}"}
    if env in DOWNSTREAM:
        section["publish"] = {"channel": hop_channel(spec, env), "conn_id": QUEUE_CONN}
    if env in UPSTREAM:
        upstream = UPSTREAM[env]
        section.update({
            "pattern": "deploy_model",
            "upstream": upstream,
            "upstream_registry": {"tracking_uri": f"http://127.0.0.1:{getattr(spec, upstream).mlflow_port}",
                                  "conn_id": REGISTRY_CONN},
            "upstream_event": {"channel": hop_channel(spec, upstream), "conn_id": QUEUE_CONN},
        })
    return section



def write_conf(spec: TopologySpec, member: Member, source: Path) -> Path:
    """``member``'s settings folder: the source folder's files, its own ``<env>.yaml`` with the hop's release keys."""
    target = member.conf_dir
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*.yaml")):
        relative = path.relative_to(source)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        if relative != Path(f"{member.env}.yaml"):
            (target / relative).write_text(path.read_text())
    own = yaml.safe_load((source / f"{member.env}.yaml").read_text()) or {}
    own = deep_merge(own, {"release": release_section(spec, member.env)})
    header = (f"# generated by `cd4ml topology up` from {source / (member.env + '.yaml')} and the hop's release keys "
              "(tasks/ops/topology.py); edit the source, not this file\n")
    (target / f"{member.env}.yaml").write_text(header + yaml.safe_dump(own, sort_keys=False))
    load_settings(member.env, home=member.home, conf_dir=target)  # refuse a broken folder before anything starts
    return target


# ----------------------------------------------------------------------------------- environment
def _queue_connection(spec: TopologySpec) -> str:
    host, port = spec.redis.rsplit(":", 1)
    return json.dumps({"conn_type": "redis", "host": host, "port": int(port), "extra": {"db": 0}})


def reader_password(member: Member) -> str:
    """The read-only MLflow account's password of ``member``'s stack (its secrets.env: generated once, 0600)."""
    return stack_secrets(member.home / "stack", {})["CD4ML_MLFLOW_READER_PASSWORD"]


def stack_env(spec: TopologySpec, member: Member, upstream: Member | None,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of ``member``'s `cd4ml up`: its own names, the queue, and its upstream's reader account."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if not k.startswith(("AIRFLOW", "MLFLOW", "CD4ML")) or k in INHERITED
           or (k.startswith("AIRFLOW__") and k not in SECRET_NAMES)}  # an operator's Airflow option, never a key
    redis_host = spec.redis
    env.update({
        "CD4ML_HOME": str(member.home), "CD4ML_ENV": member.env, "CD4ML_STACK": "scaleout",
        "CD4ML_CONF_DIR": str(member.conf_dir), "CD4ML_PG_PREFIX": member.spec.pg_prefix,
        "CD4ML_REDIS_HOST": redis_host, "CD4ML_REDIS_DB": str(member.spec.redis_db),
        f"AIRFLOW_CONN_{QUEUE_CONN.upper()}": _queue_connection(spec),
        "PATH": f"{_BIN}:{environ.get('PATH', '')}",
    })
    if upstream is not None:
        env[f"AIRFLOW_CONN_{REGISTRY_CONN.upper()}"] = json.dumps(
            {"conn_type": "http", "login": "cd4ml-reader", "password": reader_password(upstream)})
    return env


# ------------------------------------------------------------------------------------- running
@dataclass
class Running:
    member: Member
    proc: subprocess.Popen
    log: Path


def sample_data(member: Member, env: Mapping[str, str]) -> None:
    """``cd4ml sample-data`` into ``member``'s landing, once (an environment ingests its own landing)."""
    landing = Path(load_settings(member.env, home=member.home, conf_dir=member.conf_dir).storage.landing_uri)
    if landing.exists() and any(landing.iterdir()):
        return
    proc = subprocess.run([str(_BIN / "cd4ml"), "sample-data"], env=dict(env), capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise TopologyError(f"{member.env}: cd4ml sample-data failed: {proc.stderr.strip().splitlines()[-1:]}")


def launch(member: Member, env: Mapping[str, str], workers: int) -> Running:
    """`cd4ml up` for one environment in its own session, its output in ``<home>/up.log``."""
    log = member.home / "up.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(_BIN / "cd4ml"), "up", "--mode", "scaleout", "--port", str(member.spec.port),
                                 "--mlflow-port", str(member.spec.mlflow_port), "--workers", str(workers)],
                                env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return Running(member, proc, log)


def wait_up(running: Running, deadline: float) -> None:
    """Until its `cd4ml up` says the stack is up; TopologyError (with the log's tail) when it exits or times out."""
    while "stack up" not in running.log.read_text(errors="replace"):
        if running.proc.poll() is not None or time.monotonic() > deadline:
            tail = running.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise TopologyError(f"{running.member.env}: cd4ml up did not come up (exit {running.proc.poll()}): {tail}; "
                                f"see {running.log}")
        time.sleep(1)


def stop_running(running: list[Running], timeout: float = 120.0) -> None:
    """SIGTERM each `cd4ml up` (it stops its components), downstream first; SIGKILL a group that outlives it."""
    for item in reversed(running):
        if item.proc.poll() is None:
            os.killpg(item.proc.pid, signal.SIGTERM)
        try:
            item.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_groups([item.proc.pid], timeout=10)


def write_state(root: Path, running: list[Running]) -> None:
    state = {"supervisor": os.getpid(), "environments": {
        r.member.env: {"home": str(r.member.home), "api": r.member.api_url, "mlflow": r.member.mlflow_url,
                       "up_pid": r.proc.pid, "log": str(r.log)} for r in running}}
    (root / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")


def prepare(spec: TopologySpec, planned: list[Member], with_sample_data: bool) -> list[dict[str, str]]:
    """Each stack's settings folder, secrets and environment (and sample data), in order sit, uat, prod."""
    source = resolve_conf_dir()
    envs = []
    for member in planned:
        write_conf(spec, member, source)
        reader_password(member)  # its secrets.env now: the downstream's Connection needs the reader's password
        upstream = next((m for m in planned if m.env == UPSTREAM.get(member.env)), None)
        envs.append(stack_env(spec, member, upstream))
        if with_sample_data:
            sample_data(member, envs[-1])
    return envs


def up(spec: TopologySpec, *, with_sample_data: bool = False, until: Callable[[], bool] | None = None,
       say: Callable[[str], None] = print) -> int:
    """Plan, start sit, uat and prod (together: each has its secrets first), report where each answers, supervise."""
    planned = members(spec)
    root = planned[0].home.parent
    root.mkdir(parents=True, exist_ok=True)
    envs = prepare(spec, planned, with_sample_data)
    stop = {"signal": None}

    def on_signal(signum, _frame) -> None:
        stop["signal"] = signum

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    running: list[Running] = []
    try:
        for member, env in zip(planned, envs):
            say(f"starting {member.env} (Airflow {member.api_url}, MLflow {member.mlflow_url}) ...")
            running.append(launch(member, env, spec.workers))
        write_state(root, running)
        deadline = time.monotonic() + UP_TIMEOUT_S
        for item in running:
            wait_up(item, deadline)
        say(banner(spec, planned))
        while stop["signal"] is None and not (until and until()):
            dead = [r.member.env for r in running if r.proc.poll() is not None]
            if dead:
                say(f"cd4ml topology: the {', '.join(dead)} stack stopped; stopping the others (logs: {root}/<env>/up.log)")
                return 1
            time.sleep(1)
        return 0
    finally:
        say(f"stopping {', '.join(r.member.env for r in reversed(running)) or 'nothing'} ...")
        stop_running(running)
        (root / STATE_FILE).unlink(missing_ok=True)
        for s, handler in previous.items():
            signal.signal(s, handler)


def banner(spec: TopologySpec, planned: list[Member]) -> str:
    lines = ["cd4ml topology up: sit -> uat -> prod, three scale-out stacks"]
    for m in planned:
        lines.append(f"  {m.env:<4}  Airflow {m.api_url}  MLflow {m.mlflow_url}  home {m.home}  "
                     f"(passwords in {m.secrets_file})")
    lines.append(f"  queue: redis://{spec.redis} channels {hop_channel(spec, 'sit')}, {hop_channel(spec, 'uat')}")
    lines.append("  stop: Ctrl-C here, or `cd4ml topology down`")
    return "\n".join(lines)


def down(spec: TopologySpec, timeout: float = 180.0) -> list[str]:
    """Stop a topology started in another shell: its supervisor stops the stacks, downstream first."""
    root = root_dir(spec)
    path = root / STATE_FILE
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    envs = list(state.get("environments", {}))
    supervisor = int(state["supervisor"])
    try:
        os.kill(supervisor, signal.SIGTERM)
    except ProcessLookupError:  # the supervisor died: stop each stack's `cd4ml up` group ourselves
        stop_groups([int(e["up_pid"]) for e in reversed(state["environments"].values())])
        path.unlink(missing_ok=True)
        return envs
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(1)
    return envs


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 - this machine's own stacks
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def status(spec: TopologySpec) -> dict[str, dict[str, Any]]:
    """Each environment: where it answers, whether its API and MLflow answer now, its channels and upstream."""
    out = {}
    for m in members(spec):
        state_file = m.home / "stack" / "scaleout" / "stack.json"
        groups = json.loads(state_file.read_text())["groups"] if state_file.exists() else {}
        out[m.env] = {
            "home": str(m.home), "api": m.api_url, "mlflow": m.mlflow_url,
            "api_healthy": _answers(f"{m.api_url}/api/v2/monitor/health"),
            "mlflow_healthy": _answers(f"{m.mlflow_url}/health"),
            "components_alive": sorted(name for name, pgid in groups.items() if group_pids(int(pgid))),
            "upstream": UPSTREAM.get(m.env), "listens_on": hop_channel(spec, UPSTREAM[m.env]) if m.env in UPSTREAM else None,
            "announces_on": hop_channel(spec, m.env) if m.env in DOWNSTREAM else None,
        }
    return out


def command_env(spec: TopologySpec, env: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a `cd4ml` command of ``env`` runs with: as its stack's tasks (MLflow account, Connections)."""
    from tasks.ops.stack import plan

    planned = {m.env: m for m in members(spec, environ)}
    member = planned[env]
    base = stack_env(spec, member, planned.get(UPSTREAM.get(env, "")), environ)
    return plan("scaleout", home=str(member.home), port=member.spec.port, mlflow_port=member.spec.mlflow_port,
                base_env=base).env


def run_in(spec: TopologySpec, env: str, args: list[str]) -> int:
    """`cd4ml <args>` as ``env``'s deployment (e.g. lineage in prod); its exit status."""
    if env not in ENVIRONMENTS:
        raise TopologyError(f"run: the environment is one of {', '.join(ENVIRONMENTS)}")
    return subprocess.run([str(_BIN / "cd4ml"), *args], env=command_env(spec, env)).returncode
