"""``cd4ml serve``: the champion behind MLflow's scoring server, over real HTTP, with real PNG and JPEG digits.

One server per module (``python -m tasks.cli serve`` in its own process group, on a free port,
for the session's real champion; always stopped): good requests (many images in one request,
one per request, PNG and JPEG) and bad ones (base64 of text, text that is not base64, a body
without an ``image`` column) which must be HTTP 4xx naming the problem, never a 500, and leave
the server answering. ``cd4ml serve`` without a champion fails in a second, starting nothing.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.factories.digits import curated_rows

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def jpeg_of(png: bytes) -> bytes:
    """The same pixels as a JPEG (quality 95)."""
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(Image.open(io.BytesIO(png))), mode="L").save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def invoke(base: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/invocations", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture(scope="module")
def digits() -> dict[str, list]:
    """The test split's real digits: PNG bytes, the same pixels as JPEG, the labels."""
    rows = [r for r in curated_rows() if r["split"] == "test"]
    return {"png": [r["image"] for r in rows], "jpeg": [jpeg_of(r["image"]) for r in rows],
            "labels": [r["label"] for r in rows]}


@pytest.fixture(scope="module")
def served(champion, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of the running server (the CLI execs the server: one process)."""
    from tasks.serving.serve import server_env, server_process

    settings, model = champion
    port = free_port()
    env = server_env(settings)
    env.update({"CD4ML_HOME": settings.home, "CD4ML_ENV": settings.env})
    log = tmp_path_factory.mktemp("serve") / "server.log"
    command = [sys.executable, "-m", "tasks.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with server_process(command, env, f"http://127.0.0.1:{port}", log, timeout_s=180, cwd=REPO) as process:
        yield f"http://127.0.0.1:{port}", process.pid
        assert process.poll() is None, log.read_text()[-3000:]
    printed = log.read_text()
    assert model.uri in printed.splitlines()[0]  # the CLI said which version it serves
    assert f"{model.uri}: " in printed and "files match manifest" in printed  # and that its files were checked


@pytest.fixture(scope="module")
def server(served: tuple[str, int]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def server_pid(served: tuple[str, int]) -> int:
    return served[1]


def accuracy(predicted: list[str], truth: list[str]) -> float:
    return sum(p == t for p, t in zip(predicted, truth)) / len(truth)


def test_the_server_classifies_png_and_jpeg_digits_many_per_request_and_one_per_request(
    server: str, champion, digits: dict[str, list]
) -> None:
    import mlflow.pyfunc
    import pandas as pd

    from tasks.models.registry import client_for
    from tasks.serving.serve import request_body

    settings, model = champion
    truth = digits["labels"]
    batched: dict[str, list[dict[str, Any]]] = {}
    for kind in ("png", "jpeg"):
        status, answer = invoke(server, request_body(digits[kind]))
        assert status == 200, answer
        batched[kind] = answer["predictions"]
        assert len(batched[kind]) == len(truth)
        assert all(set(p) == {"label", "confidence"} and 0 < p["confidence"] <= 1 for p in batched[kind])
        assert accuracy([p["label"] for p in batched[kind]], truth) >= 0.8, kind

    for kind in ("png", "jpeg"):  # one image per request: the same answers as in the batch
        for i in range(0, len(truth), 15):
            status, answer = invoke(server, request_body([digits[kind][i]]))
            assert status == 200, answer
            assert answer["predictions"][0]["label"] == batched[kind][i]["label"]
            assert answer["predictions"][0]["confidence"] == pytest.approx(batched[kind][i]["confidence"], abs=1e-5)

    client_for(settings.tracking_uri)  # the served answers are the pinned model's own, in process
    local = mlflow.pyfunc.load_model(model.uri).predict(pd.DataFrame({"image": digits["png"]}))
    assert [p["label"] for p in batched["png"]] == local["label"].tolist()
    assert [p["confidence"] for p in batched["png"]] == pytest.approx(local["confidence"].tolist(), abs=1e-5)


def test_a_request_that_is_not_an_image_is_a_4xx_naming_the_problem_and_the_server_keeps_answering(
    server: str, digits: dict[str, list]
) -> None:
    from tasks.serving.serve import request_body

    text = base64.b64encode(b"hello, this is a text file, not a picture").decode()
    cases = {
        "base64 of text, second image": (
            {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(digits["png"][0]).decode()], [text]]}},
            ["image 1", "not a decodable image"],
        ),
        "text that is not base64": (
            {"dataframe_split": {"columns": ["image"], "data": [["not base64 at all!"]]}},
            ["column image", "padding"],
        ),
        "only characters outside base64": (  # MLflow's decoder drops them: zero bytes reach the model
            {"dataframe_split": {"columns": ["image"], "data": [["@@@@"]]}},
            ["image 0", "not a decodable image"],
        ),
        "no image column": (
            {"dataframe_split": {"columns": ["picture"], "data": [[text]]}},
            ["missing inputs", "image"],
        ),
        "records without an image field": ({"dataframe_records": [{"file": "digit.png"}]}, ["missing inputs", "image"]),
    }
    for name, (body, words) in cases.items():
        status, answer = invoke(server, body)
        assert 400 <= status < 500, (name, status, answer)
        message = answer.get("message", "")
        assert all(w in message for w in words), (name, message)

    status, answer = invoke(server, request_body(digits["jpeg"][:3]))
    assert status == 200 and len(answer["predictions"]) == 3, answer
    with urllib.request.urlopen(f"{server}/ping", timeout=10) as ping:
        assert ping.status == 200


def _peak_rss_mb(pid: int) -> float:
    """The highest resident memory the server process ever had (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_pixel_bomb_is_refused_from_its_header_and_three_at_once_cost_no_memory(
    server: str, server_pid: int, digits: dict[str, list]
) -> None:
    """The issue's finding: a 12000x12000 PNG in a 560 kB body was decoded (1.6 GB, 4 GB with three at once)."""
    from concurrent.futures import ThreadPoolExecutor

    from tasks.serving.serve import request_body
    from tests.factories.pixel_bomb import pixel_bomb_png

    body = json.dumps(request_body([digits["png"][0], pixel_bomb_png(12000)])).encode()
    assert len(body) < 600_000
    peak_before = _peak_rss_mb(server_pid)
    status, answer = invoke(server, body)
    assert status == 400, (status, answer)
    assert answer["message"] == "image 1: 12000x12000 exceeds max_pixels 16777216"
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: invoke(server, body), range(3)))
    assert [a[0] for a in answers] == [400, 400, 400]
    grown = _peak_rss_mb(server_pid) - peak_before
    assert grown < 150, f"the server's peak memory grew by {grown:.0f} MB"  # decoding one would be > 400 MB
    status, answer = invoke(server, request_body(digits["png"][:2]))
    assert status == 200 and len(answer["predictions"]) == 2


def test_a_body_over_max_request_bytes_is_413_without_being_read(server: str, champion) -> None:
    settings, _ = champion
    host, port = server.removeprefix("http://").split(":")
    limit = settings.serving.max_request_bytes
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n{" % (limit + 1))  # announced, never sent
        answer = b""
        while chunk := raw.recv(4096):  # the server closes the connection; headers and body may come apart
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"exceeds serving.max_request_bytes %d" % limit in answer
    with urllib.request.urlopen(f"{server}/ping", timeout=10) as ping:
        assert ping.status == 200


def test_the_pyfunc_turns_bad_input_into_invalid_parameter_value(champion, digits: dict[str, list]) -> None:
    """In process, below MLflow's schema check: the model's own contract, whatever the caller."""
    import mlflow.pyfunc
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from tasks.models.registry import client_for

    settings, model = champion
    client_for(settings.tracking_uri)
    python_model = mlflow.pyfunc.load_model(model.uri).unwrap_python_model()
    with pytest.raises(MlflowException) as caught:
        python_model.predict(None, pd.DataFrame({"image": [digits["png"][0], b"GIF89a, no more"]}))
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE" and caught.value.get_http_status_code() == 400
    assert caught.value.message.startswith("image 1: not a decodable image")
    cause = caught.value.__cause__
    assert type(cause).__name__ == "ImageDecodeError" and isinstance(cause, ValueError)
    assert type(cause).__module__.startswith("_cd4ml_runtime_")  # the runtime bundled in the model, not the project's
    for bad in (pd.DataFrame({"picture": [b""]}), [digits["png"][0]]):
        with pytest.raises(MlflowException, match="column 'image'") as caught:
            python_model.predict(None, bad)
        assert caught.value.get_http_status_code() == 400
    with pytest.raises(MlflowException, match="image 0: text that is not base64"):
        python_model.predict(None, pd.DataFrame({"image": ["not base64 at all!"]}))


def test_cd4ml_serve_without_a_champion_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "empty-home"
    home.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CD4ML_"))}
    env.update({"CD4ML_HOME": str(home), "CD4ML_ENV": "sit"})
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tasks.cli", "serve", "--port", str(port)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cd4ml serve: sit has no champion"), done.stderr
    assert str(home / "mlflow.db") in lines[0] and "train and promote" in lines[0]
    assert done.stdout == ""  # nothing was served, not even announced
    assert not any(home.iterdir())  # and nothing was created: no MLflow store in a mistyped home
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert elapsed < 30, elapsed  # about 2 s: no MLflow, no torch, no server start


def test_cd4ml_serve_with_a_store_but_no_champion_exits_1_before_starting(
    cd4ml_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tasks.serving.serve as serve_module
    from tasks.cli import main
    from tasks.models.registry import mlflow_client
    from tasks.settings import load_settings

    mlflow_client(load_settings()).search_registered_models()  # the store exists, the model does not

    def never(*args: Any) -> None:
        raise AssertionError(f"the server was started: {args[1]}")

    monkeypatch.setattr(serve_module.os, "execve", never)
    assert main(["serve", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("cd4ml serve: sit has no champion: digits-classifier-sit@champion does not exist"), err


def test_the_server_command_pins_the_version_and_the_store() -> None:
    from tasks.serving.serve import request_body, server_command, server_env
    from tasks.settings import load_settings

    settings = load_settings(home="/tmp/cd4ml-serve-command")
    command = server_command(settings, "0.0.0.0", 5009, 2)
    assert command[1:] == ["-m", "uvicorn", "--host", "0.0.0.0", "--port", "5009", "--workers", "2",
                           "--factory", "tasks.serving.guard:create_app"]
    before = dict(os.environ)
    env = server_env(settings, base={"PATH": "/usr/bin"}, model_folder="/tmp/cd4ml-serve-x/model")
    assert env["MLFLOW_TRACKING_URI"] == env["MLFLOW_REGISTRY_URI"] == settings.tracking_uri
    # the server loads the verified local copy, never the registry URI (which could change after the check)
    assert env["CD4ML_SERVE_MODEL_URI"] == "/tmp/cd4ml-serve-x/model"
    assert env["CD4ML_SERVE_MAX_REQUEST_BYTES"] == str(settings.serving.max_request_bytes)
    assert env["CD4ML_SERVE_MAX_PIXELS"] == str(settings.ingest.max_pixels)
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]  # this venv's tools first
    assert dict(os.environ) == before  # only the child gets the URIs (tasks.models.registry.client_for)
    assert request_body([b"\x89PNG"]) == {"dataframe_split": {"columns": ["image"], "data": [["iVBORw=="]]}}
    with pytest.raises(ValueError, match="workers"):
        server_command(settings, "127.0.0.1", 5001, 0)
