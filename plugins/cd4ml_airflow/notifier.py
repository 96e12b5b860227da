"""The on-call notifier every DAG uses as its failure callback."""

from __future__ import annotations

from airflow.sdk import BaseNotifier


class OnCallNotifier(BaseNotifier):
    """Turn an Airflow callback context into an ``tasks.alerts.Alert`` and send it."""

    template_fields = ("summary",)

    def __init__(self, severity: str = "critical", summary: str = "{{ dag.dag_id }} failed"):
        super().__init__()
        self.severity = severity
        self.summary = summary

    def notify(self, context) -> None:
        from tasks.alerts import Alert, send
        from tasks.settings import load_settings

        settings = load_settings()
        dag = context.get("dag")
        ti = context.get("ti") or context.get("task_instance")
        dag_id = getattr(dag, "dag_id", None) or getattr(ti, "dag_id", "unknown")
        task_id = getattr(ti, "task_id", None)
        exc = context.get("exception")
        source = f"dag:{dag_id}" + (f"/task:{task_id}" if task_id else "")
        alert = Alert(
            summary=str(self.summary) + (f": {task_id}" if task_id else ""),
            severity=self.severity,  # type: ignore[arg-type]
            source=source,
            env=settings.env,
            dedup_key=f"{settings.env}:{source}",
            details={
                "run_id": context.get("run_id"),
                "logical_date": str(context.get("logical_date")),
                "try_number": getattr(ti, "try_number", None),
                "error": f"{type(exc).__name__}: {exc}" if exc else None,
                "log_url": getattr(ti, "log_url", None),
            },
        )
        send(alert, settings)
