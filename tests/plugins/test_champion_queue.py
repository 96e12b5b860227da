"""The release hand-off as an event, on the real Redis of this machine (127.0.0.1:6379), a channel per test.

The upstream side announces a promotion through Airflow's RedisHook; the downstream side is the
common-messaging provider's MessageQueueTrigger, whose async ``run()`` the test drives as Airflow's
triggerer would, turning what it yields into the Asset event extra the triggerer stores
(``{"from_trigger": True, "payload": event.payload}``, airflow/models/trigger.py). The registries are
the two real MLflow stores of tests/tasks/release/test_model_import.py (sit's real champion, uat's own).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import pytest

from cd4ml_airflow.champion_queue import announce_champion, message_trigger, redis_sender, upstream_event_asset
from tests.factories.digits import write_curated_digits
from tests.tasks.release.test_model_import import downstream_of

CONN_ID = "cd4ml_test_queue"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from tests.factories.champion import champion_home

    return champion_home(str(tmp_path_factory.mktemp("event-upstream")))


@pytest.fixture
def redis_client(monkeypatch: pytest.MonkeyPatch):
    import redis

    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                       json.dumps({"conn_type": "redis", "host": "127.0.0.1", "port": 6379, "extra": {"db": 0}}))
    client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=3)
    client.ping()  # the machine's Redis: a test that cannot reach it fails, it does not skip
    return client


@pytest.fixture
def queue(redis_client):
    from tasks.settings import MessageQueueSettings

    return MessageQueueSettings(channel=f"cd4ml-test-{uuid.uuid4().hex[:12]}", conn_id=CONN_ID, poll_interval_s=0.05)


def _with(settings: Any, **release: Any) -> Any:
    return settings.model_copy(update={"release": settings.release.model_copy(update=release)})


class Listener:
    """The downstream's trigger running as the triggerer runs it; ``event()`` is the Asset event extra it produced."""

    def __init__(self, queue: Any, client: Any) -> None:
        self.queue, self.client = queue, client

    async def __aenter__(self) -> "Listener":
        self.task = asyncio.create_task(anext(message_trigger(self.queue).run()))
        for _ in range(200):  # until the trigger has subscribed: pub/sub delivers only to who listens
            if dict(self.client.pubsub_numsub(self.queue.channel)).get(self.queue.channel.encode()):
                return self
            await asyncio.sleep(0.05)
        raise AssertionError("the trigger never subscribed")

    async def event(self, timeout: float = 10.0) -> dict:
        event = await asyncio.wait_for(self.task, timeout)
        return {"from_trigger": True, "payload": event.payload}

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _uat_deployment(home: Any, sit: Any, queue: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """uat's own deployment as its Airflow worker loads it: CD4ML_HOME, CD4ML_ENV and a conf folder announcing on ``queue``."""
    import shutil

    import yaml

    from tasks.settings import REPO_ROOT, load_settings

    conf = home / "conf"
    shutil.copytree(REPO_ROOT / "conf", conf)
    uat = yaml.safe_load((conf / "uat.yaml").read_text())
    uat["release"] = {"pattern": "deploy_model", "upstream": "sit", "upstream_registry": {"tracking_uri": sit.tracking_uri},
                      "publish": {"channel": queue.channel, "conn_id": queue.conn_id}}
    uat["gate"] = {**uat.get("gate", {}), "smoke_test": False}
    (conf / "uat.yaml").write_text(yaml.safe_dump(uat))
    for key, value in {"CD4ML_HOME": str(home), "CD4ML_ENV": "uat", "CD4ML_CONF_DIR": str(conf)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return load_settings()


def test_the_promote_task_announces_and_the_trigger_yields_the_version_to_import(upstream, cd4ml_home, queue,
                                                                                redis_client, monkeypatch) -> None:
    from types import SimpleNamespace

    from cd4ml_airflow.assets import CHAMPION_MODEL
    from cd4ml_airflow.release import promote as promote_task
    from tasks.release.evaluate import evaluate
    from tasks.release.model_import import import_model
    from tasks.release.release import mark_challenger, upstream_version

    sit, _ = upstream
    uat = _uat_deployment(cd4ml_home / "uat-deployment", sit, queue, monkeypatch)
    imported = import_model(uat)
    gate = evaluate(uat, imported.version, uat.curated_table, write_curated_digits(uat.curated_table, raw_version=2))
    assert gate.passed, gate.reasons
    mark_challenger(uat, imported.version, gate, run_id="event-test")

    def run_promote() -> dict:  # the task body as the worker runs it: settings from the environment, the real RedisHook
        events = {CHAMPION_MODEL: SimpleNamespace(extra=None)}
        return promote_task.function(gate.to_dict(), {}, params={}, run_id="event-test", outlet_events=events,
                                     dag_run=SimpleNamespace(triggering_user_name=None))

    async def scenario() -> tuple[dict, dict]:
        async with Listener(queue, redis_client) as prod_side:
            return run_promote(), await prod_side.event()

    result, extra = asyncio.run(scenario())
    assert result["changed"] and result["to_version"] == imported.version
    assert upstream_version([extra]) == imported.version  # what prod's copy_candidate reads from the event
    message = json.loads(extra["payload"]["data"])
    assert extra["payload"]["channel"] == queue.channel
    assert message == {"env": "uat", "model_name": uat.registry.model_name, "version": imported.version,
                       "action": "promote", "registry": uat.tracking_uri, "ledger_seq": result["audit_seq"],
                       "ledger_at": result["audit_at"]}
    assert result["audit_seq"] is not None and result["audit_at"].startswith("20")

    watcher = redis_client.pubsub()  # a plain subscriber: a cancelled trigger may stay subscribed a while
    watcher.subscribe(queue.channel)
    assert watcher.get_message(timeout=1.0)["type"] == "subscribe"
    again = run_promote()  # a retried task: nothing moved, nothing announced
    assert again["changed"] is False and watcher.get_message(timeout=1.0) is None
    watcher.close()


def test_the_rollback_task_announces_the_version_it_restored(upstream, cd4ml_home, queue, redis_client,
                                                            monkeypatch) -> None:
    from types import SimpleNamespace

    from cd4ml_airflow.assets import CHAMPION_MODEL
    from cd4ml_airflow.steps.rollback import rollback as rollback_task
    from tasks.release.evaluate import evaluate
    from tasks.release.model_import import import_model
    from tasks.release.release import mark_challenger, promote, upstream_version
    from tests.tasks.release.test_model_import import _hand_registered, _lineage_tags

    sit, model = upstream
    uat = _uat_deployment(cd4ml_home / "uat-deployment", sit, queue, monkeypatch)
    curated = write_curated_digits(uat.curated_table, raw_version=2)
    second, _ = _hand_registered(sit, model, _lineage_tags(sit, model), manifest=True)  # another upstream version
    for source in (model.version, second):  # uat's champion v1, then v2
        imported = import_model(uat, source)
        gate = evaluate(uat, imported.version, uat.curated_table, curated)
        assert gate.passed, gate.reasons
        mark_challenger(uat, imported.version, gate, run_id=f"event-test-{source}")
        promote(uat, imported.version, gate, run_id=f"event-test-{source}", actor="tests")

    async def scenario() -> tuple[dict, dict]:
        async with Listener(queue, redis_client) as prod_side:
            events = {CHAMPION_MODEL: SimpleNamespace(extra=None)}
            result = rollback_task.function(params={"reason": "v2 misbehaves", "to_version": None}, run_id="rb",
                                            outlet_events=events, dag=SimpleNamespace(dag_id="cd4ml_rollback"),
                                            dag_run=SimpleNamespace(triggering_user_name="oncall"))
            return result, await prod_side.event()

    result, extra = asyncio.run(scenario())
    assert (result["from_version"], result["to_version"], result["changed"]) == (2, 1, True)
    message = json.loads(extra["payload"]["data"])
    assert (message["action"], message["version"], message["ledger_seq"]) == ("rollback", 1, result["audit_seq"])
    assert upstream_version([extra]) == 1


def test_the_announcement_names_the_registry_without_credentials(settings, monkeypatch) -> None:
    from tasks.release.champion_event import champion_message
    from tasks.release.release import ReleaseResult

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://mlflow:pg-secret@db.sit.internal:5432/mlflow?sslmode=require")
    result = ReleaseResult("sit", "digits-classifier-sit", "rollback", "champion", 3, 2, True, 7, "m", "2026-11-25T22:00:00")
    message = champion_message(settings, result)
    assert "pg-secret" not in message and "mlflow:" not in message.replace("mlflow\"", "")
    assert json.loads(message)["registry"] == "postgresql://db.sit.internal:5432/mlflow"
    assert json.loads(message)["version"] == 2 and json.loads(message)["ledger_seq"] == 7


def test_a_message_nobody_hears_is_lost_and_the_reconcile_imports_it_once(upstream, cd4ml_home, queue,
                                                                       redis_client) -> None:
    from tasks.release import audit
    from tasks.release.champion_event import champion_message
    from tasks.release.model_import import import_model, pending_import
    from tasks.release.release import ReleaseResult, upstream_version

    sit, model = upstream
    uat = _with(downstream_of(cd4ml_home / "uat-deployment", sit.tracking_uri), upstream_event=queue)
    row = audit.read(sit)[-1]  # sit's promotion of its champion
    result = ReleaseResult("sit", row.model_name, row.action, row.alias, row.from_version, row.to_version, True, row.seq,
                           "", row.at)
    assert redis_sender(queue.conn_id, queue.channel)(champion_message(sit, result)) == 0  # uat's consumer is down

    async def nothing_arrives() -> None:
        async with Listener(queue, redis_client) as uat_side:
            with pytest.raises(TimeoutError):
                await uat_side.event(timeout=1.0)

    asyncio.run(nothing_arrives())  # pub/sub keeps nothing: the message is gone for good
    assert pending_import(uat) == model.version  # the reconcile sees the upstream champion without a gated import
    first = import_model(uat, pending_import(uat))  # the cd4ml_promote run it starts
    late = {"from_trigger": True, "payload": {"type": "message", "channel": queue.channel,
                                              "data": champion_message(sit, result)}}
    again = import_model(uat, upstream_version([late]))  # the same event, delivered after all
    assert (first.reused, again.reused, again.version) == (False, True, first.version)
    assert len(uat_versions(uat)) == 1


def uat_versions(settings: Any) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    return client.search_model_versions(f"name = '{settings.registry.model_name}'")


def test_a_malformed_or_oversized_message_is_rejected_without_echo(queue, redis_client, caplog) -> None:
    from tasks.release.release import MAX_EVENT_CHARS, upstream_version

    secret = "hostile-" + uuid.uuid4().hex
    bad = [f"not json {secret}", json.dumps([secret, 3]),
           json.dumps({"version": 4, "pad": secret + "x" * MAX_EVENT_CHARS}), json.dumps({"version": secret})]

    async def deliver(message: str, channel: str) -> dict:
        listening = queue.model_copy(update={"channel": channel})  # a cancelled trigger stays subscribed a while
        async with Listener(listening, redis_client) as listener:
            assert redis_client.publish(channel, message) == 1
            return await listener.event()

    with caplog.at_level(logging.WARNING, logger="tasks.release.release"):
        extras = [asyncio.run(deliver(message, f"{queue.channel}-{i}")) for i, message in enumerate(bad)]
        assert [upstream_version([extra]) for extra in extras] == [None] * len(bad)
    reasons = [r.getMessage() for r in caplog.records if r.name == "tasks.release.release"]
    assert reasons == ["an upstream champion message was ignored: not JSON",
                       "an upstream champion message was ignored: not a JSON object",
                       f"an upstream champion message was ignored: longer than {MAX_EVENT_CHARS} characters"]
    assert secret not in caplog.text


def test_a_queue_that_cannot_be_reached_leaves_the_promotion_and_alerts_once(settings, monkeypatch, caplog) -> None:
    from tasks.alerting.incidents import open_incidents
    from tasks.release.release import ReleaseResult
    from tasks.settings import MessageQueueSettings

    monkeypatch.setenv("AIRFLOW_CONN_CD4ML_DEAD_QUEUE", json.dumps({"conn_type": "redis", "host": "127.0.0.1", "port": 1}))
    sit = _with(settings, publish=MessageQueueSettings(channel="cd4ml-test-dead", conn_id="cd4ml_dead_queue"))
    result = ReleaseResult("sit", sit.registry.model_name, "promote", "champion", 1, 2, True, 5, "m", "2026-11-25T22:00:00")
    with caplog.at_level(logging.WARNING):
        assert announce_champion(sit, result) is False  # returned, not raised: the promote task succeeds
        assert announce_champion(sit, result) is False
    assert "not announced on cd4ml-test-dead: ConnectionError" in caplog.text
    alerts = [i for i in open_incidents(sit) if i.kind == "announce_failed"]
    assert len(alerts) == 1 and alerts[0].dedup_key == f"sit:announce-failed:{sit.registry.model_name}:5"
    nothing = ReleaseResult("sit", sit.registry.model_name, "promote", "champion", 2, 2, False, None, "m")
    assert announce_champion(sit, nothing) is False and announce_champion(_with(sit, publish=None), result) is False


def test_the_upstream_event_asset_watches_the_queue_only_for_deploy_model_with_an_upstream_event(settings, queue) -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    assert upstream_event_asset(settings) is None  # deploy_code
    uat = _with(settings, pattern="deploy_model", upstream="sit")
    assert upstream_event_asset(uat) is None  # no queue: the in-deployment champion Asset is the hand-off
    asset = upstream_event_asset(_with(uat, upstream_event=queue))
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, MessageQueueTrigger)
    assert watcher.trigger.serialize() == (
        "airflow.providers.redis.triggers.redis_await_message.AwaitMessageTrigger",
        {"channels": [queue.channel], "redis_conn_id": CONN_ID, "poll_interval": 0.05})
