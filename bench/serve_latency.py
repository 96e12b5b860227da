"""Latency of the champion behind MLflow's scoring server (``cd4ml serve``), against the same model in process.

* Champion: the one of ``--home`` (or ``CD4ML_HOME``) in ``CD4ML_ENV`` (default sit) when given;
  otherwise one built like the serving tests' (``tests/factories/champion.py``: real digits, 16 px grey,
  trained, gated and promoted in a temporary home).
* Server: ``python -m tasks.cli serve --port <free> --workers 1`` (the CLI resolves the champion,
  pins its version and execs ``mlflow models serve --env-manager local``). Time to the first
  ``GET /ping`` 200 is reported as start-up.
* Client: one keep-alive HTTP connection with ``TCP_NODELAY`` (as curl and urllib3 set it; plain
  ``http.client`` without it measures Nagle's algorithm against delayed ACKs: 50-60 ms a request), ``--n`` single-image ``POST /invocations`` sent one after
  another (real digit PNGs of the test split, cycled), after ``--warmup`` untimed ones; then one
  request carrying all ``--n`` images. Each time is the request's wall time at the client.
* Baseline: ``mlflow.pyfunc.load_model(<pinned uri>).predict`` on one-image DataFrames in this
  process, the same images, the same warm-up.

Usage: python bench/serve_latency.py [--n 300] [--warmup 20] [--home DIR] [--out bench/results/serve_latency.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _progress(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"n": len(ms), "mean_ms": round(statistics.fmean(ms), 2), "p50_ms": round(q[49], 2),
            "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2), "max_ms": round(max(ms), 2)}


def champion_of(home: str | None, scratch: Path) -> tuple[Any, Any, str]:
    """(settings, ServingModel, home) of the given home, or of a champion built like the tests'."""
    if home:
        from tasks.models.champion import serving_model
        from tasks.settings import load_settings

        settings = load_settings(home=home)
        return settings, serving_model(settings), str(Path(home).resolve())
    from tests.factories.champion import champion_home

    built = scratch / "champion-home"
    settings, model = champion_home(str(built))
    return settings, model, str(built)


def post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, dict[str, Any], float]:
    start = time.perf_counter()
    conn.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    return answer.status, json.loads(data), (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--home", default=os.environ.get("CD4ML_HOME"), help="a CD4ML_HOME with a champion")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "serve_latency.json"))
    args = parser.parse_args()

    import pandas as pd

    from tasks.serving.serve import request_body, server_env, server_process
    from tests.factories.digits import curated_rows

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cd4ml-bench-serve-") as tmp:
        scratch = Path(tmp)
        t0 = time.perf_counter()
        settings, model, home = champion_of(args.home, scratch)
        _progress(f"champion {model.uri} in {home} ({time.perf_counter() - t0:.1f} s)")
        test = [r for r in curated_rows() if r["split"] == "test"]
        picked = [test[i % len(test)] for i in range(args.n)]
        images = [r["image"] for r in picked]
        truth = [r["label"] for r in picked]

        port = free_port()
        env = server_env(settings)
        env.update({"CD4ML_HOME": home, "CD4ML_ENV": settings.env})
        command = [sys.executable, "-m", "tasks.cli", "serve", "--port", str(port), "--workers", "1"]
        log = scratch / "server.log"
        started = time.perf_counter()
        with server_process(command, env, f"http://127.0.0.1:{port}", log, cwd=REPO):
            startup_s = time.perf_counter() - started
            _progress(f"server up on :{port} in {startup_s:.1f} s; {args.warmup} warm-up + {args.n} requests")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.connect()  # TCP_NODELAY as curl and urllib3 set it: without it http.client's separate header and
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # body writes wait ~40 ms on delayed ACKs
            bodies = [json.dumps(request_body([img])).encode() for img in images]
            for body in bodies[: args.warmup]:
                post(conn, body)
            rest_ms, labels = [], []
            wall = time.perf_counter()
            for body in bodies:
                status, answer, ms = post(conn, body)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {answer}")
                rest_ms.append(ms)
                labels.append(answer["predictions"][0]["label"])
            rest_wall_s = time.perf_counter() - wall
            status, answer, batch_ms = post(conn, json.dumps(request_body(images)).encode())
            assert status == 200 and len(answer["predictions"]) == len(images), (status, str(answer)[:300])
            conn.close()
        announced = log.read_text(errors="replace").splitlines()[:3]  # what `cd4ml serve` printed

        _progress("in-process baseline")
        import mlflow.pyfunc

        from tasks.models.registry import client_for

        client_for(settings.tracking_uri)
        pyfunc = mlflow.pyfunc.load_model(model.uri)
        frames = [pd.DataFrame({"image": [img]}) for img in images]
        for frame in frames[: args.warmup]:
            pyfunc.predict(frame)
        local_ms = []
        wall = time.perf_counter()
        for frame in frames:
            start = time.perf_counter()
            pyfunc.predict(frame)
            local_ms.append((time.perf_counter() - start) * 1000)
        local_wall_s = time.perf_counter() - wall

    rest, local = percentiles(rest_ms), percentiles(local_ms)
    rest["throughput_per_s"] = round(args.n / rest_wall_s, 1)
    local["throughput_per_s"] = round(args.n / local_wall_s, 1)
    accuracy = sum(a == b for a, b in zip(labels, truth)) / len(truth)
    result = {
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg_before": [round(v, 2) for v in load_before],
                    "loadavg_after": [round(v, 2) for v in os.getloadavg()]},
        "model": {**model.to_dict(), "home": "temporary (tests/factories/champion.py)" if not args.home else home},
        "n": args.n, "warmup": args.warmup, "images": "real digit PNGs, test split (8x8 grey, model input 16 px)",
        "client": "one keep-alive connection, TCP_NODELAY, requests one after another",
        "server": {"command": "cd4ml serve --workers 1 (mlflow models serve --env-manager local)",
                   "startup_to_ping_s": round(startup_s, 1)},
        "rest_single_image": rest,
        "rest_one_request_of_n_images_ms": round(batch_ms, 1),
        "in_process_pyfunc_single_image": local,
        "rest_over_in_process_p50": round(rest["p50_ms"] / local["p50_ms"], 1),
        "rest_accuracy": round(accuracy, 4),
        "server_announced": announced,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    print("| path | n | p50 ms | p95 ms | p99 ms | mean ms | throughput /s |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, row in (("REST `POST /invocations`, 1 image", rest), ("in-process `pyfunc.predict`, 1 image", local)):
        print(f"| {name} | {row['n']} | {row['p50_ms']} | {row['p95_ms']} | {row['p99_ms']} | {row['mean_ms']} | "
              f"{row['throughput_per_s']} |")
    print(f"\nstart-up to /ping: {startup_s:.1f} s; one request of {args.n} images: {batch_ms:.0f} ms; "
          f"REST accuracy {accuracy:.1%}; load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
