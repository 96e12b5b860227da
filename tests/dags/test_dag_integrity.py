"""Every DAG file imports cleanly, imports nothing heavy at parse time, and follows the house rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.dags.conftest import DAGS

HEAVY = ("torch", "alibi_detect", "fastdup", "great_expectations", "mlflow", "deltalake")
DAG_FILES = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
RELEASE_TAIL = {
    "evaluate_gate": {"mark_challenger", "promote", "finish"},
    "mark_challenger": {"promote"},
    "promote": {"finish", "release_failed"},
    "finish": set(),
    "inputs_failed": set(),
    "release_failed": set(),
}
EXPECTED = {
    "cd4ml_ingest": {"ingest": {"validate"}, "validate": set()},
    "cd4ml_curate": {"curate": set()},
    "cd4ml_train": {
        "resolve_input": {"drift_check", "create_study", "tune_trial", "train", "evaluate_gate", "inputs_failed"},
        "drift_check": {"train", "register", "retrain_gate"},
        "retrain_gate": {"train", "create_study"},
        "create_study": {"trial_indices", "tune_trial", "best_params"},
        "trial_indices": {"tune_trial"},
        "tune_trial": {"best_params"},
        "best_params": {"train"},
        "train": {"register"},
        "register": {"evaluate_gate", "inputs_failed"},
        **RELEASE_TAIL,
    },
    "cd4ml_promote": {"copy_candidate": {"evaluate_gate", "inputs_failed"}, "test_data": {"evaluate_gate", "inputs_failed"},
                      **RELEASE_TAIL},
    "cd4ml_rollback": {"rollback": set()},
    "cd4ml_accept_class": {"accept_class": set()},
    "cd4ml_reconcile": {"pending_import": {"import_needed", "trigger_promote"}, "import_needed": {"trigger_promote"},
                        "trigger_promote": set()},
    "cd4ml_score": {"score": set()},
    "cd4ml_monitor": {"load_feedback": {"monitor"}, "monitor": {"retrain_gate", "request_retrain"},
                      "retrain_gate": {"request_retrain"}, "request_retrain": set()},
}
# prod (release.approval: required): a person decides between the challenger and the champion.
APPROVAL_TAIL = {
    "evaluate_gate": {"mark_challenger", "approval_request", "promote", "finish"},
    "mark_challenger": {"approval_request", "promote"},
    "approval_request": {"approve"},
    "approve": {"promote"},
    "promote": {"finish", "release_failed"},
    "finish": set(),
    "inputs_failed": set(),
    "release_failed": set(),
}


def test_there_are_dag_files():
    assert {p.stem for p in DAG_FILES} == set(EXPECTED)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_imports_nothing_heavy(path):
    code = (
        "import json, runpy, sys; runpy.run_path(sys.argv[1]); "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy == [], f"{path.name} imports {heavy} at module level; import them inside the task"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == set(EXPECTED)


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_house_rules(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert "cd4ml" in dag.tags and len(dag.tags) >= 2
    assert dag.doc_md and dag.doc_md.strip()
    assert dag.catchup is False
    assert dag.on_failure_callback, "DAG-level failure callback missing"
    for t in dag.tasks:
        assert t.retries >= 2, f"{dag_id}.{t.task_id} has retries={t.retries}"
        assert t.on_failure_callback, f"{dag_id}.{t.task_id} has no failure callback"


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_structure(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert {t.task_id: set(t.downstream_task_ids) for t in dag.tasks} == EXPECTED[dag_id]


def test_dags_chain_through_assets(dagbag):
    from cd4ml_airflow.assets import CHAMPION_MODEL, CURATED_IMAGES, PREDICTIONS, RAW_IMAGES, RETRAIN_REQUEST

    ingest, curate, train = (dagbag.dags[d] for d in ("cd4ml_ingest", "cd4ml_curate", "cd4ml_train"))
    assert CHAMPION_MODEL in dagbag.dags["cd4ml_rollback"].get_task("rollback").outlets
    assert CHAMPION_MODEL in dagbag.dags["cd4ml_promote"].get_task("promote").outlets
    assert RAW_IMAGES in ingest.get_task("validate").outlets
    assert CURATED_IMAGES in curate.get_task("curate").outlets
    assert CHAMPION_MODEL in train.get_task("promote").outlets
    assert list(curate.timetable.asset_condition.objects) == [RAW_IMAGES]
    assert list(train.timetable.asset_condition.objects) == [CURATED_IMAGES]
    # the monitor's retrain request runs the ingest (its labelled images are in the landing zone), daily runs go on
    assert ingest.timetable.asset_condition == RETRAIN_REQUEST
    assert type(ingest.timetable.timetable).__name__ == "CronTriggerTimetable"
    assert RETRAIN_REQUEST in dagbag.dags["cd4ml_monitor"].get_task("request_retrain").outlets
    assert PREDICTIONS in dagbag.dags["cd4ml_score"].get_task("score").outlets


def test_prod_waits_for_a_person_and_deploy_model_follows_the_upstream_champion(tmp_path):
    """prod: an ApprovalOperator before promote; deploy_model: cd4ml_promote scheduled on uat's champion Asset."""
    from tasks.settings import REPO_ROOT

    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("base.yaml", "sit.yaml", "uat.yaml"):
        (conf / name).write_text((REPO_ROOT / "conf" / name).read_text())
    prod = (REPO_ROOT / "conf" / "prod.yaml").read_text()
    assert "\n  approval: required" in prod
    (conf / "prod.yaml").write_text(prod.replace("\n  approval: required", "\n  approval: required\n  pattern: deploy_model\n  upstream: uat"))
    code = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
out = {}
for dag_id in ("cd4ml_train", "cd4ml_promote"):
    dag = bag.dags[dag_id]
    out[dag_id] = {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}
approve = bag.dags["cd4ml_promote"].get_task("approve")
out["approve"] = {"type": type(approve).__name__, "options": approve.options, "defaults": approve.defaults,
                  "timeout_h": approve.response_timeout.total_seconds() / 3600, "notifiers": len(approve.notifiers),
                  "params": sorted(approve.params.keys())}
out["schedule"] = [a.name for a in bag.dags["cd4ml_promote"].timetable.asset_condition.objects]
out["reconcile"] = bag.dags["cd4ml_reconcile"].timetable.expression
trigger = bag.dags["cd4ml_reconcile"].get_task("trigger_promote")
out["trigger"] = [trigger.trigger_dag_id, sorted(trigger.conf)]
print(json.dumps(out))
"""
    env = {**os.environ, "CD4ML_ENV": "prod", "CD4ML_CONF_DIR": str(conf)}
    proc = subprocess.run([sys.executable, "-c", code, str(DAGS)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    for dag_id in ("cd4ml_train", "cd4ml_promote"):
        tail = {k: sorted(v) for k, v in APPROVAL_TAIL.items()}
        assert {k: v for k, v in info[dag_id].items() if k in tail} == tail, dag_id
    assert info["approve"] == {"type": "ReleaseApprovalOperator", "options": ["Approve", "Reject"], "defaults": ["Reject"],
                               "timeout_h": 72.0, "notifiers": 1, "params": ["reason"]}
    assert info["schedule"] == ["cd4ml_uat_champion_model"]
    assert info["reconcile"] == "0 * * * *" and info["trigger"] == ["cd4ml_promote", ["source_version"]]


def test_kubernetes_launcher_runs_training_in_a_pod(tmp_path):
    """training.launcher: kubernetes swaps the train task for a KubernetesPodOperator of the trainer image."""
    from tasks.settings import REPO_ROOT

    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("base.yaml", "uat.yaml"):
        (conf / name).write_text((REPO_ROOT / "conf" / name).read_text())
    (conf / "prod.yaml").write_text(
        (REPO_ROOT / "conf" / "prod.yaml").read_text()
        + "\ntraining:\n  launcher: kubernetes\n  kubernetes: {image: registry.example/cd4ml-trainer:1.2, gpus: 2}\n"
    )
    code = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
dag = bag.dags["cd4ml_train"]
pod, train = dag.get_task("trainer_pod"), dag.get_task("train")
print(json.dumps({"type": type(train).__name__, "image": train.image, "upstream": sorted(train.upstream_task_ids),
    "downstream": sorted(train.downstream_task_ids), "gpus": train.container_resources.limits.get("nvidia.com/gpu"),
    "mount": train.volume_mounts[0].mount_path, "secret": [s.deploy_target for s in train.secrets],
    "xcom": train.do_xcom_push, "native": dag.render_template_as_native_obj}))
"""
    env = {**os.environ, "CD4ML_ENV": "prod", "CD4ML_CONF_DIR": str(conf)}
    proc = subprocess.run([sys.executable, "-c", code, str(DAGS / "cd4ml_train.py")], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info == {
        "type": "KubernetesPodOperator", "image": "registry.example/cd4ml-trainer:1.2",
        "upstream": ["trainer_pod"], "downstream": ["register"], "gpus": "2",
        "mount": "/data/cd4ml", "secret": ["MLFLOW_TRACKING_URI"], "xcom": True, "native": True,
    }


SQS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/cd4ml-sit-to-uat-champion"
UPSTREAM_EVENTS = {
    "redis+pubsub": ("{channel: cd4ml-sit-to-uat, conn_id: cd4ml_queue_sit_uat}", "cd4ml-sit-to-uat",
                     "airflow.providers.redis.triggers.redis_await_message.AwaitMessageTrigger",
                     {"channels": ["cd4ml-sit-to-uat"], "redis_conn_id": "cd4ml_queue_sit_uat", "poll_interval": 5.0}),
    "sqs": (f"{{scheme: sqs, channel: cd4ml-sit-to-uat-champion, queue_url: '{SQS_URL}', conn_id: aws_default}}",
            "cd4ml-sit-to-uat-champion", "airflow.providers.amazon.aws.triggers.sqs.SqsSensorTrigger",
            {"sqs_queue": SQS_URL, "aws_conn_id": "aws_default", "waiter_delay": 5.0, "delete_message_on_reception": True}),
}


@pytest.mark.parametrize("scheme", sorted(UPSTREAM_EVENTS))
def test_deploy_model_with_an_upstream_event_runs_on_a_watched_queue_asset(tmp_path, scheme):
    """release.upstream_event: cd4ml_promote is scheduled on an Asset whose AssetWatcher is the MessageQueueTrigger
    on the hop's queue (its scheme's trigger), and the DAG serializes as the DAG processor stores it (the triggerer's input)."""
    from tasks.settings import REPO_ROOT

    event, channel, trigger, kwargs = UPSTREAM_EVENTS[scheme]
    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("base.yaml", "sit.yaml", "prod.yaml"):
        (conf / name).write_text((REPO_ROOT / "conf" / name).read_text())
    (conf / "uat.yaml").write_text((REPO_ROOT / "conf" / "uat.yaml").read_text() + (
        f"\nrelease:\n  pattern: deploy_model\n  upstream: sit\n  upstream_event: {event}\n"))
    code = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
dag = bag.dags["cd4ml_promote"]
(asset,) = dag.timetable.asset_condition.objects
serialized = json.dumps(DagSerialization.to_dict(dag))
print(json.dumps({"asset": [asset.name, asset.uri], "watchers": [[w.name, w.trigger.serialize()] for w in asset.watchers],
                  "serialized": sys.argv[2].rsplit(".", 1)[-1] in serialized and sys.argv[3] in serialized,
                  "reconcile": bag.dags["cd4ml_reconcile"].timetable.expression}))
"""
    env = {**os.environ, "CD4ML_ENV": "uat", "CD4ML_CONF_DIR": str(conf)}
    proc = subprocess.run([sys.executable, "-c", code, str(DAGS), trigger, channel if scheme != "sqs" else SQS_URL],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["asset"] == ["cd4ml_uat_upstream_champion_event", f"cd4ml-queue://sit/{channel}"]
    ((name, (path, args)),) = info["watchers"]
    assert (name, path) == ("cd4ml_uat_upstream_champion_event_watcher", trigger)
    assert {k: args[k] for k in kwargs} == kwargs and (scheme == "sqs" or args == kwargs)
    assert info["serialized"] and info["reconcile"] == "0 * * * *"  # the reconcile stays: a lost message only delays
