"""A real MLflow server with accounts (``mlflow server --app-name basic-auth``) for tests, on a free local port.

Its store (SQLite), artifact folder and auth database live in ``root``; the admin's password is
generated. The ini is the one ``cd4ml up`` writes in scale-out (``default_permission = READ``), so
an ordinary account may read and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tasks.ops.stack import mlflow_auth_ini
from tests.peers import free_port

ADMIN = "admin"


def _wait_healthy(uri: str, server: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return
        except OSError:
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)


@contextlib.contextmanager
def basic_auth_server(root: Path, timeout_s: float = 60.0) -> Iterator[dict[str, str]]:
    """Yields {uri, admin_password, artifacts}; the server is stopped (its whole process group) on exit."""
    (root / "basic_auth.ini").write_text(mlflow_auth_ini(f"sqlite:///{root / 'auth.db'}"))
    port, admin_password = free_port(), secrets.token_urlsafe(16)
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
           "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN, "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(16), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(root / "server.log", "wb") as log:
        server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", "basic-auth",
                                   "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                                   "--artifacts-destination", str(root / "artifacts"),
                                   "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        uri = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(uri, server, root / "server.log", timeout_s)
            yield {"uri": uri, "admin_password": admin_password, "artifacts": str(root / "artifacts")}
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=30)
