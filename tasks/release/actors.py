"""Who acts on a release from the command line, and the route the environment's settings give them.

One rule, read from ``release.approval`` (never from the environment's name):

* ``none`` (sit, uat): the command acts directly and the ledger names the operating-system
  account that ran it, ``cli:<user>`` (from the process's user id, not from ``$USER``).
* ``required`` (prod): the command acts only through Airflow's REST API as the signed-in user:
  it gets a token from ``/auth/token`` with credentials from ``CD4ML_AIRFLOW_USERNAME`` /
  ``CD4ML_AIRFLOW_PASSWORD`` or a prompt (never from the command line, where ``ps`` shows them),
  and triggers ``cd4ml_rollback``, ``cd4ml_promote`` or ``cd4ml_accept_class``. Airflow's auth manager decides whether that
  user may, and the DAG run records the user, which the ledger then names.

A typed identity (``--by``, ``CD4ML_ACTOR``) is refused on both routes: nobody can claim to be
somebody else.
"""

from __future__ import annotations

import getpass
import json
import os
import pwd
import sys
import urllib.error
import urllib.request
from typing import Any

from tasks.release.release import ReleaseError
from tasks.settings import Settings

AIRFLOW, DIRECT = "airflow", "direct"
USER_VARIABLE, PASSWORD_VARIABLE, URL_VARIABLE = "CD4ML_AIRFLOW_USERNAME", "CD4ML_AIRFLOW_PASSWORD", "CD4ML_AIRFLOW_URL"
TYPED_ACTOR_VARIABLE = "CD4ML_ACTOR"
HTTP_TIMEOUT_S = 30


class TypedActorError(ReleaseError):
    """Somebody typed who they are (``--by``, ``CD4ML_ACTOR``): a release names an authenticated identity only."""


class AirflowApiError(ReleaseError):
    """The Airflow API server refused or could not be reached: nothing was triggered."""


def route(settings: Settings) -> str:
    """``airflow`` where a person's approval is required (act as the signed-in Airflow user), else ``direct``."""
    return AIRFLOW if settings.release.approval == "required" else DIRECT


def refuse_typed_actor(settings: Settings, typed: str | None) -> None:
    """A typed ``--by`` or ``CD4ML_ACTOR`` is refused: say what names the actor instead."""
    claimed = typed or os.environ.get(TYPED_ACTOR_VARIABLE)
    if not claimed:
        return
    where = "--by" if typed else TYPED_ACTOR_VARIABLE
    if route(settings) == AIRFLOW:
        how = (f"{settings.env} requires approval: release commands run as the user signed in to Airflow "
               f"({USER_VARIABLE} / {PASSWORD_VARIABLE}, or the prompt)")
    else:
        how = f"in {settings.env} the ledger names the account running the command ({cli_actor()})"
    raise TypedActorError(f"{where} is not accepted: who acted is never typed; {how}. Unset {where} and run again.")


def cli_actor() -> str:
    """The operating-system account of this process: ``cli:<user>``."""
    return f"cli:{pwd.getpwuid(os.getuid()).pw_name}"


def credentials() -> tuple[str, str]:
    """(user, password) from the environment, else asked for on a terminal."""
    user, password = os.environ.get(USER_VARIABLE), os.environ.get(PASSWORD_VARIABLE)
    if user and password:
        return user, password
    if not sys.stdin.isatty():
        raise AirflowApiError(f"sign in to Airflow: set {USER_VARIABLE} and {PASSWORD_VARIABLE}, or run in a terminal")
    return user or input("Airflow user: "), password or getpass.getpass("Airflow password: ")


def api_url(settings: Settings) -> str:
    return (os.environ.get(URL_VARIABLE) or settings.release.airflow_api_url).rstrip("/")


def _call(method: str, url: str, body: dict[str, Any] | None, token: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps(body).encode() if body is not None else None, headers,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310 - URL from settings
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:  # the status says it; the body may echo what was sent
        raise AirflowApiError(f"{method} {url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AirflowApiError(f"{method} {url}: {type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None


def trigger(settings: Settings, dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
    """Trigger ``dag_id`` with ``conf`` as the signed-in user; returns the run as Airflow reports it."""
    base = api_url(settings)
    user, password = credentials()
    token = _call("POST", f"{base}/auth/token", {"username": user, "password": password}).get("access_token")
    if not token:
        raise AirflowApiError(f"POST {base}/auth/token: no access token in the answer")
    run = _call("POST", f"{base}/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf}, token)
    return {"route": AIRFLOW, "dag_id": dag_id, "dag_run_id": run.get("dag_run_id"), "state": run.get("state"),
            "triggered_by": run.get("triggering_user_name") or user, "api": base}
