"""cd4ml_reconcile's tasks: is the upstream's champion imported and gated here? If not, cd4ml_promote runs for it."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.steps.shape import step


@task
@step()
def pending_import(settings, context) -> dict:
    """The upstream champion's version when no version here imported from it has a recorded gate (else None)."""
    from cd4ml_airflow.steps.promote import upstream_credentials
    from tasks.release.model_import import pending_import as pending
    from tasks.release.release import ReleaseError

    if settings.release.pattern != "deploy_model":
        raise ReleaseError(f"{settings.env} deploys code (release.pattern: deploy_code): nothing is imported into it")
    return {"source_version": pending(settings, credentials=upstream_credentials(settings))}


@task.short_circuit
def import_needed(pending: dict) -> bool:
    """Trigger cd4ml_promote only for an upstream champion without a gated import here (a lost or late event)."""
    version = pending["source_version"]
    print(f"upstream champion v{version} has no gated import here: cd4ml_promote runs for it" if version is not None
          else "the upstream champion is imported and gated here (or there is none): nothing to do")
    return version is not None
