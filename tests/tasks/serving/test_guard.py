"""``tasks.serving.guard``: the request limits in front of MLflow's scoring app, over real HTTP.

The limits run under a real uvicorn on 127.0.0.1; behind them sits a small ASGI app that records
every body it is handed (in ``test_serve.py`` MLflow's scoring app and the real champion sit
there): what it never receives, no decoder behind it can allocate.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tasks.serving.guard import RequestLimits, image_problem
from tests.factories.digits import curated_rows
from tests.factories.pixel_bomb import pixel_bomb_png

MAX_BYTES = 1_000_000
MAX_PIXELS = 1 << 24


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return pixel_bomb_png(12000)


@pytest.fixture(scope="module")
def digit() -> bytes:
    return curated_rows()[0]["image"]


def test_an_image_over_max_pixels_is_found_in_every_json_form_mlflow_accepts(bomb, digit):
    for document in (
        {"dataframe_split": {"columns": ["id", "image"], "data": [[1, _b64(digit)], [2, _b64(bomb)]]}},
        {"dataframe_records": [{"image": _b64(digit)}, {"image": _b64(bomb)}]},
        {"inputs": {"image": [_b64(digit), _b64(bomb)]}},
        {"instances": [{"image": _b64(digit)}, {"image": _b64(bomb)}]},
    ):
        assert image_problem(json.dumps(document).encode(), MAX_PIXELS) == \
            "image 1: 12000x12000 exceeds max_pixels 16777216", document
    fine = {"dataframe_split": {"columns": ["image"], "data": [[_b64(digit)], ["not base64!"], [_b64(b"text")]]}}
    assert image_problem(json.dumps(fine).encode(), MAX_PIXELS) is None  # the model answers those itself
    assert image_problem(b"[" * 100_000, MAX_PIXELS) is None and image_problem(b"\xff", MAX_PIXELS) is None


class _Recorder:
    """The app behind the limits: answers 200 and keeps the size of every body it was handed."""

    def __init__(self) -> None:
        self.bodies: list[int] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.bodies.append(len(body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"predictions": []}'})


@pytest.fixture(scope="module")
def limited() -> Iterator[tuple[int, _Recorder]]:
    import uvicorn

    recorder = _Recorder()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(RequestLimits(recorder, MAX_BYTES, MAX_PIXELS), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield port, recorder
    server.should_exit = True
    thread.join(10)


def _post(port: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json", **(headers or {})})
    answer = conn.getresponse()
    status, payload = answer.status, json.loads(answer.read() or b"{}")
    conn.close()
    return status, payload


def test_a_declared_length_over_the_limit_is_413_before_any_body_is_sent(limited):
    port, recorder = limited
    before = len(recorder.bodies)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000000\r\n\r\n{")  # 1 GB announced, one byte sent
        answer = raw.recv(4096)  # within the timeout: the server did not wait for the gigabyte
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"exceeds serving.max_request_bytes 1000000" in answer
    assert len(recorder.bodies) == before


def test_a_chunked_body_is_cut_off_at_the_limit(limited):
    port, recorder = limited
    before = len(recorder.bodies)
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 50_000
        try:
            for _ in range(200):  # 10 MB offered, 50 kB at a time
                raw.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: exactly the point
        answer = raw.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert len(recorder.bodies) == before


def test_a_pixel_bomb_is_refused_from_its_header_and_never_handed_on(limited, bomb, digit):
    port, recorder = limited
    before = len(recorder.bodies)
    body = json.dumps({"dataframe_split": {"columns": ["image"], "data": [[_b64(digit)], [_b64(bomb)]]}}).encode()
    assert 500_000 < len(body) < MAX_BYTES  # the 560 kB body, under the byte limit
    status, answer = _post(port, body)
    assert status == 400 and answer == {"error_code": "INVALID_PARAMETER_VALUE",
                                        "message": "image 1: 12000x12000 exceeds max_pixels 16777216"}
    small = json.dumps({"dataframe_split": {"columns": ["image"], "data": [[_b64(digit)]]}}).encode()
    assert _post(port, small) == (200, {"predictions": []})
    assert recorder.bodies[before:] == [len(small)]  # only the good request got through, whole


def test_csv_and_parquet_bodies_are_415_since_their_images_are_not_screened(limited, bomb):
    port, recorder = limited
    before = len(recorder.bodies)
    csv_body = ("image\n" + _b64(bomb) + "\n").encode()  # MLflow would parse this and the model decode it
    for content_type in ("text/csv", "application/x-parquet", ""):
        status, answer = _post(port, csv_body, {"Content-Type": content_type})
        assert status == 415 and answer["error_code"] == "UNSUPPORTED_MEDIA_TYPE", content_type
    assert _post(port, b'{"inputs": []}', {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    assert len(recorder.bodies) == before + 1
