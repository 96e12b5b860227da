"""moto's standalone server (``moto_server``) as a real HTTP server process on a free 127.0.0.1 port: an SQS- and
S3-compatible endpoint for tests (moto accepts any key)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.peers import free_port

# moto accepts any key; these are not credentials of anything (a client refuses to sign without some)
FAKE_KEY_ID, FAKE_SECRET = "moto-test-key", "moto-test-secret"


@contextmanager
def moto_server(folder: Path) -> Iterator[str]:
    """The server running (its log in ``folder``); yields its endpoint URL."""
    import requests

    port = free_port()
    log = (folder / "server.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                requests.get(f"{endpoint}/moto-api/", timeout=1)
                break
            except requests.exceptions.ConnectionError:
                assert server.poll() is None, "moto_server exited"
                time.sleep(0.1)
        else:
            raise AssertionError("moto_server did not answer in 30 s")
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
