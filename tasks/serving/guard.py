"""The REST server's front door: request limits in front of MLflow's scoring app (``cd4ml serve``).

``cd4ml serve`` runs ``uvicorn --factory tasks.serving.guard:create_app``: MLflow's own scoring
app (``mlflow.pyfunc.scoring_server.init``, the same endpoints and answers as ``mlflow models
serve``) for the pinned model, wrapped in ``RequestLimits``, which reads each ``POST`` body
itself first:

* a body longer than ``serving.max_request_bytes`` is **HTTP 413** as soon as that is known: at
  once from a ``Content-Length`` header (nothing of the body is read), or when a chunked body
  crosses the limit (the rest is not read);
* a body that is not ``application/json`` is **HTTP 415**: MLflow would also parse CSV and
  Parquet, whose images this screen does not read;
* an ``image`` whose header declares more than ``ingest.max_pixels`` pixels is **HTTP 400**
  naming its position and size, before any decoder sees it: a 12000x12000 PNG compresses to
  a few hundred kB and would take gigabytes to decode. The size comes from the header
  (``tasks.data.images.screen``: ``tasks/data/headers.py`` for PNG and JPEG, Pillow's lazy
  open otherwise, which reads no pixels).

Everything else (bad JSON, bad base64, a missing ``image`` column) passes through untouched and
gets MLflow's and the model's own answers. The settings reach the worker processes through
``CD4ML_SERVE_*`` environment variables (``tasks.serving.serve.server_env``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from tasks.data.images import screen

ENV_MODEL_URI = "CD4ML_SERVE_MODEL_URI"
ENV_MAX_BYTES = "CD4ML_SERVE_MAX_REQUEST_BYTES"
ENV_MAX_PIXELS = "CD4ML_SERVE_MAX_PIXELS"
IMAGE_COLUMN = "image"

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequestLimits:
    """ASGI middleware: a POST body over ``max_bytes`` is 413, an image over ``max_pixels`` is 400."""

    def __init__(self, app: App, max_bytes: int, max_pixels: int) -> None:
        self.app, self.max_bytes, self.max_pixels = app, max_bytes, max_pixels

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _answer(send, 413, "REQUEST_TOO_LARGE",
                          f"request body of {declared} bytes exceeds serving.max_request_bytes {self.max_bytes}")
            return
        body = await self._body(receive, send)  # read (within the limit) even when refused: a clean answer
        if body is None:
            return
        if _header(scope, b"content-type").split(";")[0].strip().lower() != "application/json":
            # MLflow also parses CSV and Parquet, whose images this screen would not see
            await _answer(send, 415, "UNSUPPORTED_MEDIA_TYPE",
                          "POST /invocations takes Content-Type: application/json (dataframe_split of base64 images)")
            return
        problem = image_problem(body, self.max_pixels)
        if problem:
            await _answer(send, 400, "INVALID_PARAMETER_VALUE", problem)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once it crossed the limit (answered 413) or the client left."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _answer(send, 413, "REQUEST_TOO_LARGE",
                              f"request body exceeds serving.max_request_bytes {self.max_bytes}")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _header(scope: Scope, wanted: bytes) -> str:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return value.decode("latin-1")
    return ""


def _content_length(scope: Scope) -> int | None:
    try:
        return int(_header(scope, b"content-length"))
    except ValueError:
        return None  # none (chunked), or malformed: the server itself refuses that


def _replay(body: bytes, live: Receive) -> Receive:
    """A ``receive`` that hands the already read body to the wrapped app, then the connection's own
    (which tells a disconnect when the client leaves)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await live()

    return receive


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    """An error in MLflow's own shape: ``{"error_code": ..., "message": ...}``."""
    payload = json.dumps({"error_code": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


def image_problem(body: bytes, max_pixels: int) -> str | None:
    """``image <i>: <w>x<h> exceeds max_pixels <n>`` for the first image over the limit, else None."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON (or absurdly nested): MLflow answers it
    for position, text in enumerate(_images(document)):
        try:
            data = base64.decodebytes(text.encode("utf-8"))
        except (binascii.Error, UnicodeEncodeError):
            continue  # the model names bad base64 itself
        rejection = screen(data, min_side=1, max_side=1 << 31, max_pixels=max_pixels)
        if rejection is not None and rejection.code == "too_many_pixels":
            return f"image {position}: {rejection.detail}"
    return None


def _images(document: Any) -> Iterator[str]:
    """The base64 strings of the ``image`` column in MLflow's JSON forms (split, records, inputs, instances)."""
    if not isinstance(document, dict):
        return
    split = document.get("dataframe_split")
    if isinstance(split, dict) and isinstance(split.get("columns"), list) and IMAGE_COLUMN in split["columns"]:
        column = split["columns"].index(IMAGE_COLUMN)
        for row in split.get("data") or ():
            if isinstance(row, list) and len(row) > column and isinstance(row[column], str):
                yield row[column]
    for key in ("dataframe_records", "inputs", "instances"):
        yield from _image_values(document.get(key))


def _image_values(value: Any) -> Iterator[str]:
    rows = value if isinstance(value, list) else [value]
    for row in rows:
        if isinstance(row, dict):
            cell = row.get(IMAGE_COLUMN)
            for item in cell if isinstance(cell, list) else [cell]:
                if isinstance(item, str):
                    yield item


def create_app() -> RequestLimits:
    """uvicorn's factory: the pinned model behind MLflow's scoring app, behind the limits."""
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(os.environ[ENV_MODEL_URI])
    return RequestLimits(scoring_server.init(model), max_bytes=int(os.environ[ENV_MAX_BYTES]),
                         max_pixels=int(os.environ[ENV_MAX_PIXELS]))
