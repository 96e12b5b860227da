"""The release hand-off's queue, Airflow side: the upstream announces its champion, the downstream listens.

* ``announce_champion(settings, result)``: the promote and rollback tasks call it after the champion
  moved; the message and the failure policy are ``tasks.release.champion_event``'s, the sending is
  the queue's scheme's: Airflow's RedisHook (``redis+pubsub``) or boto3's ``send_message`` through the
  amazon provider's SqsHook (``sqs``), on the Connection ``release.publish.conn_id``.
* ``upstream_event_asset(settings)``: deploy_model's Asset with an AssetWatcher on the common-messaging
  provider's MessageQueueTrigger (``release.upstream_event``): Airflow's triggerer listens on the
  queue, and what it receives becomes an Asset event whose extra is
  ``{"from_trigger": true, "payload": {"type": "message", "channel": ..., "data": "<the JSON>"}}`` (Redis)
  or ``{"from_trigger": true, "payload": {"status": "success", "message_batch": [{"Body": "<the JSON>", ...}]}}``
  (SQS), which ``tasks.release.release.upstream_version`` reads (bounded, never echoed).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetWatcher


def redis_sender(conn_id: str, channel: str):
    """A ``send(message)`` that publishes on ``channel`` through the Connection ``conn_id``; returns the listeners reached."""

    def send(message: str) -> int:
        from airflow.providers.redis.hooks.redis import RedisHook

        return RedisHook(redis_conn_id=conn_id).get_conn().publish(channel, message)

    return send


def sqs_sender(conn_id: str, queue_url: str):
    """A ``send(message)`` that sends to the SQS queue ``queue_url`` with boto3, as the aws Connection ``conn_id``
    (the default AWS credential chain, e.g. the pod's role, when no such Connection is defined); returns the message id."""

    def send(message: str) -> str:
        from airflow.providers.amazon.aws.hooks.sqs import SqsHook

        return SqsHook(aws_conn_id=conn_id).get_conn().send_message(QueueUrl=queue_url, MessageBody=message)["MessageId"]

    return send


def sender(queue):
    """The ``send(message)`` of ``queue`` (a ``MessageQueueSettings``): its scheme decides."""
    if queue.scheme == "sqs":
        return sqs_sender(queue.conn_id, queue.queue_url)
    return redis_sender(queue.conn_id, queue.channel)


def announce_champion(settings, result) -> bool:
    """Announce ``result``'s new champion on ``release.publish`` (no-op when unset or nothing moved)."""
    from tasks.release.champion_event import announce

    queue = settings.release.publish
    if queue is None:
        return False
    return announce(settings, result, sender(queue))


def message_trigger(queue) -> Any:
    """The MessageQueueTrigger listening on ``queue`` (a ``MessageQueueSettings``); its scheme picks the provider's trigger.

    sqs: the amazon provider's SqsSensorTrigger, which deletes what it received and polls every
    ``poll_interval_s`` (``waiter_delay``) with one-second long polls.
    """
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    if queue.scheme == "sqs":
        return MessageQueueTrigger(scheme="sqs", sqs_queue=queue.queue_url, aws_conn_id=queue.conn_id,
                                   waiter_delay=queue.poll_interval_s)
    return MessageQueueTrigger(scheme=queue.scheme, channels=[queue.channel], redis_conn_id=queue.conn_id,
                               poll_interval=queue.poll_interval_s)


def upstream_event_asset(settings) -> Asset | None:
    """deploy_model with ``release.upstream_event``: the upstream's announcements as a watched Asset; else None."""
    queue = settings.release.upstream_event
    if settings.release.pattern != "deploy_model" or queue is None:
        return None
    name = f"cd4ml_{settings.env}_upstream_champion_event"
    return Asset(name=name, uri=f"cd4ml-queue://{settings.release.upstream}/{queue.channel}",
                 watchers=[AssetWatcher(name=f"{name}_watcher", trigger=message_trigger(queue))])
