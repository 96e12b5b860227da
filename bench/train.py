"""Images/s of the pipeline's training loop against a bare loop over in-memory tensors, in one run.

* pipeline: real digits in a curated Delta table -> ``ensure_cache`` (decoded once) ->
  ``train_loader`` (DistributedSampler shard, one gather per batch, pinned on CUDA) ->
  ``batches`` (uint8 -> float on the device, random shift, memory format) ->
  ``train_one_epoch`` (autocast bf16 + channels_last on CUDA, Adam, per-step LR schedule):
  the functions ``tasks.training.train`` runs, called the same way.
* bare: the same images already as a float32 tensor on the device, a random permutation,
  slicing, forward, backward, optimizer step. Same model, batch size, optimizer, thread count
  and device plan (autocast and memory format included), no data path at all.

Both loops are measured in alternating rounds (bare, pipeline, bare, ...) after a warm-up,
and the median of the rounds is reported, because the development machines are shared. On
CUDA, GPU utilisation is sampled with ``nvidia-smi`` while each loop runs.

Usage: python bench/train.py [--models small_cnn resnet18] [--rounds 3] [--batch-size 64]
(prints a Markdown table; target: pipeline >= 0.9x bare on CPU)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from tasks.data import lake  # noqa: E402
from tasks.settings import load_settings  # noqa: E402
from tasks.training.augment import augment_generator  # noqa: E402
from tasks.training.data_cache import ensure_cache, load_cache  # noqa: E402
from tasks.training.device import device_plan  # noqa: E402
from tasks.training.loader import set_epoch, train_loader  # noqa: E402
from tasks.training.loop import lr_factor, train_one_epoch  # noqa: E402
from tasks.training.model import build_model  # noqa: E402

# Steps measured per round: enough for ~1-3 s per round on one CPU thread.
DEFAULT_STEPS = {("cpu", "small_cnn"): 200, ("cpu", "resnet18"): 6, ("cuda", "small_cnn"): 600, ("cuda", "resnet18"): 300}


def write_digits_table(uri: str) -> int:
    """All real digits as a curated table (the columns training reads), 70/15/15 by index."""
    from tasks.data.sample_data import digits_arrays

    images, labels = digits_arrays()
    rows = []
    for i, (image, label) in enumerate(zip(images, labels)):
        buffer = io.BytesIO()
        Image.fromarray(image, mode="L").save(buffer, format="PNG")
        data = buffer.getvalue()
        bucket = i % 20
        split = "train" if bucket < 14 else "val" if bucket < 17 else "test"
        rows.append({"sha256": hashlib.sha256(data + bytes([i % 256])).hexdigest(), "image": data, "label": str(int(label)), "split": split})
    return lake.overwrite(uri, pa.Table.from_pylist(rows), metadata={"step": "bench"})


class GpuSampler:
    """GPU utilisation (%) from nvidia-smi every 100 ms while active; empty on CPU."""

    def __init__(self, index: int | None) -> None:
        self.index, self.samples, self._stop = index, [], threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if self.index is not None and shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        query = ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            done = subprocess.run(query, capture_output=True, text=True, check=False)
            if done.returncode == 0 and done.stdout.strip().isdigit():
                self.samples.append(int(done.stdout.strip()))
            self._stop.wait(0.1)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model_name: str, cache_path: str, batch_size: int, steps: int, rounds: int) -> dict[str, object]:
    settings = load_settings()
    cfg = settings.training.model_copy(update={"model": model_name, "batch_size": batch_size})
    torch.set_num_threads(cfg.num_threads)
    plan = device_plan(cfg.device, cfg.amp, cfg.channels_last)
    data = load_cache(cache_path)
    n_classes = len(data.classes)

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(cfg.seed)
        model = build_model(model_name, n_classes, cfg.image_size).to(plan.device, memory_format=plan.memory_format)
        return model, torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    # Pipeline: the loader, augmentation and epoch function tasks.training.train runs.
    p_model, p_opt = fresh()
    loader = train_loader(data.x_train, data.y_train, batch_size, cfg.seed, 0, 1, plan, cfg.num_workers)
    scheduler = torch.optim.lr_scheduler.LambdaLR(p_opt, lr_factor(cfg.model_copy(update={"epochs": 10_000}), len(loader)))
    epoch = [0]

    def pipeline(n_steps: int) -> int:
        images, left = 0, n_steps
        while left > 0:
            epoch[0] += 1
            set_epoch(loader, epoch[0])
            gen = augment_generator(plan, cfg.seed, epoch[0], 0)
            _, seen = train_one_epoch(p_model, loader, p_opt, scheduler, plan, cfg.augment_shift, gen, max_steps=left)
            images += seen
            left -= -(-seen // batch_size)
        return images

    # Bare: float32 tensors already on the device, nothing between them and the model.
    b_model, b_opt = fresh()
    x_all = data.x_train.float().div(255).to(plan.device).contiguous(memory_format=plan.memory_format)
    y_all = data.y_train.to(plan.device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def bare(n_steps: int) -> int:
        b_model.train()
        images, done = 0, 0
        while done < n_steps:
            order = torch.randperm(len(y_all), device=plan.device)
            for start in range(0, len(order) - batch_size + 1, batch_size):
                if done == n_steps:
                    break
                idx = order[start : start + batch_size]
                with plan.autocast():
                    loss = loss_fn(b_model(x_all[idx]), y_all[idx])
                b_opt.zero_grad(set_to_none=True)
                loss.backward()
                b_opt.step()
                images += len(idx)
                done += 1
        return images

    gpu = plan.device.index if plan.device.type == "cuda" else None
    warm = max(2, steps // 10)
    bare(warm)
    pipeline(warm)
    rates: dict[str, list[float]] = {"bare": [], "pipeline": []}
    utils: dict[str, list[float]] = {"bare": [], "pipeline": []}
    for _ in range(rounds):
        for name, loop in (("bare", bare), ("pipeline", pipeline)):
            _sync(plan.device)
            with GpuSampler(gpu) as sampler:
                start = time.perf_counter()
                images = loop(steps)
                _sync(plan.device)
                elapsed = time.perf_counter() - start
            rates[name].append(images / elapsed)
            if sampler.mean() is not None:
                utils[name].append(sampler.mean())  # type: ignore[arg-type]
    device_name = torch.cuda.get_device_name(plan.device) if plan.device.type == "cuda" else f"CPU ({cfg.num_threads} thread)"
    bare_rate, pipe_rate = statistics.median(rates["bare"]), statistics.median(rates["pipeline"])
    return {
        "model": model_name,
        "device": device_name,
        "plan": plan.describe(),
        "batch": batch_size,
        "steps": steps,
        "bare": bare_rate,
        "pipeline": pipe_rate,
        "ratio": pipe_rate / bare_rate,
        "gpu_bare": statistics.mean(utils["bare"]) if utils["bare"] else None,
        "gpu_pipeline": statistics.mean(utils["pipeline"]) if utils["pipeline"] else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["small_cnn", "resnet18"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, help="steps per round (default depends on device and model)")
    args = parser.parse_args()

    settings = load_settings()
    workdir = Path(tempfile.mkdtemp(prefix="cd4ml-bench-train-"))
    try:
        table = str(workdir / "curated_images")
        version = write_digits_table(table)
        started = time.perf_counter()
        cache_path = ensure_cache(str(workdir / "cache"), table, version, settings.training.image_size)
        decode_s = time.perf_counter() - started
        device = "cuda" if device_plan(settings.training.device, True, True).device.type == "cuda" else "cpu"
        rows = [
            measure(m, cache_path, args.batch_size, args.steps or DEFAULT_STEPS[(device, m)], args.rounds) for m in args.models
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"Train and val splits decoded once into the cache in {decode_s:.2f} s; torch {torch.__version__}, "
          f"image size {settings.training.image_size}, median of {args.rounds} rounds.\n")
    print("| model | device | plan | batch | steps/round | bare img/s | pipeline img/s | pipeline/bare | GPU util bare | GPU util pipeline |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        def pct(v: object) -> str:
            return "-" if v is None else f"{v:.0f}%"

        print(
            f"| {r['model']} | {r['device']} | {r['plan']} | {r['batch']} | {r['steps']} | {r['bare']:,.0f} | "
            f"{r['pipeline']:,.0f} | {r['ratio']:.2f}x | {pct(r['gpu_bare'])} | {pct(r['gpu_pipeline'])} |"
        )


if __name__ == "__main__":
    main()
