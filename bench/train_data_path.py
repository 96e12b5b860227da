"""The training data path at scale: cache build, streamed batches and memory, on real colour photos.

Images: random crops (random position and size, 0.3-1 of the shorter side) of the seven packaged
colour photos (tasks.data.sample_data.photo_sources), resized to ``--source`` px and saved as JPEG
(quality 90), written into a curated Delta table (70% train, 15% val, 15% test by index).

Measured in one process per phase (peak RSS is the phase's own ``ru_maxrss``):

* build: ``ensure_cache`` (streamed scan, worker processes decoding, pwrite per row) against a
  bare loop calling ``cd4ml_runtime.preprocess.decode`` on every train/val image already in memory.
* epoch: one pass of ``train_loader`` over the on-disk cache (``num_workers`` 0 and 2), each batch
  turned into the model's normalised float input, against a bare loop that gathers the same
  batches from one uint8 tensor in memory and does the same conversion.
* train steps: the same two loops with ``--model`` (forward, backward, SGD step; one thread) for
  ``--steps`` batches: what the data path costs a training run.

Usage: python bench/train_data_path.py --images 100000 --size 64 [--source 96]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_table(uri: str, n: int, source: int, seed: int = 0) -> int:
    import hashlib

    import numpy as np
    import pyarrow as pa
    from PIL import Image

    from tasks.curation.curate import CURATED_SCHEMA
    from tasks.data import lake
    from tasks.data.sample_data import photo_sources

    photos = list(photo_sources().items())
    rng = np.random.default_rng(seed)
    version = None
    chunk = 5000
    for start in range(0, n, chunk):
        rows = []
        for i in range(start, min(n, start + chunk)):
            label, photo = photos[i % len(photos)]
            h, w = photo.shape[:2]
            side = int(rng.uniform(0.3, 1.0) * min(h, w))
            r, c = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            img = Image.fromarray(photo[r : r + side, c : c + side]).resize((source, source), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            data = buf.getvalue()
            bucket = i % 20
            split = "train" if bucket < 14 else "val" if bucket < 17 else "test"
            sha = hashlib.sha256(data + str(i).encode()).hexdigest()
            rows.append({"sha256": sha, "image": data, "label": label, "split": split,
                         "width": source, "height": source})
        table = pa.Table.from_pylist(rows, schema=CURATED_SCHEMA)
        if version is None:
            version = lake.overwrite(uri, table, metadata={"step": "bench"})
        else:
            from deltalake import write_deltalake

            write_deltalake(uri, table, mode="append")
            version = lake.current_version(uri)
    return int(version)


def phase_build(uri: str, version: int, size: int, cache: str) -> dict:
    from tasks.training.data_cache import ensure_cache

    started = time.perf_counter()
    path = ensure_cache(cache, uri, version, size, channels=3, fit="crop")
    return {"seconds": time.perf_counter() - started, "path": path}


def phase_bare_decode(uri: str, version: int, size: int) -> dict:
    from cd4ml_runtime.preprocess import PreprocessSpec, decode
    from tasks.data import lake

    spec = PreprocessSpec(3, size, "crop")
    images = lake.read(uri, version, columns=["image"], filter=[("split", "in", ["train", "val"])])["image"].to_pylist()
    started = time.perf_counter()
    for data in images:
        decode(data, spec)
    return {"seconds": time.perf_counter() - started, "images": len(images)}


def _epoch(loader, data, plan, model: str, steps: int) -> tuple[float, int]:
    """One pass (or ``steps`` batches with a model): each batch becomes the model's input (and a train step)."""
    import torch

    from tasks.training.loader import model_input, set_epoch
    from tasks.training.model import build_model

    net = opt = None
    if model != "none":
        torch.manual_seed(0)
        net = build_model(model, len(data.classes), data.spec.size, data.spec.channels).to(memory_format=plan.memory_format)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
    set_epoch(loader, 1)
    seen, started = 0, time.perf_counter()
    for step, (xb, yb) in enumerate(loader):
        x = model_input(xb, data.spec, plan)
        if net is not None:
            loss = torch.nn.functional.cross_entropy(net(x), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        seen += len(xb)
        if steps and step + 1 >= steps:
            break
    return time.perf_counter() - started, seen


def phase_epoch(path: str, workers: int, batch: int, model: str = "none", steps: int = 0) -> dict:
    import torch

    from tasks.training.data_cache import load_cache
    from tasks.training.device import device_plan
    from tasks.training.loader import train_loader

    torch.set_num_threads(1)
    data = load_cache(path)
    plan = device_plan("cpu", amp=False, channels_last=True)
    loader = train_loader(data.train, data.y_train, batch, 0, 0, 1, plan, num_workers=workers)
    seconds, seen = _epoch(loader, data, plan, model, steps)
    return {"seconds": seconds, "images": seen, "images_per_s": seen / seconds}


def phase_bare_epoch(path: str, batch: int, model: str = "none", steps: int = 0) -> dict:
    """The same batches gathered from one uint8 tensor holding the whole split in memory."""
    import numpy as np
    import torch

    from tasks.training.data_cache import load_cache
    from tasks.training.device import device_plan
    from tasks.training.loader import train_loader

    torch.set_num_threads(1)
    data = load_cache(path)
    x = torch.from_numpy(data.train.read(np.arange(len(data.train))))
    plan = device_plan("cpu", amp=False, channels_last=True)
    loader = train_loader(x, data.y_train, batch, 0, 0, 1, plan, num_workers=0)
    seconds, seen = _epoch(loader, data, plan, model, steps)
    return {"seconds": seconds, "images": seen, "images_per_s": seen / seconds}


def run_phase(name: str, *args: str) -> dict:
    """One phase in a fresh interpreter: its peak RSS is its own."""
    code = (f"import json, resource, sys; sys.path.insert(0, {str(REPO)!r}); import bench.train_data_path as b; "
            f"out = b.phase_{name}(*{coerce(list(args))!r}); "
            "out['peak_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; print(json.dumps(out))")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def coerce(args: list[str]) -> list:
    return [int(a) if a.isdigit() else a for a in args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--size", type=int, default=64, help="training image size")
    parser.add_argument("--source", type=int, default=None, help="stored image size (default: 1.5x --size)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--model", default="small_cnn", help="also time train steps with this network (none: skip)")
    parser.add_argument("--steps", type=int, default=40, help="train steps timed with the model")
    args = parser.parse_args()
    source = args.source or int(args.size * 1.5)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cd4ml-bench-datapath-"))
    uri = str(work / "curated")
    started = time.perf_counter()
    from tasks.data import lake

    reused = lake.current_version(uri)  # a workdir from an earlier run: same images, table not rebuilt
    version = reused if reused is not None else make_table(uri, args.images, source)
    made = time.perf_counter() - started
    shutil.rmtree(work / "cache", ignore_errors=True)
    build = run_phase("build", uri, str(version), str(args.size), str(work / "cache"))
    bare_decode = run_phase("bare_decode", uri, str(version), str(args.size))
    bare_epoch = run_phase("bare_epoch", build["path"], str(args.batch))
    epochs = {w: run_phase("epoch", build["path"], str(w), str(args.batch)) for w in (0, 2)}
    steps = {}
    if args.model != "none":
        steps["bare"] = run_phase("bare_epoch", build["path"], str(args.batch), args.model, str(args.steps))
        steps.update({w: run_phase("epoch", build["path"], str(w), str(args.batch), args.model, str(args.steps)) for w in (0, 2)})
    result = {
        "images": args.images, "size": args.size, "source": source, "batch": args.batch, "cpus": os.cpu_count(),
        "table_seconds": round(made, 1), "build": build, "bare_decode": bare_decode, "bare_epoch": bare_epoch,
        "epoch_workers_0": epochs[0], "epoch_workers_2": epochs[2],
        "build_vs_bare_decode": round(bare_decode["seconds"] / build["seconds"], 2),
        "epoch_vs_bare": {w: round(e["images_per_s"] / bare_epoch["images_per_s"], 2) for w, e in epochs.items()},
        "train_steps": steps,
        "train_steps_vs_bare": {w: round(steps[w]["images_per_s"] / steps["bare"]["images_per_s"], 2)
                                for w in (0, 2)} if steps else {},
    }
    out = REPO / "bench" / "results" / f"train_data_path_{args.images}x{args.size}.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
