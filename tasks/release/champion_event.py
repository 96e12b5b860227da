"""The announcement of a new champion to the downstream deployment (docs/release.md, "The hand-off as an event").

When ``promote`` or ``rollback`` moved this environment's champion, ``announce`` sends one small JSON
message to the hop's queue (``release.publish``): environment, model name, version, the registry it
lives in (without credentials) and the ledger row (seq, time). The sending itself is handed in
(``send``: the Airflow side's RedisHook, plugins/cd4ml_airflow/champion_queue.py), so this module
stays free of Airflow. A message that cannot be sent never undoes the promotion: the ledger row and
the alias stand, on-call hears of it, and the downstream's scheduled reconcile imports the champion
anyway (a lost message only delays the release). The downstream parses the message with
``tasks.release.release.upstream_version``: bounded, never echoed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from tasks.release.model_import import public_uri
from tasks.release.release import MAX_EVENT_CHARS, ReleaseResult
from tasks.settings import Settings

log = logging.getLogger(__name__)

Send = Callable[[str], Any]
"""Sends one message to the configured queue; raises when it cannot."""


def champion_message(settings: Settings, result: ReleaseResult) -> str:
    """The announcement of ``result``'s new champion: compact JSON, at most MAX_EVENT_CHARS characters."""
    message = json.dumps({
        "env": settings.env,
        "model_name": result.model_name,
        "version": result.to_version,
        "action": result.action,
        "registry": public_uri(settings.tracking_uri),
        "ledger_seq": result.audit_seq,
        "ledger_at": result.audit_at,
    }, separators=(",", ":"), sort_keys=True)
    if len(message) > MAX_EVENT_CHARS:  # a registry path that long: the downstream would ignore the message
        raise ValueError(f"the champion announcement is {len(message)} characters, over {MAX_EVENT_CHARS}")
    return message


def announce(settings: Settings, result: ReleaseResult, send: Send) -> bool:
    """Send the announcement of a champion that moved; True when sent, False when there was nothing to send or it failed.

    A failure is logged and alerted, never raised: the promotion it announces is already recorded."""
    queue = settings.release.publish
    if queue is None or not result.changed or result.to_version is None:
        return False
    try:
        send(champion_message(settings, result))
    except Exception as exc:  # any failure of the queue: the promotion stands, the reconcile recovers
        log.warning("champion v%s of %s not announced on %s: %s", result.to_version, settings.env, queue.channel,
                    type(exc).__name__)
        _alert_unsent(settings, result, type(exc).__name__)
        return False
    log.info("champion v%s of %s announced on %s", result.to_version, settings.env, queue.channel)
    return True


def _alert_unsent(settings: Settings, result: ReleaseResult, error: str) -> None:
    from tasks.alerting.alert import Alert
    from tasks.alerting.delivery import send

    queue = settings.release.publish
    channel = queue.channel if queue is not None else ""
    send(Alert(summary=f"{result.model_name} v{result.to_version} is champion in {settings.env} but was not announced "
               f"on {channel} ({error}): the downstream's cd4ml_reconcile imports it on its next run",
               severity="warning", source="release", env=settings.env,
               dedup_key=f"{settings.env}:announce-failed:{result.model_name}:{result.audit_seq}",
               details={"channel": channel, "error": error, "audit_seq": result.audit_seq}, kind="announce_failed",
               error=error, versions={"model_name": result.model_name, "to_version": result.to_version}), settings)


__all__ = ["Send", "announce", "champion_message"]
