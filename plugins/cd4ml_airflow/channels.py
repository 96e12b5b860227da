"""Alert channels through Airflow's own provider notifiers: Slack webhook, PagerDuty Events API v2, SMTP.

``install()`` hands ``CHANNELS`` to ``tasks.alerting.channels`` (this package's ``__init__`` calls it), and
``tasks.alerting.delivery`` calls ``channel(alert, settings, action)`` with ``action`` ``trigger`` or
``resolve``; retries, back-off and routing live there. Each
channel reads its endpoint and secret from the Airflow Connection named in settings
(``alerts.slack_conn_id`` ...; an ``AIRFLOW_CONN_<ID>`` environment variable works too) and
turns any failure into ``ChannelError`` with the connection's secrets cut out of the message,
or ``ChannelNotConfigured`` when the connection does not exist.

Secrets never reach a log: when a connection is read, its secrets are registered with Airflow's
secrets masker (``airflow.sdk.log.mask_secret``: task logs, in the task and its supervisor) and
with this process's log records (``redact_log_records``), because the clients log on their own:
slack_sdk writes the whole webhook URL, token included, on every retry of a refused connection,
through the logger Airflow's hook hands it (a structlog logger the masker does not see outside a
task), so the Slack client gets a logger of ours instead (``SLACK_CLIENT_LOGGER``); urllib3,
httpx and the pagerduty package log through standard loggers, whose records are redacted as they
are made, whatever their level, handlers or propagation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from tasks.alerting import channels
from tasks.alerting.alert import Action, Alert, ChannelError, ChannelNotConfigured, message
from tasks.settings import Settings

PD_SEVERITY = {"info": "info", "warning": "warning", "critical": "critical"}
SLACK_CLIENT_LOGGER = "cd4ml.channels.slack_sdk"
# Extras named like these hold credentials (a routing or integration key, a token, a webhook URL);
# the others are settings (from_email, ssl_context, timeout, ca_bundle) that logs may show.
_SECRET_EXTRA_WORDS = ("key", "token", "secret", "passw", "webhook", "url", "auth", "credential", "cookie")
# Replaced whole, never changed in place: a record made in another thread reads it while it grows.
_log_secrets: tuple[str, ...] = ()
_log_secrets_lock = threading.Lock()


def _connection(conn_id: str):
    from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ChannelNotConfigured(f"Airflow connection {conn_id!r} is not defined") from None
    register_secrets(_secrets(conn))
    return conn


def _secrets(conn) -> list[str]:
    """Every value of a connection that must never be shown: password, login, credential extras."""
    extras = [v for k, v in (conn.extra_dejson or {}).items()
              if isinstance(v, str) and any(word in k.lower() for word in _SECRET_EXTRA_WORDS)]
    values = [conn.password, conn.login, *extras]
    return sorted({v.strip() for v in values if v and len(v.strip()) >= 4}, key=len, reverse=True)


def redact(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """``secrets`` longest first: a longer secret goes before any part of it."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def register_secrets(secrets: list[str]) -> None:
    """Hide these values from every log of this process from now on (and from task logs)."""
    from airflow.sdk.log import mask_secret

    for secret in secrets:
        mask_secret(secret)
    # in a URL a token may travel percent-encoded
    forms = {form for secret in secrets for form in (secret, quote(secret, safe=""), quote(secret, safe="/"))}
    global _log_secrets
    with _log_secrets_lock:
        _log_secrets = tuple(sorted(forms.union(_log_secrets), key=len, reverse=True))
    redact_log_records()


def _redact_record(record: logging.LogRecord) -> None:
    """Cut every registered secret out of a record's message, traceback and stack, in place."""
    secrets = _log_secrets
    if not secrets:
        return
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed call is logging's to report, with the message unformatted
        text = str(record.msg)
    if any(s in text for s in secrets):
        record.msg, record.args = redact(text, secrets), ()
    if record.exc_info and record.exc_info[1] is not None:
        trace = logging.Formatter().formatException(record.exc_info)
        if any(s in trace for s in secrets):
            record.exc_info, record.exc_text = None, redact(trace, secrets)
    if record.stack_info and any(s in record.stack_info for s in secrets):
        record.stack_info = redact(record.stack_info, secrets)


class _RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True


def redact_log_records() -> None:
    """Redact registered secrets in every standard log record as it is made (idempotent).

    Taken where records are made rather than on handlers or named loggers: a client may log on
    any logger (the hook's, its own module's, a child created later), at any level, to handlers
    added after this runs, and a filter on a parent logger never sees a child's records.
    """
    current = logging.getLogRecordFactory()
    if getattr(current, "cd4ml_redacts", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        _redact_record(record)
        return record

    factory.cd4ml_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _slack_client_logger() -> logging.Logger:
    """A standard logger for slack_sdk's own lines (request URL, retries), redacted like every record."""
    logger = logging.getLogger(SLACK_CLIENT_LOGGER)
    if not any(isinstance(f, _RedactingFilter) for f in logger.filters):
        logger.addFilter(_RedactingFilter())  # also when something replaced the record factory since
    return logger


@contextmanager
def _failures_redacted() -> Iterator[None]:
    """Any failure leaves as ChannelError, its message without any registered secret (plain or percent-encoded:
    ``_connection`` registered this channel's), its cause cut."""
    try:
        yield
    except ChannelNotConfigured:
        raise
    except Exception as exc:  # noqa: BLE001 - every provider, HTTP and SMTP error alike
        raise ChannelError(redact(f"{type(exc).__name__}: {exc}", _log_secrets)[:500]) from None


def slack(alert: Alert, settings: Settings, action: Action) -> None:
    from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    _connection(settings.alerts.slack_conn_id)  # ChannelNotConfigured if missing; registers its secrets
    text = message(alert, settings, action).markdown()
    timeout = settings.alerts.retry.timeout_s
    notifier = SlackWebhookNotifier(slack_webhook_conn_id=settings.alerts.slack_conn_id, text=text, timeout=timeout)
    # The provider's hook hands slack_sdk its own logger; ours is a redacted standard one.
    notifier.__dict__["hook"] = SlackWebhookHook(slack_webhook_conn_id=settings.alerts.slack_conn_id,
                                                 timeout=timeout, logger=_slack_client_logger())
    with _failures_redacted():
        notifier.notify({})


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
    with _failures_redacted():
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

    with _failures_redacted():
        return EventsHook(pagerduty_events_conn_id=settings.alerts.pagerduty_conn_id)


def email(alert: Alert, settings: Settings, action: Action) -> None:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    _connection(settings.alerts.smtp_conn_id)  # ChannelNotConfigured if missing; registers its secrets
    msg = message(alert, settings, action)
    with _failures_redacted():
        SmtpNotifier(to=list(settings.alerts.email_to), smtp_conn_id=settings.alerts.smtp_conn_id,
                     subject=msg.title, html_content=msg.html()).notify({})


CHANNELS: dict[str, channels.Channel] = {"slack": slack, "pagerduty": pagerduty, "email": email}


def install() -> None:
    """Make Slack, PagerDuty and email deliverable in this process (idempotent)."""
    channels.use_channels(CHANNELS)
