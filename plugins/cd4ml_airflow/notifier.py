"""The on-call notifiers every DAG uses: failure (task and DAG level), success (resolves), approval pending.

Each reads where the alert comes from out of an Airflow callback context (``origin_of``: the
environment, DAG, task, run, a link to the task log in the Airflow UI and the data and model
versions involved), lets ``tasks.alerting.policy`` decide what the alert says and how it is
keyed, and hands it to ``tasks.alerting.delivery.send``, which routes it by severity, de-duplicates it
and never raises.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseNotifier

# XCom keys (of the failed task's upstream results) and Params that name what data or model a run used.
VERSION_KEYS = ("_version", "_table", "sample", "model_name", "version", "to")


def involved_versions(context) -> dict[str, Any]:
    """The data and model versions a run used: its version Params and its upstream tasks' results."""
    found: dict[str, Any] = {}

    def keep(key: str, value: Any) -> None:
        if value is not None and not isinstance(value, (dict, list)) and (
                key in VERSION_KEYS or key.endswith(VERSION_KEYS)):
            found[key] = value

    for key, value in (context.get("params") or {}).items():
        keep(key, value)
    ti, task = context.get("ti") or context.get("task_instance"), context.get("task")
    for upstream in sorted(getattr(task, "upstream_task_ids", None) or ()):
        try:
            value = ti.xcom_pull(task_ids=upstream)
        except Exception:  # noqa: BLE001 - versions enrich an alert; they must never stop it
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                keep(key, item)
    return found


def settings_or_none():
    """(settings, env): settings None when they cannot be loaded, which on-call must still hear about."""
    from tasks.settings import SettingsError, load_settings, resolve_env

    try:
        settings = load_settings()
        return settings, settings.env
    except SettingsError as exc:
        try:
            return None, resolve_env()
        except SettingsError:
            return None, f"unresolved ({exc})"


def origin_of(context, settings, env: str):
    """Where an alert about the run in ``context`` comes from: DAG, task, run, log link, versions, date and try."""
    from tasks.alerting.alert import ui_link
    from tasks.alerting.policy import Origin

    dag = context.get("dag")
    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(dag, "dag_id", None) or getattr(ti, "dag_id", None) or "unknown"
    task_id = getattr(ti, "task_id", None) or ""
    run_id = context.get("run_id") or getattr(context.get("dag_run"), "run_id", None) or ""
    try_number = getattr(ti, "try_number", None)
    return Origin(
        env=env, dag_id=dag_id, task_id=task_id, run_id=run_id,
        log_url=ui_link(settings, dag_id, run_id, task_id, try_number) if settings else "",
        versions=involved_versions(context),
        details={k: v for k, v in (("logical_date", context.get("logical_date")), ("try_number", try_number))
                 if v is not None},
    )


class _ContextNotifier(BaseNotifier):
    template_fields = ()  # nothing to render: the alert is built from the context in notify()

    def render_template_fields(self, context, jinja_env=None) -> None:
        # DAG-level callbacks get a SerializedDAG, which cannot build a Jinja environment.
        return None


class OnCallNotifier(_ContextNotifier):
    """Failure callback (task level and DAG level): one alert per failed run, shared dedup key."""

    def __init__(self, severity: str = "critical"):
        super().__init__()
        self.severity = severity

    def notify(self, context) -> None:
        from tasks.alerting import policy as alert_policy
        from tasks.alerting.alert import first_line
        from tasks.alerting.delivery import send

        settings, env = settings_or_none()
        exc = context.get("exception")
        send(alert_policy.task_failed(
            origin_of(context, settings, env), self.severity,  # type: ignore[arg-type]
            reason=context.get("reason", "run failed"),
            error=first_line(exc) if exc else str(context.get("reason") or "")), settings)


class ResolveNotifier(_ContextNotifier):
    """DAG-level success callback: the run succeeded, so the incidents this DAG left open are resolved."""

    def notify(self, context) -> None:
        from tasks.alerting.delivery import resolve
        from tasks.settings import load_settings

        dag_id = getattr(context.get("dag"), "dag_id", None)
        run_id = context.get("run_id") or getattr(context.get("dag_run"), "run_id", None) or ""
        if dag_id:
            resolve(load_settings(), dag_id, run_id)


class ApprovalRequestNotifier(_ContextNotifier):
    """Announce a pending approval through the on-call routing, with the Required Actions link.

    HITL operators call their notifiers when the task starts waiting, so nobody has to watch
    the UI to learn that prod is waiting for a person.
    """

    def notify(self, context) -> None:
        from tasks.alerting import policy as alert_policy
        from tasks.alerting.alert import ui_link
        from tasks.alerting.delivery import send
        from tasks.settings import load_settings

        settings = load_settings()
        ti = context.get("ti") or context.get("task_instance")
        link = ui_link(settings, ti.dag_id, ti.run_id, ti.task_id).split("?")[0] + "/required_actions"
        subject = getattr(context.get("task"), "subject", None) or "approval requested"
        send(alert_policy.approval_pending(origin_of(context, settings, settings.env), subject=subject,
                                           required_actions=link,
                                           timeout_hours=settings.release.approval_timeout_hours), settings)
