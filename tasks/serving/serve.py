"""REST serving: the environment's champion behind MLflow's own scoring server (``cd4ml serve``).

``serve`` resolves the champion first (no champion: ``NoChampionError``, nothing started), pins
it to its version (``models:/<name>/<version>``: moving the alias later does not change what a
running server answers; restart it to follow the alias), checks its files against the manifest
recorded at registration and keeps that checked copy in a folder of its own (a mismatch:
``ModelIntegrityError``, one alert, nothing started), prints what it serves and replaces the
process with uvicorn running MLflow's own scoring app for that folder's pyfunc, in this
environment (what ``mlflow models serve --env-manager local`` runs), behind the request limits of
``tasks.serving.guard`` (a body over ``serving.max_request_bytes`` is HTTP 413, an image over
``ingest.max_pixels`` by its header is HTTP 400, neither read nor decoded), until Ctrl-C or SIGTERM.
The server never downloads the model itself, so nothing changed after the check can reach it.

The endpoints are MLflow's: ``GET /ping``, ``GET /version``, ``POST /invocations`` with a JSON
body ``{"dataframe_split": {"columns": ["image"], "data": [["<base64 PNG/JPEG>"], ...]}}``
(``request_body``); the answer is ``{"predictions": [{"label": ..., "confidence": ...}, ...]}``,
one per image, in order. Bytes that are not an image, text that is not base64 or a body without
an ``image`` column are HTTP 400 with a JSON ``message`` naming the problem (and the position).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tasks.models.champion import ServingModel, serving_model
from tasks.models.integrity import Verified, verified_model
from tasks.serving.guard import ENV_MAX_BYTES, ENV_MAX_PIXELS, ENV_MODEL_URI
from tasks.settings import Settings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_WORKERS = 1


def _check_listen(port: int, workers: int) -> None:
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be 1..65535, got {port}")


def server_command(settings: Settings, host: str = DEFAULT_HOST, port: int | None = None,
                   workers: int = DEFAULT_WORKERS) -> list[str]:
    """uvicorn serving ``tasks.serving.guard`` in this interpreter (port: serving.port); the model is in ``server_env``."""
    port = settings.serving.port if port is None else port
    _check_listen(port, workers)
    return [
        sys.executable, "-m", "uvicorn",
        "--host", host,
        "--port", str(port),
        "--workers", str(workers),
        "--factory", "tasks.serving.guard:create_app",
    ]


def server_env(settings: Settings, base: dict[str, str] | None = None,
               model_folder: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The server's environment: this environment's MLflow store (as the read-only account where one is
    configured), the verified model folder and the request limits, and this interpreter's scripts first on PATH.

    Only the child gets ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI`` (see
    ``tasks.models.registry.client_for`` for why they must not be set in this process). The
    interpreter's bin folder comes first: whatever the server starts runs in this environment,
    and ``.venv/bin/cd4ml serve`` works without an activated venv.
    """
    from tasks.models.identity import as_reader_env

    env = as_reader_env(dict(os.environ if base is None else base))  # the writing account's password stays here
    env["MLFLOW_TRACKING_URI"] = settings.tracking_uri
    env["MLFLOW_REGISTRY_URI"] = settings.tracking_uri
    if model_folder is not None:
        env[ENV_MODEL_URI] = str(model_folder)
    env[ENV_MAX_BYTES] = str(settings.serving.max_request_bytes)
    env[ENV_MAX_PIXELS] = str(settings.ingest.max_pixels)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]])
    return env


def verified_copy(settings: Settings, model: ServingModel) -> tuple[Path, Verified]:
    """The model's files, checked against its manifest, in a folder that outlives this process (the server's).

    A mismatch (``ModelIntegrityError``) leaves no folder behind. The folder is the server's
    for as long as it runs: ``serve`` replaces this process, so nothing here could remove it later.
    """
    folder = Path(tempfile.mkdtemp(prefix=f"cd4ml-serve-{model.name}-v{model.version}-"))
    try:
        with verified_model(settings, model.uri) as (local, verified):
            shutil.copytree(local, folder / "model")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder / "model", verified


def request_body(images: Sequence[bytes]) -> dict[str, Any]:
    """The JSON body of ``POST /invocations`` for image bytes (PNG, JPEG, ...), one row per image."""
    return {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(bytes(b)).decode("ascii")] for b in images]}}


def serve(settings: Settings, host: str = DEFAULT_HOST, port: int | None = None, workers: int = DEFAULT_WORKERS) -> int:
    """Serve the champion until stopped; ``NoChampionError`` before anything starts when there is none.

    The registry is read as its read-only account where one is configured (``tasks.models.identity``),
    and the server itself gets no other: it serves a checked local copy and never needs to write."""
    from tasks.models.identity import as_reader

    port = settings.serving.port if port is None else port
    with as_reader():
        model = serving_model(settings)
        _check_listen(port, workers)  # refused before any download
        folder, verified = verified_copy(settings, model)
    command = server_command(settings, host, port, workers)
    env = server_env(settings, model_folder=folder)
    print(
        f"cd4ml serve ({settings.env}): {model.uri} ({model.alias_uri} when started; run {model.run_id or '-'})\n"
        f"  POST http://{host}:{port}/invocations  (GET /ping, /version); {workers} worker(s); Ctrl-C stops it\n"
        f"  restart to follow a new champion: a running server keeps version {model.version}\n"
        f"  {verified.line()}, served from {folder}",
        flush=True,
    )
    sys.stderr.flush()
    os.execve(command[0], command, env)  # the server becomes this process: signals reach it directly
    return 0  # not reached


@contextlib.contextmanager
def server_process(command: Sequence[str], env: dict[str, str], base_url: str, log_path: str | os.PathLike[str],
                   timeout_s: float = 180.0, cwd: str | os.PathLike[str] | None = None) -> Iterator[subprocess.Popen]:
    """Run a server command in its own process group until ``GET <base_url>/ping`` answers 200; always stop it.

    For tests and benchmarks (``cd4ml serve`` itself runs in the foreground). Output goes to
    ``log_path``; a server that exits or is not ready within ``timeout_s`` is a RuntimeError
    ending with the log's tail. On exit the whole group (the CLI, MLflow, uvicorn and its
    workers) gets SIGTERM, then SIGKILL after 15 s.
    """
    with open(log_path, "ab") as log:
        process = subprocess.Popen(list(command), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode} before answering /ping:\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{base_url}/ping", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer {base_url}/ping within {timeout_s:.0f} s:\n{_tail(log_path)}")
            time.sleep(0.25)
        yield process
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; make sure no worker of the group outlives it
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)


def _tail(path: str | os.PathLike[str], chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
