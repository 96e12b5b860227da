"""Releases through real Airflow runs: sit -> uat -> prod, the prod approval answered over the REST API.

sit and uat need no person, so their DAGs run under ``airflow dags test``. prod waits for a
human decision in an ``ApprovalOperator`` (HITL), which only a real scheduler resolves (the
response timeout is the scheduler's sweep) and only the API server can answer: prod runs under
a real scheduler, DAG processor and API server on SQLite (tests/dags/airflow_services.py), and
the test answers as named users of Airflow's simple auth manager.

Order matters and is the story: deploy model first (prod has no champion yet: reject, timeout,
`approve` marked success by hand (promote refused), then approve), then deploy code (prod trains on all its data; the candidate is challenger while
the copied champion still serves, and becomes champion only after the approval), then rollback
from the command line through the API server as a signed-in user, whom the ledger names.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dags.airflow_services import (
    answer_hitl,
    q,
    start_airflow,
    trigger,
    wait_for_awaiting_input,
    wait_for_run,
)
from tests.dags.conftest import (
    DAGS,
    PLUGINS,
    RELEASE_FLOW_GATE,
    RELEASE_FLOW_TRAINING,
    edited_conf,
    run_airflow,
)

pytestmark = [pytest.mark.airflow, pytest.mark.stack]  # real scheduler + API server: make test-stack
DATE = "2026-11-21"
FAST = {"training": RELEASE_FLOW_TRAINING, "gate": RELEASE_FLOW_GATE}  # the release flow, not accuracy or speed


def _conf(target: Path, prod: dict, uat: dict | None = None) -> Path:
    return edited_conf(target, FAST, {
        "uat.yaml": {"release": uat or {}},
        "prod.yaml": {"release": {**prod, "approval_timeout_hours": 0.02}},  # 72 s; prod's approvers stay
    })


def _cd4ml(args: list[str], env: dict) -> str:
    proc = subprocess.run([str(Path(sys.executable).parent / "cd4ml"), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _dag_test(dag_id: str, env: dict, conf: dict | None = None) -> str:
    proc = run_airflow(["dags", "test", dag_id, DATE] + (["-c", json.dumps(conf)] if conf else []), env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{dag_id} ({env['CD4ML_ENV']}) exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _settings(world: dict, env: str, conf: str):
    from tasks.settings import load_settings

    return load_settings(env, home=world["home"], conf_dir=world[conf])


def _aliases(settings) -> dict[str, int]:
    from tasks.models.registry import mlflow_client

    client = mlflow_client(settings)
    try:
        return {k: int(v) for k, v in (client.get_registered_model(settings.registry.model_name).aliases or {}).items()}
    except Exception:  # noqa: BLE001 - no registered model yet
        return {}


def _audit(settings) -> list:
    from tasks.release import audit

    return [r for r in audit.read(settings) if r.model_name == settings.registry.model_name]


@pytest.fixture(scope="module")
def world(airflow_env, tmp_path_factory) -> dict:
    """sit has a champion trained on its sample; prod has ingested and curated its own data."""
    base = tmp_path_factory.mktemp("release-world")
    model = {"pattern": "deploy_model"}
    world = {
        "base": base,
        "home": str(base / "cd4ml"),
        "code": _conf(base / "conf-code", prod={"pattern": "deploy_code"}),
        "model": _conf(base / "conf-model", prod={**model, "upstream": "uat"}, uat={**model, "upstream": "sit"}),
    }
    cli_home = base / "airflow-cli"
    cli_home.mkdir()
    env = {**airflow_env, "CD4ML_HOME": world["home"], "AIRFLOW_HOME": str(cli_home), "CD4ML_CONF_DIR": str(world["code"])}
    assert run_airflow(["db", "migrate"], env).returncode == 0
    world["cli_env"] = env
    _cd4ml(["sample-data"], env)
    for name in ("sit", "prod"):
        for dag_id in ("cd4ml_ingest", "cd4ml_curate"):
            _dag_test(dag_id, {**env, "CD4ML_ENV": name})
    out = _dag_test("cd4ml_train", {**env, "CD4ML_ENV": "sit"})
    assert "training on sample-50pct-" in out
    sit = _settings(world, "sit", "code")
    assert "champion" in _aliases(sit)
    return world


@pytest.fixture
def prod_services(world, request):
    """A real prod deployment (scheduler, DAG processor, API server) on the given settings folder."""
    handles = []

    def start(conf: str):
        home = world["base"] / f"airflow-prod-{conf}"
        shutil.rmtree(home, ignore_errors=True)
        extra = {"CD4ML_HOME": world["home"], "CD4ML_ENV": "prod", "CD4ML_CONF_DIR": str(world[conf]),
                 "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS), "AIRFLOW__CORE__PARALLELISM": "2"}
        handle = start_airflow(str(home), str(DAGS), env_extra=extra,
                               users={"approver": ("admin", "approver-pw"), "other": ("admin", "other-pw")})
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def _await_approval(h, dag_id: str, run_id: str) -> None:
    try:
        # 8 s, not 3: on a loaded machine an answer 3 s after the task parked still met 3.3.2's stale executor
        # event ("Failed to report terminal task state"), the retry then timed out (docs/release.md#approval-prod).
        wait_for_awaiting_input(h, dag_id, run_id, "approve", timeout=600, settle_s=8.0)
    except TimeoutError:
        raise AssertionError(f"{dag_id} {run_id} never waited for approval: {h.task_states(dag_id, run_id)}") from None


def test_deploy_model_sit_to_uat_to_prod_with_reject_timeout_and_approve(world, prod_services) -> None:
    env = {**world["cli_env"], "CD4ML_CONF_DIR": str(world["model"])}
    sit, uat, prod = (_settings(world, e, "model") for e in ("sit", "uat", "prod"))
    sit_champion = _aliases(sit)["champion"]

    # uat: its own data for its own frozen test split, then the copy of sit's champion, gated, promoted.
    for dag_id in ("cd4ml_ingest", "cd4ml_curate"):
        _dag_test(dag_id, {**env, "CD4ML_ENV": "uat"})
    out = _dag_test("cd4ml_promote", {**env, "CD4ML_ENV": "uat"})
    assert f"imported from models:/{sit.registry.model_name}/{sit_champion}" in out
    uat_champion = _aliases(uat)["champion"]
    assert [r.action for r in _audit(uat)] == ["challenger", "promote"]

    h = prod_services("model")
    h.wait_for_dag("cd4ml_promote")
    h.unpause("cd4ml_promote")

    # 1. A person rejects, with a reason; a non-approver cannot answer at all.
    run = trigger(h, "cd4ml_promote")
    _await_approval(h, "cd4ml_promote", run)
    detail = h.hitl_detail("cd4ml_promote", run, "approve")
    assert detail["subject"].startswith(f"Promote {prod.registry.model_name} v")
    assert "| class |" in detail["body"] and "**Drift**" in detail["body"] and "McNemar" not in detail["body"]
    logs = "".join(p.read_text() for p in Path(h.home, "logs").rglob("*.log") if "task_id=approve" in str(p))
    assert "approval needed in prod" in logs and "/required_actions" in logs  # on-call hears it is waiting
    status, _ = answer_hitl(h, "cd4ml_promote", run, "approve", "Approve", user="other", expect=None)
    assert status == 403
    answer_hitl(h, "cd4ml_promote", run, "approve", "Reject", user="approver",
                params_input={"reason": "holiday freeze"})
    assert wait_for_run(h, "cd4ml_promote", run, 300) == "success"
    states = h.task_states("cd4ml_promote", run)
    assert states["promote"] == "skipped" and states["finish"] == "success"
    candidate = _aliases(prod)["challenger"]
    assert "champion" not in _aliases(prod)
    last = _audit(prod)[-1]
    assert (last.action, last.actor, last.reason, last.to_version) == ("rejected", "approver", "holiday freeze", candidate)

    # 2. Nobody answers: the timeout rejects, recorded as such; the champion stays untouched (none).
    run = trigger(h, "cd4ml_promote")
    _await_approval(h, "cd4ml_promote", run)
    assert wait_for_run(h, "cd4ml_promote", run, 300) == "success"
    assert h.task_states("cd4ml_promote", run)["promote"] == "skipped"
    assert "champion" not in _aliases(prod)
    assert (_audit(prod)[-1].action, _audit(prod)[-1].actor) == ("timeout", "timeout")

    # 2b. `approve` marked success by hand (the UI's "Mark as success"): promote runs, finds no recorded
    # decision, refuses and alerts; nothing moves.
    from tasks.alerting.incidents import open_incidents

    run = trigger(h, "cd4ml_promote")
    _await_approval(h, "cd4ml_promote", run)
    h.request("PATCH", f"/api/v2/dags/cd4ml_promote/dagRuns/{q(run)}/taskInstances/approve", {"new_state": "success"})
    assert wait_for_run(h, "cd4ml_promote", run, 300) == "failed"  # a refused promotion fails its run
    assert h.task_states("cd4ml_promote", run)["promote"] == "failed"
    assert "champion" not in _aliases(prod)
    assert not [r for r in _audit(prod) if r.airflow_run_id == run and r.action in ("approved", "promote")]
    assert any(i.alert.kind == "release_refused" for i in open_incidents(prod))

    # 3. Approved: champion moves, the ledger names who approved and the gate report.
    run = trigger(h, "cd4ml_promote")
    _await_approval(h, "cd4ml_promote", run)
    answer_hitl(h, "cd4ml_promote", run, "approve", "Approve", user="approver", params_input={"reason": "looks good"})
    assert wait_for_run(h, "cd4ml_promote", run, 300) == "success"
    assert _aliases(prod) == {"champion": candidate}
    last = _audit(prod)[-1]
    assert (last.action, last.from_version, last.to_version, last.actor) == ("promote", None, candidate, "approver")
    assert last.approval["decision"] == "approved" and last.approval["reason"] == "looks good"
    assert last.airflow_run_id == run and last.gate_report.endswith(".json")

    status = json.loads(_cd4ml(["status"], {**env, "CD4ML_ENV": "prod"}))["environments"]
    assert status["sit"]["champion"]["version"] == sit_champion
    assert status["uat"]["champion"]["version"] == uat_champion
    assert status["prod"]["champion"]["version"] == candidate
    assert status["prod"]["champion"]["copied_from"] == f"models:/{uat.registry.model_name}/{uat_champion}"
    assert status["prod"]["champion"]["since"]["approval"]["by"] == "approver"
    lineage = _cd4ml(["lineage", f"models:/{prod.registry.model_name}@champion"], env)
    assert lineage.count("copied from:") == 2  # prod <- uat <- sit, where it was trained
    assert "training_sample" in lineage and "raw:" in lineage and "approval approved by approver" in lineage
    audit_text = _cd4ml(["audit", "--env", "prod"], env)
    assert "rejected" in audit_text and "timeout" in audit_text and "promote" in audit_text


def test_deploy_code_prod_trains_on_all_data_and_waits_for_approval_then_rollback(world, prod_services) -> None:
    from tasks.data import lake

    env = {**world["cli_env"], "CD4ML_ENV": "prod"}
    sit, prod = _settings(world, "sit", "code"), _settings(world, "prod", "code")
    before = _aliases(prod).get("champion")

    h = prod_services("code")
    h.wait_for_dag("cd4ml_train")
    h.unpause("cd4ml_train")
    curated = lake.current_version(prod.curated_table)
    run = trigger(h, "cd4ml_train", {"curated_version": curated})
    _await_approval(h, "cd4ml_train", run)
    aliases = _aliases(prod)
    candidate = aliases["challenger"]
    assert aliases.get("champion") == before  # challenger now; champion only after the approval
    answer_hitl(h, "cd4ml_train", run, "approve", "Approve", user="approver")
    assert wait_for_run(h, "cd4ml_train", run, 300) == "success"
    assert _aliases(prod)["champion"] == candidate

    from tasks.models.registry import mlflow_client

    client = mlflow_client(prod)
    prod_tags = client.get_model_version(prod.registry.model_name, str(candidate)).tags
    sit_tags = client.get_model_version(sit.registry.model_name, str(_aliases(sit)["champion"])).tags
    assert prod_tags["cd4ml.curated_table"] == prod.curated_table  # all of prod's data
    assert "cd4ml.sample" not in prod_tags
    assert sit_tags["cd4ml.curated_table"] == sit.sample_table and sit_tags["cd4ml.sample"].startswith("sample-50pct")
    sit_rows = lake.open_table(sit.sample_table, int(sit_tags["cd4ml.curated_version"])).count()
    assert sit_rows < 0.6 * lake.open_table(prod.curated_table, curated).count()

    # Rollback from the command line: prod requires approval, so the command triggers cd4ml_rollback through
    # the API server as the signed-in user (credentials from the environment), and the ledger names that user.
    h.wait_for_dag("cd4ml_rollback")
    h.unpause("cd4ml_rollback")
    cli = {**env, "CD4ML_AIRFLOW_URL": h.base_url, "CD4ML_AIRFLOW_USERNAME": "other", "CD4ML_AIRFLOW_PASSWORD": "other-pw"}
    command = ["rollback", "--env", "prod", "--reason", "latency regression seen in canary"]
    typed = subprocess.run([str(Path(sys.executable).parent / "cd4ml"), *command, "--by", "ceo@example.com"], env=cli,
                           capture_output=True, text=True, timeout=300)
    assert typed.returncode == 1 and _aliases(prod)["champion"] == candidate  # a typed actor is refused
    run = json.loads(_cd4ml(command, cli))["dag_run_id"]
    if before is None:  # this test alone: no earlier champion, so the rollback is a clear error, nothing moves
        assert wait_for_run(h, "cd4ml_rollback", run, 300) == "failed"
        assert _aliases(prod)["champion"] == candidate
        return
    assert wait_for_run(h, "cd4ml_rollback", run, 300) == "success"
    assert _aliases(prod)["champion"] == before
    again = json.loads(_cd4ml(command, cli))["dag_run_id"]  # saying it twice changes nothing
    assert wait_for_run(h, "cd4ml_rollback", again, 300) == "success"
    rows = _audit(prod)
    assert [(r.action, r.from_version, r.to_version) for r in rows][-2:] == [("promote", before, candidate),
                                                                              ("rollback", candidate, before)]
    assert (rows[-1].actor, rows[-1].airflow_run_id) == ("other", run)  # the signed-in user, as Airflow recorded it
    assert "latency regression" in client.get_model_version(prod.registry.model_name, str(candidate)).tags[
        "cd4ml.rolled_back"]
