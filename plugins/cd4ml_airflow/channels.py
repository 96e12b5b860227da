"""Alert channels through Airflow's own provider notifiers: Slack webhook, PagerDuty Events API v2, SMTP.

``install()`` hands ``CHANNELS`` to ``tasks.alerting.channels`` (this package's ``__init__`` calls it), and
``tasks.alerting.delivery`` calls ``channel(alert, settings, action)`` with ``action`` ``trigger`` or
``resolve``; retries, back-off and routing live there. Each
channel reads its endpoint and secret from the Airflow Connection named in settings
(``alerts.slack_conn_id`` ...; an ``AIRFLOW_CONN_<ID>`` environment variable works too) and
turns any failure into ``ChannelError`` with the connection's secrets cut out of the message,
or ``ChannelNotConfigured`` when the connection does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tasks.alerting import channels
from tasks.alerting.alert import Action, Alert, ChannelError, ChannelNotConfigured, message
from tasks.settings import Settings

PD_SEVERITY = {"info": "info", "warning": "warning", "critical": "critical"}


def _connection(conn_id: str):
    from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ChannelNotConfigured(f"Airflow connection {conn_id!r} is not defined") from None


def _secrets(conn) -> list[str]:
    """Every value of a connection that must never be shown: password, login, string extras."""
    values = [conn.password, conn.login, *(v for v in (conn.extra_dejson or {}).values() if isinstance(v, str))]
    return sorted({v.strip() for v in values if v and len(v.strip()) >= 4}, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


@contextmanager
def _failures_redacted(conn) -> Iterator[None]:
    """Any failure leaves as ChannelError, its message without the connection's secrets, its cause cut."""
    try:
        yield
    except ChannelNotConfigured:
        raise
    except Exception as exc:  # noqa: BLE001 - every provider, HTTP and SMTP error alike
        raise ChannelError(redact(f"{type(exc).__name__}: {exc}", _secrets(conn))[:500]) from None


def slack(alert: Alert, settings: Settings, action: Action) -> None:
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    conn = _connection(settings.alerts.slack_conn_id)
    text = message(alert, settings, action).markdown()
    with _failures_redacted(conn):
        SlackWebhookNotifier(slack_webhook_conn_id=settings.alerts.slack_conn_id, text=text,
                             timeout=settings.alerts.retry.timeout_s).notify({})


def pagerduty(alert: Alert, settings: Settings, action: Action) -> None:
    from airflow.providers.pagerduty.notifications.pagerduty import PagerdutyNotifier

    conn = _connection(settings.alerts.pagerduty_conn_id)
    msg = message(alert, settings, action)
    notifier = PagerdutyNotifier(
        summary=msg.title[:1024], severity=PD_SEVERITY[alert.severity], source=f"cd4ml-{alert.env}",
        action=action, dedup_key=alert.dedup_key, custom_details=dict(msg.facts), group=f"cd4ml-{alert.env}",
        component=alert.dag_id or alert.source, class_type=alert.kind,
        links=[{"href": url, "text": text} for text, url in msg.links if url.startswith("http")],
        pagerduty_events_conn_id=settings.alerts.pagerduty_conn_id,
    )
    # The provider's hook posts to events.pagerduty.com; the connection's host (an EU service
    # region, a proxy, a test peer) is honoured here, and the client's own retries are off
    # because tasks.alerting.delivery retries every channel alike.
    notifier.__dict__["hook"] = _events_hook(settings, conn)
    with _failures_redacted(conn):
        notifier.notify({})


def _events_hook(settings: Settings, conn) -> Any:
    import pagerduty as pd
    from airflow.providers.pagerduty.hooks.pagerduty_events import PagerdutyEventsHook, prepare_event_data

    base_url = None
    if conn.host:
        base_url = conn.host if "://" in conn.host else (
            f"https://{conn.host}" + (f":{conn.port}" if conn.port else ""))
    # extra ca_bundle: the CA that signs the endpoint's certificate (a proxy with an internal CA)
    verify = (conn.extra_dejson or {}).get("ca_bundle") or True
    timeout = settings.alerts.retry.timeout_s

    class EventsHook(PagerdutyEventsHook):
        def send_event(self, **event: Any) -> str:
            client = pd.EventsApiV2Client(self.integration_key, base_url=base_url, verify=verify)
            client.retry, client.max_network_attempts, client.timeout = {}, 0, timeout
            return client.send_event(**prepare_event_data(**event))

    with _failures_redacted(conn):
        return EventsHook(pagerduty_events_conn_id=settings.alerts.pagerduty_conn_id)


def email(alert: Alert, settings: Settings, action: Action) -> None:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    conn = _connection(settings.alerts.smtp_conn_id)
    msg = message(alert, settings, action)
    with _failures_redacted(conn):
        SmtpNotifier(to=list(settings.alerts.email_to), smtp_conn_id=settings.alerts.smtp_conn_id,
                     subject=msg.title, html_content=msg.html()).notify({})


CHANNELS: dict[str, channels.Channel] = {"slack": slack, "pagerduty": pagerduty, "email": email}


def install() -> None:
    """Make Slack, PagerDuty and email deliverable in this process (idempotent)."""
    channels.use_channels(CHANNELS)
