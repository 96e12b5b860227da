"""sit, uat and prod as three running deployments (`cd4ml topology up`): a model walks from sit to prod.

Three scale-out stacks on this machine (each its own home, ports, PostgreSQL databases, Redis
database, secrets), started by the product's command; they share only the hop's Redis channel and
the upstream's read-only MLflow account. Driven only through each stack's REST API, its MLflow
server and the ``cd4ml`` command, in order (the tests build on each other):

1. sit trains; its champion's announcement reaches uat's triggerer; uat imports it from sit's
   registry, gates it on its own data, promotes it; the announcement reaches prod, which waits
   until prod's approver approves over prod's REST API; `cd4ml lineage` in prod goes back to sit.
2. sit's announcement delivered a second time: uat runs again and imports nothing new.
3. uat's triggerer down (its supervisor held) while sit announces a new champion: the message is
   lost; uat's cd4ml_reconcile imports it; prod gets it by event and a person's approval.
4. a rollback in prod moves prod's champion only; uat's reader account gets 403 on every write to
   sit's registry.
5. bad input against sit's running registry, each a clear error with nothing imported: hand-made sit
   versions without integrity manifest, without lineage tags, without sit's gate pass, with MLmodel changed on sit's disk after
   its manifest (one alert each, however often retried); refused credentials; an unreachable
   registry; sit without champion.

Marked ``stack`` (`make test-stack`). Durations: bench/README.md ("Three deployments").
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.dags.airflow_services import (
    AirflowHandle,
    answer_hitl,
    q,
    trigger,
    wait_for_awaiting_input,
    wait_for_run,
)
from tests.dags.conftest import RELEASE_FLOW_GATE, RELEASE_FLOW_TRAINING
from tests.peers import free_port
from tests.stack import harness
from tests.stack.harness import BIN, REPO
from tests.stack.test_scaleout import _services_or_skip

pytestmark = pytest.mark.stack

ENVS = ("sit", "uat", "prod")
REDIS_DBS = {"sit": 12, "uat": 13, "prod": 14}
# The release flow's settings (tests/dags/conftest.py, as the release DAGs' test); no schedules besides the events
# themselves (the gate in every file: uat's and prod's own files set theirs); the reconcile runs when the test
# triggers it.
FAST_GATE = {"gate": RELEASE_FLOW_GATE}
FAST = {"ingest": {"schedule": None}, "training": RELEASE_FLOW_TRAINING,
        "release": {"upstream_registry": {"reconcile_schedule": None}}, **FAST_GATE}


@dataclass
class Deployment:
    """One running environment as a user reaches it: its REST API, its MLflow server, its `cd4ml` environment."""

    name: str
    handle: AirflowHandle
    mlflow: str
    admin: tuple[str, str]
    cli_env: dict
    model_name: str
    supervisor: int
    groups: dict


def _fast_conf(target: Path) -> Path:
    from tasks.settings import deep_merge as _merged

    target.mkdir(parents=True)
    for name in ("base.yaml", *(f"{e}.yaml" for e in ENVS)):
        data = yaml.safe_load((REPO / "conf" / name).read_text()) or {}
        (target / name).write_text(yaml.safe_dump(_merged(data, FAST if name == "base.yaml" else FAST_GATE),
                                                  sort_keys=False))
    return target


def _secrets(home: Path) -> dict[str, str]:
    lines = (home / "stack" / "secrets.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def _deployment(spec, member, env: dict) -> Deployment:
    from tasks.ops import topology
    from tasks.settings import load_settings

    secrets = _secrets(member.home)
    cli_env = topology.command_env(spec, member.env, environ=env)  # what `cd4ml topology run <env>` uses
    state = json.loads((member.home / "stack" / "scaleout" / "stack.json").read_text())
    handle = AirflowHandle(home=str(member.home), base_url=member.api_url, env=cli_env,
                           users={"admin": ("Admin", secrets["CD4ML_ADMIN_PASSWORD"]),
                                  "approver": ("User", secrets["CD4ML_APPROVER_PASSWORD"])})
    return Deployment(member.env, handle, member.mlflow_url, ("admin", secrets["MLFLOW_TRACKING_PASSWORD"]), cli_env,
                      load_settings(member.env, home=member.home, conf_dir=member.conf_dir).registry.model_name,
                      int(state["supervisor"]), state["groups"])


@pytest.fixture(scope="module")
def topo(tmp_path_factory) -> Iterator[dict]:
    _services_or_skip()
    import redis

    from tasks.ops import topology

    home = tmp_path_factory.mktemp("topology")
    tag = f"t{uuid.uuid4().hex[:8]}"
    spec_file = home / "topology.yaml"
    spec_file.write_text(yaml.safe_dump({"channel_prefix": tag, **{e: {
        "port": free_port(), "mlflow_port": free_port(), "pg_prefix": f"{tag}_{e}", "redis_db": REDIS_DBS[e]}
        for e in ENVS}}))
    # (not a longer DAG re-parse interval: an unpaused DAG's AssetWatcher subscribes only after its next parse)
    env = harness.stack_env(home, "scaleout", _fast_conf(home / "conf"), CD4ML_HEARTBEAT_TIMEOUT="30")
    env.pop("CD4ML_ENV"), env.pop("CD4ML_STACK")
    spec = topology.read_spec(spec_file)
    client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=3)
    listener = client.pubsub()  # the test hears each announcement too: it can deliver one again
    listener.subscribe(topology.hop_channel(spec, "sit"), topology.hop_channel(spec, "uat"))
    log = home / "topology.log"
    started = time.monotonic()
    with open(log, "w") as out:
        up = subprocess.Popen([str(BIN / "cd4ml"), "topology", "up", "--file", str(spec_file), "--sample-data"],
                              env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    info = {"home": home, "spec": spec, "env": env, "log": log, "redis": client, "listener": listener}
    try:
        while "topology up:" not in log.read_text():
            assert up.poll() is None and time.monotonic() - started < 900, _what_happened(home, log)
            time.sleep(1)
        info["up_s"] = time.monotonic() - started
        info["rss_mib"] = _rss_mib(topology.members(spec, env))
        print(f"three stacks up in {info['up_s']:.0f} s, RSS {info['rss_mib']} MiB")
        info.update({m.env: _deployment(spec, m, env) for m in topology.members(spec, env)})
        yield info
    finally:
        groups = [g for e in ENVS if e in info for g in [info[e].supervisor, *info[e].groups.values()]]
        with contextlib.suppress(ProcessLookupError):  # `topology up` may have ended (it failed to come up)
            os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=300)
        leftovers = {g: pids for g in groups if (pids := _alive(g))}
        for pids in leftovers.values():
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        listener.close()
        for e in ENVS:
            harness.drop_databases(f"{tag}_{e}")
            redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DBS[e]).flushdb()
        assert not leftovers, f"processes outlived cd4ml topology up: {leftovers}"
        assert up.returncode == 0, log.read_text()[-3000:]


def _what_happened(home: Path, log: Path) -> str:
    """The end of `topology up`'s log and of each member's bootstrap log (the CI machine keeps neither)."""
    tails = [log.read_text()[-3000:]]
    for boot in sorted(home.glob("cd4ml/topology/*/stack/scaleout/logs/bootstrap.log")):
        tails.append(f"--- {boot.relative_to(home)}\n{boot.read_text()[-2500:]}")
    return "\n".join(tails)


def _alive(pgid: int) -> list[int]:
    from tasks.ops.stack import group_pids

    return group_pids(pgid)


def _rss_mib(members) -> int:
    """Resident memory of the three stacks: every process of every component's group and each supervisor."""
    total = 0
    for member in members:
        state = json.loads((member.home / "stack" / "scaleout" / "stack.json").read_text())
        for pgid in [state["supervisor"], *state["groups"].values()]:
            for pid in _alive(int(pgid)):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0)
    return total // 1024


# ------------------------------------------------------------------------------------- helpers
def _mlflow(d: Deployment, method: str, path: str, body=None, query=None, account=None) -> tuple[int, dict]:
    url = f"{d.mlflow}/api/2.0/mlflow/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    req = urllib.request.Request(url, json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json", "Authorization": "Basic " +
                                          base64.b64encode(":".join(account or d.admin).encode()).decode()})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _champion(d: Deployment) -> int | None:
    status, body = _mlflow(d, "GET", "registered-models/get", query={"name": d.model_name})
    aliases = {a["alias"]: int(a["version"]) for a in body.get("registered_model", {}).get("aliases", [])}
    return aliases.get("champion") if status == 200 else None


def _versions(d: Deployment) -> list[dict]:
    status, body = _mlflow(d, "GET", "model-versions/search", query={"filter": f"name='{d.model_name}'"})
    assert status == 200
    return body.get("model_versions", [])


def _tags(d: Deployment, version: int) -> dict[str, str]:
    status, body = _mlflow(d, "GET", "model-versions/get", query={"name": d.model_name, "version": str(version)})
    assert status == 200
    return {t["key"]: t["value"] for t in body["model_version"].get("tags", [])}


def _runs(d: Deployment, dag_id: str) -> list[str]:
    runs = d.handle.request("GET", f"/api/v2/dags/{q(dag_id)}/dagRuns?order_by=run_after", user="admin")["dag_runs"]
    return [r["dag_run_id"] for r in runs]


def _new_run(d: Deployment, dag_id: str, seen: int, timeout: float = 600) -> str:
    """The run after the first ``seen`` ones (started by an Asset event or another DAG), once it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _runs(d, dag_id)
        if len(runs) > seen:
            assert len(runs) == seen + 1, runs
            return runs[-1]
        time.sleep(1)
    raise TimeoutError(f"{d.name}: no new {dag_id} run after {seen}")


def _succeeds(d: Deployment, dag_id: str, run: str, timeout: float = 900) -> None:
    state = wait_for_run(d.handle, dag_id, run, timeout=timeout)
    assert state == "success", f"{d.name} {dag_id} {run}: {state} {d.handle.task_states(dag_id, run)}"


def _listeners(topo, upstream: str) -> int:
    from tasks.ops.topology import hop_channel

    channel = hop_channel(topo["spec"], upstream)
    return dict(topo["redis"].pubsub_numsub(channel)).get(channel.encode(), 0) - 1  # minus the test's own


def _wait_listeners(topo, upstream: str, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while _listeners(topo, upstream) != count:
        assert time.monotonic() < deadline, f"the {upstream} hop has {_listeners(topo, upstream)} listeners, not {count}"
        time.sleep(0.5)


def _heard(topo, timeout: float = 30) -> dict:
    """The next announcement the test heard on either hop (the listener buffers them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = topo["listener"].get_message(ignore_subscribe_messages=True, timeout=1.0)
        if message and message["type"] == "message":
            return {"channel": message["channel"].decode(), "data": message["data"].decode()}
    raise TimeoutError("no announcement heard")


def _train_in_sit(topo, force: bool = False) -> int:
    from tasks.data import lake
    from tasks.ops.topology import members
    from tasks.settings import load_settings

    sit: Deployment = topo["sit"]
    member = members(topo["spec"], topo["env"])[0]
    settings = load_settings("sit", home=member.home, conf_dir=member.conf_dir)
    seen = len(_runs(sit, "cd4ml_train"))
    run = trigger(sit.handle, "cd4ml_train", {"curated_version": lake.current_version(settings.curated_table),
                                              "force_retrain": force})
    _succeeds(sit, "cd4ml_train", run, timeout=1200)
    for other in _runs(sit, "cd4ml_train")[seen:]:  # curation's Asset event may have queued one more (same data)
        _succeeds(sit, "cd4ml_train", other, timeout=1200)
    return _champion(sit)


def _approve_in_prod(topo, run: str) -> None:
    prod: Deployment = topo["prod"]
    # 8 s after the task parked (tests/dags/test_release_dags.py::_await_approval: Airflow 3.3.2's stale event)
    wait_for_awaiting_input(prod.handle, "cd4ml_promote", run, "approve", timeout=900, settle_s=8.0)
    answer_hitl(prod.handle, "cd4ml_promote", run, "approve", "Approve", user="approver",
                params_input={"reason": "walked from sit"})
    _succeeds(prod, "cd4ml_promote", run)


def _cd4ml(d: Deployment, *args: str, **extra: str) -> str:
    proc = subprocess.run([str(BIN / "cd4ml"), *args], env={**d.cli_env, **extra}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# --------------------------------------------------------------------------------------- tests
def _copies_scored_in_workers(home: Path, env: str) -> None:
    """``env``'s curation, a task in a Celery worker, scored its copies in worker processes: enough pairs for the
    pool, and no fall-over to the task's own process (a spawned worker that re-ran the ``airflow`` script died on the
    database URL Airflow 3 gives a task: ``tasks.worker_pool``)."""
    from tasks.curation.copy_pairs import PARALLEL_FROM

    root = home / "cd4ml" / "topology" / env
    reports = sorted(root.glob(f"{env}/reports/curation/curation_raw0_*.json"))
    logs = sorted(root.glob("airflow-scaleout/logs/dag_id=cd4ml_curate/*/task_id=curate/attempt=*.log"))
    assert reports and logs, (reports, logs)
    assert json.loads(reports[0].read_text())["copies"]["pairs_scored"] >= PARALLEL_FROM
    assert not [p for p in logs if "copy-score workers failed" in p.read_text()]


def test_a_model_trained_in_sit_walks_to_prod_by_events_gates_and_an_approval(topo) -> None:
    sit, uat, prod = (topo[e] for e in ENVS)
    for d in (uat, prod, sit):  # each environment ingests and curates its own landing
        for dag_id in ("cd4ml_ingest", "cd4ml_curate"):
            d.handle.wait_for_dag(dag_id, timeout=300)
            d.handle.unpause(dag_id)
        trigger(d.handle, "cd4ml_ingest", {"dataset_version_name": f"{d.name}-1"})
    for d in (uat, prod):
        d.handle.wait_for_dag("cd4ml_promote", timeout=300)
        d.handle.unpause("cd4ml_promote")  # its Asset's watcher subscribes now
    for d in (uat, prod, sit):
        _succeeds(d, "cd4ml_ingest", _runs(d, "cd4ml_ingest")[0])
        _succeeds(d, "cd4ml_curate", _new_run(d, "cd4ml_curate", 0))
    _copies_scored_in_workers(topo["home"], "sit")
    sit.handle.wait_for_dag("cd4ml_train", timeout=300)
    sit.handle.unpause("cd4ml_train")  # only now: uat must have its own data before sit's champion reaches it
    _wait_listeners(topo, "sit", 1)  # uat's triggerer listens on sit -> uat, prod's on uat -> prod
    _wait_listeners(topo, "uat", 1)

    # sit trains on its sample and promotes (no approval in sit): the announcement goes out on sit -> uat
    assert _train_in_sit(topo) == 1
    sit_event = _heard(topo)
    assert json.loads(sit_event["data"])["version"] == 1 and sit_event["channel"].endswith("-sit-to-uat")
    topo["sit_event"] = sit_event

    # uat: the event starts cd4ml_promote; the import from sit's registry passes uat's gate and becomes champion
    _succeeds(uat, "cd4ml_promote", _new_run(uat, "cd4ml_promote", 0))
    assert _champion(uat) == 1 and len(_versions(uat)) == 1
    tags = _tags(uat, 1)
    assert (tags["cd4ml.import.source_env"], tags["cd4ml.import.source_version"]) == ("sit", "1")
    assert tags["cd4ml.import.source_registry"] == sit.mlflow and tags["cd4ml.gate.decision"] == "pass"
    assert json.loads(_heard(topo)["data"])["env"] == "uat"  # uat announced its champion on uat -> prod

    # prod: the event starts cd4ml_promote, which waits for a person; prod's approver approves over prod's API
    run = _new_run(prod, "cd4ml_promote", 0)
    assert _champion(prod) is None
    _approve_in_prod(topo, run)
    assert _champion(prod) == 1 and _tags(prod, 1)["cd4ml.import.source_env"] == "uat"

    lineage = _cd4ml(prod, "lineage", f"models:/{prod.model_name}@champion")
    print(lineage)
    assert lineage.count("copied from registry") == 2, lineage  # prod <- uat (read as uat's reader) <- sit
    assert f"models:/{uat.model_name}/1 (uat)" in lineage and "approval approved by approver" in lineage
    # prod holds no account of sit's: that hop is named, with why, and the data it trained on as the copies record it
    assert f"models:/{sit.model_name}/1 (sit): CANNOT REACH this hop" in lineage and "HTTP 401" in lineage
    assert "trained on (as this version's tags record it): " in lineage and "training_sample" in lineage, lineage


def test_the_same_announcement_twice_imports_one_version(topo) -> None:
    uat: Deployment = topo["uat"]
    seen = len(_runs(uat, "cd4ml_promote"))
    assert topo["redis"].publish(topo["sit_event"]["channel"], topo["sit_event"]["data"]) == 2  # uat and the test
    _heard(topo)
    _succeeds(uat, "cd4ml_promote", _new_run(uat, "cd4ml_promote", seen))
    assert len(_versions(uat)) == 1 and _champion(uat) == 1
    assert len(_runs(topo["prod"], "cd4ml_promote")) == 1  # nothing moved in uat: nothing announced to prod


def test_an_announcement_lost_while_uats_triggerer_is_down_is_recovered_by_the_reconcile(topo) -> None:
    sit, uat, prod = (topo[e] for e in ENVS)
    promote_runs = len(_runs(uat, "cd4ml_promote"))
    # uat's consumer down: its supervisor held (it would restart the triggerer), the triggerer killed
    os.kill(uat.supervisor, signal.SIGSTOP)
    try:
        os.killpg(uat.groups["triggerer"], signal.SIGKILL)
        _wait_listeners(topo, "sit", 0)
        assert _train_in_sit(topo, force=True) == 2  # a new champion in sit, announced to nobody in uat
        assert json.loads(_heard(topo)["data"])["version"] == 2
    finally:
        os.kill(uat.supervisor, signal.SIGCONT)
    _wait_listeners(topo, "sit", 1, timeout=300)  # the triggerer is back, the message is gone for good
    assert len(_runs(uat, "cd4ml_promote")) == promote_runs and _champion(uat) == 1

    uat.handle.wait_for_dag("cd4ml_reconcile")
    uat.handle.unpause("cd4ml_reconcile")
    _succeeds(uat, "cd4ml_reconcile", trigger(uat.handle, "cd4ml_reconcile"))
    _succeeds(uat, "cd4ml_promote", _new_run(uat, "cd4ml_promote", promote_runs))
    assert _champion(uat) == 2 and _tags(uat, 2)["cd4ml.import.source_version"] == "2"
    assert len(_versions(uat)) == 2

    _heard(topo)  # uat -> prod
    _approve_in_prod(topo, _new_run(prod, "cd4ml_promote", 1))
    assert _champion(prod) == 2


def test_a_rollback_in_prod_leaves_uat_alone_and_uats_reader_cannot_write_sit(topo) -> None:
    sit, uat, prod = (topo[e] for e in ENVS)
    prod.handle.wait_for_dag("cd4ml_rollback")
    prod.handle.unpause("cd4ml_rollback")
    approver = prod.handle.users["approver"][1]
    out = _cd4ml(prod, "rollback", "--env", "prod", "--reason", "canary regression",
                 CD4ML_AIRFLOW_USERNAME="approver", CD4ML_AIRFLOW_PASSWORD=approver)
    _succeeds(prod, "cd4ml_rollback", json.loads(out)["dag_run_id"], timeout=300)
    assert (_champion(prod), _champion(uat), _champion(sit)) == (1, 2, 2)

    reader = json.loads(uat.cli_env["AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY"])
    account = (reader["login"], reader["password"])
    assert _mlflow(sit, "GET", "registered-models/get", query={"name": sit.model_name}, account=account)[0] == 200
    writes = [("POST", "model-versions/create", {"name": sit.model_name, "source": "models:/elsewhere/1"}),
              ("POST", "registered-models/alias", {"name": sit.model_name, "alias": "champion", "version": "1"}),
              ("POST", "model-versions/set-tag", {"name": sit.model_name, "version": "2", "key": "k", "value": "v"}),
              ("DELETE", "registered-models/delete", {"name": sit.model_name})]
    assert [_mlflow(sit, m, path, body, account=account)[0] for m, path, body in writes] == [403] * len(writes)
    assert _champion(sit) == 2 and len(_versions(sit)) == 2


_HAND_REGISTER = """
import json
from pathlib import Path

import mlflow

from tasks.models.integrity import CLIENT_WRITTEN, record_manifest
from tasks.models.registry import mlflow_client
from tasks.settings import load_settings

sit = load_settings("sit")
client, name = mlflow_client(sit), sit.registry.model_name
champion = client.get_model_version_by_alias(name, "champion")
folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{champion.version}",
                                                  tracking_uri=sit.tracking_uri, registry_uri=sit.tracking_uri))
(folder / CLIENT_WRITTEN).unlink(missing_ok=True)
lineage = {k: v for k, v in champion.tags.items()
           if k in ("cd4ml.curated_table", "cd4ml.curated_version", "cd4ml.raw_version", "cd4ml.env",
                    "cd4ml.gate.decision")}
experiment = client.get_experiment_by_name(sit.tracking.experiment).experiment_id
made = {}
ungated = {k: v for k, v in lineage.items() if k != "cd4ml.gate.decision"}
for case, tags, manifest in (("no_manifest", lineage, False), ("no_lineage", {}, True), ("never_gated", ungated, True),
                             ("changed", lineage, True)):
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(folder), "model")
    client.set_terminated(run.info.run_id)
    version = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id, tags=tags)
    if manifest:
        record_manifest(sit, client, client.get_model_version(name, version.version))
    made[case] = {"version": int(version.version), "artifacts": run.info.artifact_uri}
print(json.dumps(made))
"""


def _import_refused(d: Deployment, *args: str, **extra: str) -> str:
    """`cd4ml import-model` in ``d`` that must fail: its stderr (the error, one clear line)."""
    proc = subprocess.run([str(BIN / "cd4ml"), "import-model", "--env", d.name, *args], env={**d.cli_env, **extra},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stderr


def test_bad_or_changed_upstream_versions_import_nothing_each_with_a_clear_error(topo) -> None:
    """Against sit's running registry: four hand-made sit versions (no manifest, no lineage, no gate pass, a file
    changed on sit's disk after its manifest), refused credentials, an unreachable registry, an upstream without champion."""
    sit, uat = topo["sit"], topo["uat"]
    made = subprocess.run([str(BIN / "python"), "-c", _HAND_REGISTER], env=sit.cli_env, capture_output=True,
                          text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    made = json.loads(made.stdout.strip().splitlines()[-1])
    stored = made["changed"]["artifacts"].removeprefix("mlflow-artifacts:/")
    mlmodel = Path(sit.cli_env["CD4ML_MLFLOW_ARTIFACTS"], stored, "model", "MLmodel")
    mlmodel.write_text(mlmodel.read_text() + "\n# changed on sit's disk after registration\n")
    before = _versions(uat)

    for _ in range(2):  # the event, then the reconcile: each refusal alerts once per upstream version
        err = _import_refused(uat, "--source-version", str(made["changed"]["version"]))
        assert "'MLmodel'" in err and "changed" in err, err
        assert "no valid integrity manifest" in _import_refused(uat, "--source-version", str(made["no_manifest"]["version"]))
        assert "no lineage tags" in _import_refused(uat, "--source-version", str(made["no_lineage"]["version"]))
        assert "has not passed its own environment's gate" in _import_refused(
            uat, "--source-version", str(made["never_gated"]["version"]))

    reader = json.loads(uat.cli_env["AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY"])
    wrong = json.dumps({**reader, "password": "not-the-readers-password-7f3a"})
    err = _import_refused(uat, AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY=wrong)
    assert "refused" in err and "HTTP 401" in err and "not-the-readers" not in err and reader["password"] not in err, err
    err = _import_refused(uat, CD4ML_UPSTREAM_REGISTRY_URI=f"http://127.0.0.1:{free_port()}")
    assert "did not answer" in err, err

    champion = _champion(sit)
    assert _mlflow(sit, "DELETE", "registered-models/alias", {"name": sit.model_name, "alias": "champion"})[0] == 200
    try:
        assert "has no champion" in _import_refused(uat)
    finally:
        assert _mlflow(sit, "POST", "registered-models/alias",
                       {"name": sit.model_name, "alias": "champion", "version": str(champion)})[0] == 200

    assert _versions(uat) == before and _champion(uat) == 2  # nothing imported, nothing moved
    alerts = json.loads(_cd4ml(uat, "alerts", "--env", "uat", "--all", "--json"))
    keys = sorted(a["dedup_key"] for a in alerts if a["kind"] in ("model_tampered", "source_unverifiable"))
    assert keys == sorted([f"uat:model_tampered:{sit.model_name}:v{made['changed']['version']}",
                           *(f"uat:source_unverifiable:sit:{sit.model_name}:v{made[c]['version']}"
                             for c in ("no_manifest", "no_lineage", "never_gated"))]), alerts
