"""The shape every cd4ml task body shares, written once: settings -> fail fast -> product call -> log -> XCom.

A body is a plain function of the run's settings, the Airflow context and its task arguments that
returns what the ``tasks/`` function returned; ``@step`` (under ``@task``) does the rest:

    @task(outlets=[PREDICTIONS])
    @step(checks_params=True, says=lambda r: f"scored {r.scored} new image(s)", publishes=(PREDICTIONS, extra))
    def score(settings, context):
        ...

1. loads the settings on the worker (the DAG file saw them at parse time only); settings that do
   not load (a ``SettingsError``, a ``DataError``) fail the task at once, without retries;
2. ``checks_params`` (a run's first tasks): a Param that names something that does not exist
   fails the run at once, without retries;
3. runs the body so that a ``tasks.errors.DataError`` fails the task without retries (the data
   will not change) and anything else is left to Airflow's retries; ``fail_fast=False`` where the
   body itself says which part fails fast;
4. prints ``says(result)``, the line a reader of the task log looks for;
5. ``publishes=(asset, extra_of)``: the Asset event's extra, from the result;
6. returns ``result.to_dict()`` (a body's plain value as it is) as the task's XCom.

The task keeps the body's name, docstring and task arguments (Airflow reads them from the
signature); the settings and context come in as the first two parameters.

``skip_on(*errors)`` is the other shared shape: an empty input (nothing to ingest, nothing to
score, no champion to monitor) skips the task with the error's message instead of failing it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors

Body = Callable[..., Any]


def step(*, checks_params: bool = False, fail_fast: bool = True, says: Callable[[Any], str] | None = None,
         publishes: tuple[Any, Callable[[Any], dict]] | None = None) -> Callable[[Body], Callable[..., Any]]:
    """Wrap a task body ``(settings, context, *task_args)`` in the shared shape (module doc)."""

    def decorate(body: Body) -> Callable[..., Any]:
        signature = _task_signature(body)

        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            from tasks.settings import load_settings

            bound = signature.bind(*args, **kwargs)
            context = bound.arguments.pop("context", {})
            with fail_fast_on_data_errors():  # broken settings do not mend on a retry
                settings = load_settings()
            if checks_params:
                check_run_params(context, settings)
            with fail_fast_on_data_errors() if fail_fast else nullcontext():
                result = body(settings, context, **bound.arguments)
            if says is not None:
                print(says(result))
            if publishes is not None:
                asset, extra_of = publishes
                context["outlet_events"][asset].extra = extra_of(result)
            return result.to_dict() if hasattr(result, "to_dict") else result

        run.__signature__ = signature  # type: ignore[attr-defined]
        # what Airflow infers multiple_outputs from: a result's to_dict() is a dict, a body may say otherwise
        run.__annotations__ = {"return": body.__annotations__.get("return", dict)}
        return run

    return decorate


def _task_signature(body: Body) -> inspect.Signature:
    """The task's signature: the body's own task arguments (after settings and context), then ``**context``."""
    params = list(inspect.signature(body).parameters.values())
    if [p.name for p in params[:2]] != ["settings", "context"]:
        raise TypeError(f"a step body takes (settings, context, ...): {body.__qualname__}{inspect.signature(body)}")
    context = inspect.Parameter("context", inspect.Parameter.VAR_KEYWORD)
    return inspect.Signature([*params[2:], context])


@contextmanager
def skip_on(*errors: type[BaseException]) -> Iterator[None]:
    """An empty input is no failure: one of ``errors`` skips the task, with its message as the reason."""
    from airflow.sdk.exceptions import AirflowSkipException

    try:
        yield
    except errors as exc:
        raise AirflowSkipException(str(exc)) from exc
