"""The MLflow server's read-only account for scoring and serving, created (or its password set) by the admin.

MLflow's basic-auth app creates only its admin, at its first start (``MLFLOW_AUTH_ADMIN_PASSWORD``).
The reader is an ordinary user: the app's ``default_permission = READ`` (the ini ``cd4ml up`` and
docker/mlflow-entrypoint.sh write) lets it read every experiment and registered model, and nothing
grants it more, so MLflow refuses it every write (HTTP 403: new versions, aliases, tags, deletes).
``ensure_reader`` is idempotent: it creates the account, or sets its password to the configured one
(a rotated secret takes effect at the next start), and refuses a name that belongs to an admin.

Run by ``cd4ml up`` (scale-out) once the server answers, and by the docker and Kubernetes init
jobs as ``python -m tasks.ops.registry_accounts`` (credentials from the environment only).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tasks.errors import DataError
from tasks.models.identity import PASSWORD_VARIABLE, USERNAME_VARIABLE, reader_credentials

HTTP_TIMEOUT_S = 30
USERS = "/api/2.0/mlflow/users"


class RegistryAccountError(DataError, RuntimeError):
    """The reader account could not be created or updated; the message says which call and status."""


def _call(base: str, admin: tuple[str, str], method: str, path: str, query: dict[str, str] | None = None,
          body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    token = base64.b64encode(f"{admin[0]}:{admin[1]}".encode()).decode()
    request = urllib.request.Request(url, json.dumps(body).encode() if body is not None else None,
                                     {"Content-Type": "application/json", "Authorization": f"Basic {token}"},
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310 - the configured server
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:  # the status says it; the body may echo what was sent
        return exc.code, {}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RegistryAccountError(f"{method} {base}{path}: {type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None


def ensure_reader(tracking_uri: str, admin: tuple[str, str], reader: tuple[str, str]) -> str:
    """Create the reader account or set its password; returns ``created`` or ``updated``."""
    base, (name, password) = tracking_uri.rstrip("/"), reader
    if name == admin[0]:
        raise RegistryAccountError("the reader account must not be the admin account")
    status, found = _call(base, admin, "GET", f"{USERS}/get", {"username": name})
    if status == 200:
        if found.get("user", {}).get("is_admin"):
            raise RegistryAccountError(f"MLflow user {name} is an admin: pick another name for the read-only account")
        status, _ = _call(base, admin, "PATCH", f"{USERS}/update-password", body={"username": name, "password": password})
        outcome = "updated"
    elif status == 404:
        status, _ = _call(base, admin, "POST", f"{USERS}/create", body={"username": name, "password": password})
        outcome = "created"
    else:
        raise RegistryAccountError(f"GET {base}{USERS}/get: HTTP {status} (is {admin[0]} the MLflow admin?)")
    if status != 200:
        raise RegistryAccountError(f"{outcome[:-1]} of MLflow user {name} at {base}: HTTP {status}")
    return outcome


def main() -> int:
    """``python -m tasks.ops.registry_accounts``: the reader from the environment, as the admin of MLFLOW_TRACKING_URI."""
    reader = reader_credentials()
    admin = os.environ.get(USERNAME_VARIABLE), os.environ.get(PASSWORD_VARIABLE)
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if reader is None or not all(admin) or not uri.startswith(("http://", "https://")):
        print("registry_accounts: set MLFLOW_TRACKING_URI (the server), MLFLOW_TRACKING_USERNAME/PASSWORD (its admin) "
              "and CD4ML_MLFLOW_READER_USERNAME/PASSWORD", file=sys.stderr)
        return 2
    try:
        outcome = ensure_reader(uri, admin, reader)  # type: ignore[arg-type]
    except RegistryAccountError as exc:
        print(f"registry_accounts: {exc}", file=sys.stderr)
        return 1
    print(f"MLflow read-only account {reader[0]}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
