"""The release hand-off on SQS: both ends against a real SQS-compatible HTTP server (moto's ``moto_server``).

The server runs as its own process on a free 127.0.0.1 port; the aws Connection of each test names
it as ``endpoint_url`` (a deployment's Connection names none: boto3 then talks to AWS, as the pod's
role). The upstream side is the promote task's announcement, sent with boto3's ``send_message``
through the amazon provider's SqsHook; the downstream side is the common-messaging provider's
MessageQueueTrigger with ``scheme="sqs"`` (the amazon provider's SqsSensorTrigger, aiobotocore),
whose async ``run()`` the test drives as Airflow's triggerer would. SQS keeps what nobody has
received yet: unlike pub/sub, a message sent while the downstream is down waits for it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from cd4ml_airflow.champion_queue import announce_champion, message_trigger, sender, sqs_sender, upstream_event_asset
from tests.factories.moto_server import FAKE_KEY_ID, FAKE_SECRET

CONN_ID = "cd4ml_test_sqs"
REGION = "eu-west-1"
FAKE_KEY = {"login": FAKE_KEY_ID, "password": FAKE_SECRET}


@pytest.fixture
def queue(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch):
    """A fresh queue of its own and the aws Connection naming the server; yields its ``MessageQueueSettings``."""
    import boto3

    from tasks.settings import MessageQueueSettings

    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(
        {"conn_type": "aws", **FAKE_KEY, "extra": {"endpoint_url": moto_endpoint, "region_name": REGION}}))
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=FAKE_KEY["login"],
                          aws_secret_access_key=FAKE_KEY["password"])
    name = f"cd4ml-test-{uuid.uuid4().hex[:12]}"
    url = client.create_queue(QueueName=name)["QueueUrl"]
    return MessageQueueSettings(scheme="sqs", channel=name, queue_url=url, conn_id=CONN_ID, poll_interval_s=0.2)


def _with(settings: Any, **release: Any) -> Any:
    return settings.model_copy(update={"release": settings.release.model_copy(update=release)})


async def _next_event(queue: Any, timeout: float = 20.0) -> dict:
    """The Asset event extra the triggerer stores for the trigger's next event (airflow/models/trigger.py)."""
    trigger = message_trigger(queue)
    event = await asyncio.wait_for(anext(trigger.run()), timeout)
    return {"from_trigger": True, "payload": event.payload}


def _result(settings: Any, seq: int, version: int = 2) -> Any:
    from tasks.release.release import ReleaseResult

    return ReleaseResult(settings.env, settings.registry.model_name, "promote", "champion", version - 1, version, True,
                         seq, "m", "2026-11-26T01:00:00")


def test_an_announcement_sent_while_nobody_listens_waits_in_the_queue_and_the_trigger_yields_it(settings, queue) -> None:
    from tasks.release.release import upstream_version

    sit = _with(settings, publish=queue)
    assert announce_champion(sit, _result(sit, seq=7)) is True  # the consumer is not running yet
    extra = asyncio.run(_next_event(queue))
    assert extra["payload"]["status"] == "success" and len(extra["payload"]["message_batch"]) == 1
    message = json.loads(extra["payload"]["message_batch"][0]["Body"])
    assert (message["env"], message["version"], message["action"], message["ledger_seq"]) == ("sit", 2, "promote", 7)
    assert upstream_version([extra]) == 2  # what the downstream's copy_candidate reads from the event

    async def nothing_left() -> None:  # the trigger deleted what it received: the same message is not delivered twice
        with pytest.raises(TimeoutError):
            await _next_event(queue, timeout=2.0)

    asyncio.run(nothing_left())


def test_two_announcements_in_one_batch_name_the_last_version(settings, queue) -> None:
    from tasks.release.champion_event import champion_message
    from tasks.release.release import upstream_version

    sit = _with(settings, publish=queue)
    send = sender(queue)
    for seq, version in ((8, 3), (9, 4)):
        assert send(champion_message(sit, _result(sit, seq, version)))  # SQS's message id
    bodies: list[str] = []
    extras = []
    while len(bodies) < 2:  # SQS may hand them out in one batch or two
        extras.append(asyncio.run(_next_event(queue)))
        bodies += [m["Body"] for m in extras[-1]["payload"]["message_batch"]]
    assert sorted(json.loads(b)["version"] for b in bodies) == [3, 4]
    assert upstream_version(extras) in (3, 4)  # the last event that names one (SQS does not promise the order)


def test_a_hostile_message_on_the_queue_is_ignored_without_echo(settings, queue, caplog) -> None:
    import logging

    from tasks.release.release import MAX_EVENT_CHARS, upstream_version

    secret = "hostile-" + uuid.uuid4().hex
    send = sqs_sender(queue.conn_id, queue.queue_url)
    for body in (f"not json {secret}", json.dumps({"version": 4, "pad": secret + "x" * MAX_EVENT_CHARS})):
        send(body)
    with caplog.at_level(logging.WARNING, logger="tasks.release.release"):
        seen = 0
        while seen < 2:
            extra = asyncio.run(_next_event(queue))
            seen += len(extra["payload"]["message_batch"])
            assert upstream_version([extra]) is None
    assert secret not in caplog.text
    forged = {"from_trigger": True, "payload": {"status": "success", "message_batch": [{"Body": None}, "x", {}]}}
    assert upstream_version([forged]) is None


def test_a_queue_that_refuses_or_cannot_be_reached_leaves_the_promotion_and_alerts_once(settings, queue, monkeypatch,
                                                                                     caplog) -> None:
    import logging

    from tasks.alerting.incidents import open_incidents

    missing = queue.model_copy(update={"queue_url": queue.queue_url.rsplit("/", 1)[0] + "/no-such-queue"})
    sit = _with(settings, publish=missing)
    with caplog.at_level(logging.WARNING):
        assert announce_champion(sit, _result(sit, seq=11)) is False  # returned, not raised
        assert announce_champion(sit, _result(sit, seq=11)) is False
    assert "not announced on" in caplog.text and "QueueDoesNotExist" in caplog.text
    alerts = [i for i in open_incidents(sit) if i.kind == "announce_failed"]
    assert len(alerts) == 1 and alerts[0].dedup_key == f"sit:announce-failed:{sit.registry.model_name}:11"
    assert FAKE_KEY["password"] not in caplog.text


def test_the_sqs_settings_pick_the_sqs_trigger_and_refuse_a_queue_url_out_of_place(settings, queue) -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from tasks.settings import MessageQueueSettings

    uat = _with(settings, pattern="deploy_model", upstream="sit", upstream_event=queue)
    (watcher,) = upstream_event_asset(uat).watchers
    assert isinstance(watcher.trigger, MessageQueueTrigger)
    path, kwargs = watcher.trigger.serialize()
    assert path == "airflow.providers.amazon.aws.triggers.sqs.SqsSensorTrigger"
    assert (kwargs["sqs_queue"], kwargs["aws_conn_id"], kwargs["waiter_delay"]) == (queue.queue_url, CONN_ID, 0.2)
    assert kwargs["delete_message_on_reception"] is True
    for bad in ({"scheme": "sqs"}, {"queue_url": queue.queue_url},
                {"scheme": "sqs", "queue_url": "https://key:secret@sqs.eu-west-1.amazonaws.com/1/q"},
                {"scheme": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q?Action=DeleteQueue"}):
        with pytest.raises(ValueError):
            MessageQueueSettings(channel="q", **bad)
