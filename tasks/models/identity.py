"""Who this process is to the MLflow registry: scoring and serving read it as an account that can only read.

In scale-out mode (and the docker and Kubernetes deployments) the MLflow server runs its basic-auth
app. Training, the gate and releases need an account that writes (``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``); scoring and serving only resolve the champion and download its
files, so they sign in as the reader account (``CD4ML_MLFLOW_READER_USERNAME`` /
``CD4ML_MLFLOW_READER_PASSWORD``, from the environment or a secret, never from a file here), to
which the server grants READ and nothing else (``tasks/ops/registry_accounts.py`` creates it).
A scoring run or a server that is tricked into writing is then refused by the server (HTTP 403),
not by this code's good behaviour.

Without the two variables (the embedded SQLite store, which has no accounts) nothing changes.
One without the other is a configuration error: silently falling back to the writing account is
what this module exists to prevent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

from tasks.errors import DataError

READER_USERNAME_VARIABLE = "CD4ML_MLFLOW_READER_USERNAME"
READER_PASSWORD_VARIABLE = "CD4ML_MLFLOW_READER_PASSWORD"
USERNAME_VARIABLE, PASSWORD_VARIABLE, TOKEN_VARIABLE = (
    "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


class ReaderCredentialsError(DataError, ValueError):
    """Only one of the reader account's two variables is set: the account cannot sign in."""


def reader_credentials(env: MutableMapping[str, str] | None = None) -> tuple[str, str] | None:
    """(user, password) of the read-only account, or None where none is configured."""
    env = os.environ if env is None else env
    user, password = env.get(READER_USERNAME_VARIABLE), env.get(READER_PASSWORD_VARIABLE)
    if not user and not password:
        return None
    if not (user and password):
        raise ReaderCredentialsError(f"set both {READER_USERNAME_VARIABLE} and {READER_PASSWORD_VARIABLE} "
                                     "(the registry's read-only account), or neither")
    return user, password


def as_reader_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` signed in as the reader where one is configured: the writing account's credentials replaced, in place."""
    credentials = reader_credentials(env)
    if credentials is not None:
        env[USERNAME_VARIABLE], env[PASSWORD_VARIABLE] = credentials
        env.pop(TOKEN_VARIABLE, None)
    return env


@contextmanager
def as_reader() -> Iterator[bool]:
    """MLflow calls inside run as the reader (MLflow reads the credentials from the environment on every
    request); afterwards the process's own are put back, so an in-process caller that writes next still can.
    Yields whether a reader was configured."""
    names = (USERNAME_VARIABLE, PASSWORD_VARIABLE, TOKEN_VARIABLE)
    saved = {name: os.environ.get(name) for name in names}
    configured = reader_credentials() is not None
    as_reader_env(os.environ)
    try:
        yield configured
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
