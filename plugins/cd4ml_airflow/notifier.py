"""The on-call notifier every DAG uses as its failure callback (task level and DAG level)."""

from __future__ import annotations

from airflow.sdk import BaseNotifier


class OnCallNotifier(BaseNotifier):
    """Turn an Airflow callback context into an ``tasks.alerts.Alert`` and send it.

    The task-level and DAG-level callbacks of one failed run share a dedup key, so an
    on-call tool that groups by key (PagerDuty, Opsgenie) opens one incident, not two.
    """

    template_fields = ()  # nothing to render: the alert is built from the context in notify()

    def __init__(self, severity: str = "critical"):
        super().__init__()
        self.severity = severity

    def render_template_fields(self, context, jinja_env=None) -> None:
        # DAG-level callbacks get a SerializedDAG, which cannot build a Jinja environment.
        return None

    def notify(self, context) -> None:
        from tasks.alerts import Alert, send
        from tasks.settings import SettingsError, load_settings, resolve_env

        try:
            settings = load_settings()
            env = settings.env
        except SettingsError as exc:  # a broken config must still reach on-call
            settings, env = None, f"unresolved ({exc})"
            try:
                env = resolve_env()
            except SettingsError:
                pass
        dag = context.get("dag")
        ti = context.get("ti") or context.get("task_instance")
        dag_id = getattr(dag, "dag_id", None) or getattr(ti, "dag_id", "unknown")
        task_id = getattr(ti, "task_id", None)
        run_id = context.get("run_id") or getattr(context.get("dag_run"), "run_id", None)
        exc = context.get("exception")
        source = f"dag:{dag_id}" + (f"/task:{task_id}" if task_id else "")
        alert = Alert(
            summary=f"{dag_id} failed" + (f" in task {task_id}" if task_id else f": {context.get('reason', 'run failed')}"),
            severity=self.severity,  # type: ignore[arg-type]
            source=source,
            env=env,
            dedup_key=f"{env}:{dag_id}:{run_id}",
            details={
                "run_id": run_id,
                "logical_date": str(context.get("logical_date")),
                "try_number": getattr(ti, "try_number", None),
                "error": f"{type(exc).__name__}: {exc}" if exc else None,
                "log_url": getattr(ti, "log_url", None),
            },
        )
        send(alert, settings)


class ApprovalRequestNotifier(BaseNotifier):
    """Announce a pending approval through the on-call channels, with the Required Actions link.

    HITL operators call their notifiers when the task starts waiting, so nobody has to watch
    the UI to learn that prod is waiting for a person.
    """

    template_fields = ()

    def render_template_fields(self, context, jinja_env=None) -> None:
        return None

    def notify(self, context) -> None:
        from tasks.alerts import Alert, send
        from tasks.settings import load_settings

        settings = load_settings()
        ti = context.get("ti") or context.get("task_instance")
        dag_id, run_id, task_id = ti.dag_id, ti.run_id, ti.task_id
        base = settings.release.ui_base_url.rstrip("/")
        link = f"{base}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/required_actions"
        subject = getattr(context.get("task"), "subject", None) or "approval requested"
        send(Alert(summary=f"approval needed in {settings.env}: {subject}", severity="warning",
                   source=f"dag:{dag_id}/task:{task_id}", env=settings.env,
                   dedup_key=f"{settings.env}:approval:{dag_id}:{run_id}",
                   details={"required_actions": link, "run_id": run_id,
                            "timeout_hours": settings.release.approval_timeout_hours}, kind="approval_pending"), settings)
