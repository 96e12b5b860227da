"""The long fuzz run of every parser of untrusted bytes: the suite's targets (tests/factories/fuzzing.py), for minutes.

* Targets: the struct header readers (``tasks/data/headers.py``), scoring's header screen (those
  readers, else Pillow's lazy open), ingest's full decode (``prepare_image``), a CSV and a JSONL manifest (``tasks/data/sources.py`` over
  ``tasks/data/inputs.py``), a CSV and a JSONL feedback file (``tasks/serving/feedback.py``).
* Inputs: hypothesis' generation (no shrinking) from arbitrary bytes and mutated valid files
  (module doc of tests/factories/fuzzing.py), ``--seed`` fixed, for ``--seconds`` per target.
* A finding: any exception other than the parser's typed answer, or an answer a table cannot
  hold; its input is written to ``bench/results/fuzz-finding-<target>.bin`` and the target stops.
* Hang: the slowest single input is reported, with the median of three re-runs of it alone (2
  cores shared with other work: one slow moment is not a slow parser). Memory: the process's peak RSS over the target's
  run above its RSS at the start (Linux ``VmHWM``, reset per target through
  ``/proc/self/clear_refs``): any input a parser held whole, or a leak, would show. A first
  target runs no parser: hypothesis' own input rate and memory, the baseline of the others. (tracemalloc
  was measured to cut the input rate five-fold.)

Usage: python bench/fuzz.py [--seconds 60] [--seed 22] [--out bench/results/fuzz.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class _TimeUp(Exception):
    """The target's time is over (raised inside the property to stop hypothesis' generation)."""


def _run(name: str, strategy: Any, check: Callable[[bytes], None], warm: tuple[bytes, ...], seconds: float,
         seed: int) -> dict[str, Any]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    state: dict[str, Any] = {"inputs": 0, "slowest_ms": 0.0, "slowest": b"", "finding": None}

    @fixed_seed(seed)
    @settings(max_examples=10**9, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(data: bytes) -> None:
        if time.monotonic() > state["stop"]:
            raise _TimeUp
        started = time.perf_counter()
        try:
            check(data)
        except Exception as exc:
            state["finding"] = f"{type(exc).__name__}: {exc}"[:300]
            (REPO / "bench" / "results" / f"fuzz-finding-{name}.bin").write_bytes(data)
            raise
        took = (time.perf_counter() - started) * 1000
        if took > state["slowest_ms"]:
            state["slowest_ms"], state["slowest"] = took, data
        state["inputs"] += 1

    for data in (b"", *warm):  # warm-up outside the measure: first-call imports are neither slow inputs nor memory
        check(data)
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from the current RSS
    start_rss = _status_kib("VmRSS")
    started = time.monotonic()
    state["stop"] = started + seconds
    try:
        prop()
    except _TimeUp:
        pass
    except Exception:  # the finding is in state; hypothesis re-raised it
        pass
    finally:
        elapsed = time.monotonic() - started
        peak = _status_kib("VmHWM") - start_rss
    again = []  # the slowest input alone, three times: a slow parser, or a busy machine at that moment?
    for _ in range(3):
        started = time.perf_counter()
        check(state["slowest"])
        again.append((time.perf_counter() - started) * 1000)
    return {"target": name, "inputs": state["inputs"], "seconds": round(elapsed, 1),
            "inputs_per_s": round(state["inputs"] / elapsed, 1), "slowest_ms": round(state["slowest_ms"], 1),
            "slowest_again_ms": round(sorted(again)[1], 1), "slowest_bytes": len(state["slowest"]),
            "peak_rss_growth_mib": round(peak / 1024, 1), "finding": state["finding"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per target")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fuzz.json")
    args = parser.parse_args()

    from tests.factories import fuzzing as f

    warnings.simplefilter("ignore")  # Pillow warns on every damaged TIFF; a warning is not a finding
    work = Path(tempfile.mkdtemp(prefix="cd4ml-fuzz-"))
    root = work / "landing"
    (root / "x").mkdir(parents=True)
    images, manifests, feedback = f.image_seeds(), f.MANIFEST_SEEDS, f.FEEDBACK_SEEDS
    targets: list[tuple[str, Any, Callable[[bytes], None], tuple[bytes, ...]]] = [
        ("baseline_no_parser", f.image_inputs(), lambda d: None, images),  # hypothesis' own rate and memory
        ("headers", f.image_inputs(), f.check_headers, images),
        ("screen", f.image_inputs(), f.check_screen, images),
        ("prepare_image", f.image_inputs(), f.check_prepare, images),
        ("manifest_csv", f.text_inputs(manifests), lambda d: f.check_manifest(root, d, "csv"), manifests),
        ("manifest_jsonl", f.text_inputs(manifests), lambda d: f.check_manifest(root, d, "jsonl"), manifests),
        ("feedback_csv", f.text_inputs(feedback), lambda d: f.check_feedback(work / "f.csv", d), feedback),
        ("feedback_jsonl", f.text_inputs(feedback), lambda d: f.check_feedback(work / "f.jsonl", d), feedback),
    ]
    rows = []
    for name, strategy, check, warm in targets:
        row = _run(name, strategy, check, warm, args.seconds, args.seed)
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
              "seconds_per_target": args.seconds, "seed": args.seed, "targets": rows,
              "inputs": sum(r["inputs"] for r in rows), "findings": sum(1 for r in rows if r["finding"])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| target | inputs | seconds | inputs/s | slowest input (ms; alone) | peak RSS growth (MiB) | finding |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['target']} | {r['inputs']:,} | {r['seconds']} | {r['inputs_per_s']} | {r['slowest_ms']}; "
              f"{r['slowest_again_ms']} ({r['slowest_bytes']:,} B) | {r['peak_rss_growth_mib']} | {r['finding'] or 'none'} |")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
