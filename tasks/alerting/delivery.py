"""On-call alert delivery: the log line always, then the routed channels, once per incident, never failing.

``send`` takes an ``Alert`` (``tasks.alerting.alert``) and:

1. logs it on the ``cd4ml.alerts`` logger, always: one JSON line, the record of every alert
   whatever else happens (a log shipper can route it too);
2. claims its dedup key in the alert ledger (``tasks.alerting.incidents``): a key that was
   already delivered and is not resolved is not delivered again, so the task-level and DAG-level
   callbacks of one run, a retried task or a cleared run raise one incident, not several;
3. hands it to every other channel routed for its severity in this environment's settings
   (``alerts.routes``), one after the other, each tried ``alerts.retry.attempts`` times with
   exponential back-off. A channel that still fails is logged (never with its secrets) and the
   others still fire: ``send`` never raises, so alerting can never fail a DAG.

``resolve`` closes the incidents a DAG left open (failed runs, failed validation, missed
deadlines) when a later run of the same DAG in the same environment succeeds: PagerDuty gets a
``resolve`` with the same dedup key and Slack a resolved message.

Channels other than ``log`` are the ones installed in this process (``tasks.alerting.channels``):
the Airflow plugin package installs Airflow's provider notifiers (Slack webhook, PagerDuty Events
API v2, SMTP) when it is imported. This module imports no Airflow and loads nothing by name; a
routed channel that nobody installed is logged as not delivered.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from tasks.alerting import channels, incidents
from tasks.alerting.alert import INCIDENT_KINDS, Action, Alert, ChannelError, ChannelNotConfigured, first_line
from tasks.settings import Settings

log = logging.getLogger("cd4ml.alerts")


@dataclass(frozen=True)
class Delivery:
    channel: str
    ok: bool
    attempts: int
    error: str = ""
    suppressed: bool = False  # already delivered and still open: not sent again


def _log_line(alert: Alert, action: Action) -> None:
    level = logging.INFO if action == "resolve" or alert.severity == "info" else (
        logging.CRITICAL if alert.severity == "critical" else logging.WARNING)
    log.log(level, alert.to_json(action))


def _deliver(name: str, alert: Alert, settings: Settings, action: Action) -> Delivery:
    """One channel, retried with exponential back-off; never raises."""
    channel = channels.channel(name)
    if channel is None:
        error = f"no delivery for channel {name!r} in this process (installed: {', '.join(channels.installed()) or 'none'})"
        log.error("alert %s (%s) not delivered to %s: %s", alert.dedup_key, action, name, error)
        return Delivery(name, False, 0, error)
    retry = settings.alerts.retry
    error = ""
    for attempt in range(1, retry.attempts + 1):
        try:
            channel(alert, settings, action)
        except ChannelNotConfigured as exc:
            log.error("alert %s (%s) not delivered to %s: %s", alert.dedup_key, action, name, exc)
            return Delivery(name, False, attempt, str(exc))
        except Exception as exc:  # noqa: BLE001 - a channel must never fail the caller
            error = str(exc) if isinstance(exc, ChannelError) else type(exc).__name__
            if attempt < retry.attempts:
                wait = min(retry.max_backoff_s, retry.backoff_s * 2 ** (attempt - 1))
                log.warning("alert %s (%s): %s attempt %d/%d failed (%s); retrying in %.1f s",
                            alert.dedup_key, action, name, attempt, retry.attempts, error, wait)
                time.sleep(wait)
        else:
            log.info("alert %s (%s) delivered to %s (attempt %d)", alert.dedup_key, action, name, attempt)
            return Delivery(name, True, attempt)
    log.error("alert %s (%s) NOT delivered to %s after %d attempts: %s; its log line above is the record",
              alert.dedup_key, action, name, retry.attempts, error)
    return Delivery(name, False, retry.attempts, error)


def routed(alert: Alert, settings: Settings) -> tuple[str, ...]:
    """The channels this environment routes the alert's severity to, log first."""
    return ("log", *(c for c in settings.alerts.routes[alert.severity] if c != "log"))


def send(alert: Alert, settings: Settings | None) -> list[Delivery]:
    """Log the alert, then deliver it once to every routed channel. Never raises.

    A dedup key already delivered and not resolved is not delivered again (nor logged as a new
    alert: one line says it was suppressed). ``settings=None`` means the settings themselves
    could not be loaded, which is exactly when on-call must hear about it: the log line then.
    """
    if settings is None:
        _log_line(alert, "trigger")
        return [Delivery("log", True, 1)]
    channels = routed(alert, settings)
    try:
        first = incidents.claim(settings, alert, channels)
    except Exception as exc:  # noqa: BLE001 - the ledger being down must not silence the alert
        log.error("alert ledger unavailable (%s); delivering %s without de-duplication",
                  first_line(exc), alert.dedup_key)
        first = True
    if not first:
        log.info("alert %s (%s) already delivered and not resolved: not sent again", alert.dedup_key, alert.kind)
        return [Delivery("log", True, 1, suppressed=True)]
    _log_line(alert, "trigger")
    return [Delivery("log", True, 1), *(_deliver(name, alert, settings, "trigger") for name in channels[1:])]


def resolve(settings: Settings, dag_id: str, run_id: str) -> list[Delivery]:
    """A successful run of ``dag_id`` resolves every incident that DAG left open in this environment.

    Each incident is resolved on the channels its trigger went to (PagerDuty by its dedup key,
    Slack with a resolved message, email not: a resolved email nobody needs is noise). Never raises.
    """
    try:
        opened = incidents.open_incidents(settings, dag_id=dag_id, kinds=INCIDENT_KINDS)
    except Exception as exc:  # noqa: BLE001
        log.error("alert ledger unavailable (%s); open incidents of %s not resolved", first_line(exc), dag_id)
        return []
    return [d for incident in opened
            for d in resolve_incident(settings, incident, run_id, f"run {run_id} of {dag_id} succeeded")]


def resolve_incident(settings: Settings, incident, resolver: str, reason: str) -> list[Delivery]:
    """Close one open incident in the ledger (once, whoever races), then tell the channels it went to."""
    if not incidents.close(settings, incident.dedup_key, resolver):
        return []  # another process resolved it first
    alert = replace(incident.alert, details={**incident.alert.details, "resolved_by": reason})
    _log_line(alert, "resolve")
    return [Delivery("log", True, 1), *(_deliver(name, alert, settings, "resolve") for name in incident.channels
                                        if name in ("pagerduty", "slack"))]
