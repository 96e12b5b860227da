"""cd4ml_accept_class's task: new classes accepted, in the name of the user who triggered the run."""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.steps.shape import step
from tasks.data.labels import MAX_ACCEPTED, MAX_LABEL_CHARS

__all__ = ["MAX_ACCEPTED", "MAX_LABEL_CHARS", "accept_class"]  # the DAG's Param bounds: the form checks them too


@task
@step(checks_params=True, says=lambda r: f"accepted {r['new']} new class(es) as {r['actor']}; classes: {r['classes']}")
def accept_class(settings, context):
    """Append the labels to the classes table (a recorded one is a no-op), naming who triggered the run."""
    from cd4ml_airflow.context import run_actor
    from tasks.data import classes

    actor = run_actor(context)
    new = classes.accept(settings, context["params"]["labels"], context["run_id"], actor)
    return {"env": settings.env, "new": new, "actor": actor, "classes": classes.known(settings)}
