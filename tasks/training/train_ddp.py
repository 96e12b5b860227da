"""One training process: the loop every launcher runs, alone or as one rank of a DDP job.

``run_worker`` is called directly by ``tasks.training.train.train`` (launcher ``in_process``) and by
``tasks.training.tune`` for each trial; under ``torchrun`` each rank runs
``python -m tasks.training.train_ddp --request <checkpoint_dir>/request.json`` (launcher ``torchrun``,
and the same inside a Kubernetes trainer pod). Same code, so a 2-process run on CPU tests
what a multi-GPU run does.

* Distributed when ``WORLD_SIZE`` > 1 (torchrun sets it): gloo on CPU, NCCL on CUDA. Each rank
  trains on its ``DistributedSampler`` shard; validation is sharded and summed with
  ``all_reduce``, so every rank sees the same metric and takes the same early-stopping
  decision (batch-norm statistics are averaged over ranks first, so all ranks validate the
  model that rank 0 logs). Only rank 0 talks to MLflow and writes checkpoints.
* The learning rate is ``learning_rate`` for ``base_batch_size``, scaled to the global batch
  (``batch_size * world_size``) by ``lr_scaling`` (linear, sqrt or none); warm-up then cosine,
  stepped per batch.
* A checkpoint after every epoch (atomic rename): model, optimizer, scheduler, RNG states,
  early-stopping state, best weights, the per-epoch history and the MLflow run id. A process
  killed mid-run and started again with the same request resumes after the last finished
  epoch and keeps logging into the same MLflow run; epochs it had logged are not logged twice.
  Shuffling and augmentation depend only on (seed, epoch, rank), so the resumed run trains on
  exactly the batches an unbroken run would.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from mlflow import MlflowClient
from mlflow.data.delta_dataset_source import DeltaDatasetSource
from mlflow.exceptions import MlflowException
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cd4ml_runtime.networks import build as build_network
from cd4ml_runtime.preprocess import PreprocessSpec
from tasks.models.loading import load_logged_weights
from tasks.models.registry import TAG_MODEL_URI, client_for
from tasks.settings import Settings, TrainingSettings
from tasks.training.model import architecture, log_pyfunc_model, transfer_weights
from tasks.training.train_data import (
    Augment,
    DevicePlan,
    SplitStore,
    augment_generator,
    batches,
    device_plan,
    load_cache,
    model_input,
    set_epoch,
    train_loader,
)

log = logging.getLogger(__name__)

LAST_CHECKPOINT = "last.pt"
RUN_FILE = "run.json"
STATE_FILE = "state.json"
RESULT_FILE = "result.json"
REQUEST_FILE = "request.json"
TAG_EPOCHS_RUN = "cd4ml.epochs_run"
TAG_BEST_EPOCH = "cd4ml.best_epoch"
TAG_DEVICE = "cd4ml.device"
VAL_BATCH = 1024

# Called on rank 0 after each epoch with (epoch, metrics); True stops the run (a pruned trial).
EpochCallback = Callable[[int, dict[str, float]], bool]


@dataclass(frozen=True)
class WorkerRequest:
    """Everything a training process needs, as JSON: it crosses into torchrun workers and pods."""

    settings: dict[str, Any]
    curated_table: str
    curated_version: int
    cache_path: str
    tracking_uri: str
    experiment_id: str
    run_name: str
    tags: dict[str, str]
    params: dict[str, str]
    checkpoint_dir: str | None = None
    parent_run_id: str | None = None
    log_model: bool = True
    finetune_uri: str | None = None

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> WorkerRequest:
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class WorkerOutcome:
    mlflow_run_id: str
    epochs_run: int
    best_epoch: int
    metrics: dict[str, float]
    model_uri: str | None
    stopped_by_callback: bool
    resumed_from_epoch: int
    world_size: int
    device: str


@dataclass
class EarlyStopping:
    """Stop after ``patience`` epochs without a val accuracy gain above ``min_delta``."""

    patience: int
    min_delta: float
    best_accuracy: float = -1.0
    best_loss: float = float("inf")
    best_epoch: int = 0
    stale: int = 0

    def update(self, epoch: int, accuracy: float, loss: float) -> tuple[bool, bool]:
        """(improved, stop) after ``epoch``."""
        if accuracy > self.best_accuracy + self.min_delta:
            self.best_accuracy, self.best_loss, self.best_epoch, self.stale = accuracy, loss, epoch, 0
            return True, False
        self.stale += 1
        return False, self.stale >= max(self.patience, 1)


def scaled_learning_rate(cfg: TrainingSettings, world_size: int) -> float:
    """``learning_rate`` is tuned for ``base_batch_size``; scale it to the global batch."""
    ratio = cfg.batch_size * world_size / cfg.base_batch_size
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[cfg.lr_scaling]
    return cfg.learning_rate * factor


def lr_factor(cfg: TrainingSettings, steps_per_epoch: int) -> Callable[[int], float]:
    """Per-step multiplier: linear warm-up over ``warmup_epochs``, then cosine to 0 at ``epochs`` (or constant)."""
    warmup = cfg.warmup_epochs * steps_per_epoch
    total = max(cfg.epochs * steps_per_epoch, 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.scheduler == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def train_one_epoch(
    net: nn.Module,
    loader: torch.utils.data.DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    plan: DevicePlan,
    augment: Augment,
    spec: PreprocessSpec,
    generator: torch.Generator,
    frozen: nn.Module | None = None,
    max_steps: int | None = None,
) -> tuple[torch.Tensor, int]:
    """One pass over this rank's shard; returns (summed loss on the device, images seen).

    The loss is accumulated on the device and read once per epoch: a ``float(loss)`` per step
    would make the host wait for the GPU every batch.
    """
    net.train()
    if frozen is not None:
        frozen.eval()  # a frozen backbone keeps its batch-norm statistics too
    loss_fn = nn.CrossEntropyLoss()
    total = torch.zeros((), device=plan.device)
    seen = 0
    for step, (x, y) in enumerate(batches(loader, plan, augment, spec, generator)):
        if max_steps is not None and step >= max_steps:
            break
        if len(y) < 2:  # batch norm cannot train on a single sample
            continue
        with plan.autocast():
            loss = loss_fn(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        total += loss.detach().float() * len(y)
        seen += len(y)
    return total, seen


@torch.no_grad()
def evaluate_shard(
    model: nn.Module, x: SplitStore, y: torch.Tensor, spec: PreprocessSpec, plan: DevicePlan, rank: int = 0, world_size: int = 1
) -> torch.Tensor:
    """[summed loss, correct, count] over this rank's strided shard of a split (sum over ranks = exact)."""
    model.eval()
    positions = np.arange(rank, len(y), world_size)
    out = torch.zeros(3, dtype=torch.float64, device=plan.device)
    for part, pixels in x.chunks(positions, VAL_BATCH):
        target = y[torch.from_numpy(part)].to(plan.device, non_blocking=plan.non_blocking)
        with plan.autocast():
            logits = model(model_input(torch.from_numpy(pixels), spec, plan))
        logits = logits.float()
        out[0] += nn.functional.cross_entropy(logits, target, reduction="sum").double()
        out[1] += (logits.argmax(dim=1) == target).sum().double()
        out[2] += len(target)
    return out


def _rng_state(plan: DevicePlan) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if plan.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(plan.device)
    return state


def _set_rng_state(state: dict[str, Any], plan: DevicePlan) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and plan.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], plan.device)


class Checkpoints:
    """The checkpoint folder of one training task: ``last.pt`` plus small JSON sidecars."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def _atomic(self, name: str, write: Callable[[Path], None]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.tmp-{os.getpid()}"
        write(tmp)
        os.replace(tmp, self.root / name)

    def load(self, device: torch.device) -> dict[str, Any] | None:
        path = self.root / LAST_CHECKPOINT
        if not path.exists():
            return None
        return torch.load(path, map_location=device, weights_only=False)  # our own file: RNG states need pickle

    def save(self, state: dict[str, Any]) -> None:
        self._atomic(LAST_CHECKPOINT, lambda p: torch.save(state, p))
        summary = {"epoch": state["epoch"], "mlflow_run_id": state["mlflow_run_id"], "stop": state["stop"]}
        self._atomic(STATE_FILE, lambda p: p.write_text(json.dumps(summary)))

    def run_id(self) -> str | None:
        path = self.root / RUN_FILE
        return json.loads(path.read_text())["mlflow_run_id"] if path.exists() else None

    def remember_run(self, run_id: str) -> None:
        self._atomic(RUN_FILE, lambda p: p.write_text(json.dumps({"mlflow_run_id": run_id})))


def _init_distributed(plan: DevicePlan) -> tuple[int, int, bool]:
    """(rank, world size, whether this call created the process group)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    dist.init_process_group(backend=plan.backend, timeout=timedelta(minutes=30))
    return dist.get_rank(), dist.get_world_size(), True


def _all_sum(values: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def _average_buffers(model: nn.Module, world_size: int) -> None:
    """Average batch-norm running statistics over ranks before evaluating.

    DDP keeps parameters identical but each rank updates its own running stats on its own
    shard; without this every rank would validate a slightly different model and the logged
    (rank 0) model would not score the all-reduced val accuracy.
    """
    if world_size <= 1:
        return
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer.div_(world_size)


def _flat_params(cfg: TrainingSettings) -> dict[str, str]:
    return {k: str(v) for k, v in cfg.model_dump(mode="json").items() if not isinstance(v, dict)}


def _open_run(
    request: WorkerRequest, cfg: TrainingSettings, client: MlflowClient, existing: str | None, stack: ExitStack, extra: dict[str, str]
) -> tuple[str, set[int]]:
    """Resume ``existing`` (a checkpointed attempt's run) or start a new run; returns its id and logged epochs."""
    if existing:
        try:
            client.get_run(existing)
        except MlflowException:
            log.warning("checkpointed MLflow run %s is gone: starting a new run", existing)
            existing = None
    if existing:
        stack.enter_context(mlflow.start_run(run_id=existing))
        logged = {m.step for m in client.get_metric_history(existing, "val_accuracy")}
        log.info("resuming MLflow run %s (epochs already logged: %s)", existing, sorted(logged))
        return existing, logged
    run = stack.enter_context(
        mlflow.start_run(
            experiment_id=request.experiment_id,
            run_name=request.run_name,
            tags={**request.tags, **extra},
            parent_run_id=request.parent_run_id,
        )
    )
    mlflow.log_params({**_flat_params(cfg), **request.params})
    meta = load_cache(request.cache_path).rows().to_pandas()
    dataset = mlflow.data.from_pandas(
        pd.DataFrame(meta),
        source=DeltaDatasetSource(path=request.curated_table, delta_table_version=int(request.curated_version)),
        name=f"curated_images@v{request.curated_version}",
        targets="label",
    )
    mlflow.log_input(
        dataset,
        context="training",
        tags={
            "delta_table": request.curated_table,
            "delta_table_version": str(request.curated_version),
            "splits": "train,val",
        },
    )
    return run.info.run_id, set()


def run_worker(request: WorkerRequest, callback: EpochCallback | None = None) -> WorkerOutcome | None:
    """Train as this process's rank; rank 0 returns the outcome, other ranks None."""
    settings = Settings.model_validate(request.settings)
    cfg = settings.training
    torch.set_num_threads(cfg.num_threads)
    plan = device_plan(cfg.device, cfg.amp, cfg.channels_last, int(os.environ.get("LOCAL_RANK", "0")))
    rank, world, owns_group = _init_distributed(plan)
    try:
        return _train(request, settings, plan, rank, world, callback)
    finally:
        if owns_group:
            dist.barrier()
            dist.destroy_process_group()


def _train(
    request: WorkerRequest, settings: Settings, plan: DevicePlan, rank: int, world: int, callback: EpochCallback | None
) -> WorkerOutcome | None:
    cfg = settings.training
    data = load_cache(request.cache_path)
    torch.manual_seed(cfg.seed)
    arch = architecture(cfg.model, len(data.classes), data.spec.size, data.spec.channels)
    model = build_network(arch)
    if request.finetune_uri:
        state, meta = load_logged_weights(request.finetune_uri)
        if meta["architecture"] != cfg.model:
            raise ValueError(f"finetune_from {request.finetune_uri} is a {meta['architecture']}, training.model is {cfg.model}")
        fresh = transfer_weights(model, state, cfg.freeze_backbone)
        log.info("fine-tuning from %s; initialised fresh: %s", request.finetune_uri, fresh)
    model = model.to(plan.device, memory_format=plan.memory_format)
    net: nn.Module = model
    if world > 1:
        # A conv weight with one input channel has a size-1 dim, so its gradient's stride there is
        # arbitrary: DDP warns although the memory order is the same. Nothing to fix.
        warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
        net = DistributedDataParallel(
            model,
            device_ids=[plan.device.index] if plan.device.type == "cuda" else None,
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy, one layout
        )
    frozen = model.features if cfg.freeze_backbone and request.finetune_uri else None
    lr = scaled_learning_rate(cfg, world)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=cfg.weight_decay)
    loader = train_loader(data.train, data.y_train, cfg.batch_size, cfg.seed, rank, world, plan, cfg.num_workers)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, len(loader)))
    stopper = EarlyStopping(cfg.patience, cfg.min_delta)
    augment = Augment.of(cfg)

    checkpoints = Checkpoints(request.checkpoint_dir) if request.checkpoint_dir else None
    saved = checkpoints.load(plan.device) if checkpoints else None
    start_epoch, resumed_from, history = 1, 0, []
    best_state: dict[str, torch.Tensor] | None = None
    seconds, loop_seconds, images, stop, stopped_by_callback = 0.0, 0.0, 0, False, False
    run_id = checkpoints.run_id() if checkpoints else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        stopper = EarlyStopping(**saved["early_stopping"])
        best_state, history = saved["best_state"], list(saved["history"])
        seconds, loop_seconds, images = saved["seconds"], saved["loop_seconds"], saved["images"]
        stop, stopped_by_callback = saved["stop"], saved.get("stopped_by_callback", False)
        run_id = saved["mlflow_run_id"] or run_id
        _set_rng_state(saved["rng"], plan)
        resumed_from = int(saved["epoch"])
        start_epoch = resumed_from + 1
        if rank == 0:
            log.info("resuming from the checkpoint of epoch %d in %s", saved["epoch"], request.checkpoint_dir)

    client = client_for(request.tracking_uri)
    with ExitStack() as stack:
        logged: set[int] = set()
        if rank == 0:
            extra = {
                TAG_DEVICE: plan.describe(),
                "cd4ml.world_size": str(world),
                "cd4ml.effective_learning_rate": repr(lr),
            }
            run_id, logged = _open_run(request, cfg, client, run_id, stack, extra)
            if checkpoints:
                checkpoints.remember_run(run_id)
            for entry in history:  # epochs a killed attempt checkpointed but never logged
                if entry["epoch"] not in logged:
                    mlflow.log_metrics(entry["metrics"], step=entry["epoch"])
                    logged.add(entry["epoch"])

        last_epoch = resumed_from
        for epoch in range(start_epoch, 1 if stop else cfg.epochs + 1):
            started = time.perf_counter()
            set_epoch(loader, epoch)
            generator = augment_generator(plan, cfg.seed, epoch, rank)
            loss_sum, seen = train_one_epoch(net, loader, optimizer, scheduler, plan, augment, data.spec, generator, frozen)
            loop_time = time.perf_counter() - started
            _average_buffers(model, world)
            val = evaluate_shard(model, data.val, data.y_val, data.spec, plan, rank, world)
            counts = torch.tensor([float(seen)], dtype=torch.float64, device=plan.device)
            totals = _all_sum(torch.cat([loss_sum.double().reshape(1), counts, val]), world)
            train_loss_sum, n_seen, val_loss_sum, correct, n_val = totals.tolist()
            metrics = {
                "train_loss": train_loss_sum / max(n_seen, 1.0),
                "val_loss": val_loss_sum / n_val,
                "val_accuracy": correct / n_val,
                "learning_rate": float(scheduler.get_last_lr()[0]),
            }
            improved, stop = stopper.update(epoch, metrics["val_accuracy"], metrics["val_loss"])
            if improved:
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if rank == 0 and callback is not None and callback(epoch, metrics):
                stopped_by_callback = True
            flag = _all_sum(torch.tensor([1.0 if stopped_by_callback else 0.0], device=plan.device), world)
            stopped_by_callback = bool(flag.item() > 0)
            stop = stop or stopped_by_callback
            seconds += time.perf_counter() - started
            loop_seconds += loop_time
            images += int(n_seen)
            history.append({"epoch": epoch, "metrics": metrics})
            last_epoch = epoch
            if rank == 0 and checkpoints is not None:
                checkpoints.save(
                    {
                        "format": 1,
                        "epoch": epoch,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "early_stopping": asdict(stopper),
                        "best_state": best_state,
                        "history": history,
                        "rng": _rng_state(plan),
                        "seconds": seconds,
                        "loop_seconds": loop_seconds,
                        "images": images,
                        "stop": stop,
                        "stopped_by_callback": stopped_by_callback,
                        "mlflow_run_id": run_id,
                        "world_size": world,
                    }
                )
            if rank == 0:
                if epoch not in logged:
                    mlflow.log_metrics(metrics, step=epoch)
                    logged.add(epoch)
                log.info(
                    "epoch %d: train_loss %.4f val_loss %.4f val_accuracy %.4f (%.1fs)",
                    epoch, metrics["train_loss"], metrics["val_loss"], metrics["val_accuracy"], loop_time,
                )
            if stop:
                if not stopped_by_callback and rank == 0:
                    log.info("early stop at epoch %d: no val gain > %g for %d epochs", epoch, cfg.min_delta, stopper.stale)
                break
        epochs_run = last_epoch
        if best_state is None:
            raise RuntimeError("no epoch finished: nothing to keep")
        model.load_state_dict(best_state)
        model.eval()
        if rank != 0:
            return None
        final = {
            "best_val_accuracy": stopper.best_accuracy,
            "best_val_loss": stopper.best_loss,
            "final_train_loss": history[-1]["metrics"]["train_loss"],
            "train_seconds": round(seconds, 3),
            "train_images_per_second": round(images / loop_seconds, 1) if loop_seconds > 0 else 0.0,
        }
        mlflow.log_metrics({**final, "epochs_run": epochs_run, "best_epoch": stopper.best_epoch})
        model_uri = None
        if request.log_model:
            cpu_model = model.to("cpu", memory_format=torch.contiguous_format)
            info = log_pyfunc_model(
                cpu_model,
                arch=arch,
                classes=data.classes,
                spec=data.spec,
                example_images=data.examples,
                channels_last=plan.memory_format == torch.channels_last,
            )
            model_uri = info.model_uri
            mlflow.set_tag(TAG_MODEL_URI, model_uri)
        mlflow.set_tags({TAG_EPOCHS_RUN: str(epochs_run), TAG_BEST_EPOCH: str(stopper.best_epoch)})
    return WorkerOutcome(
        mlflow_run_id=str(run_id),
        epochs_run=epochs_run,
        best_epoch=stopper.best_epoch,
        metrics={k: float(v) for k, v in final.items()},
        model_uri=model_uri,
        stopped_by_callback=stopped_by_callback,
        resumed_from_epoch=resumed_from,
        world_size=world,
        device=plan.describe(),
    )


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point: ``torchrun --nproc_per_node N -m tasks.training.train_ddp --request FILE``."""
    parser = argparse.ArgumentParser(prog="python -m tasks.training.train_ddp", description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True, help="request.json written by tasks.training.train")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s rank{os.environ.get('RANK', '0')} %(name)s: %(message)s")
    path = Path(args.request)
    outcome = run_worker(WorkerRequest.read(path))
    if outcome is not None:
        tmp = path.with_name(RESULT_FILE + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(asdict(outcome), indent=2))
        os.replace(tmp, path.with_name(RESULT_FILE))
    return 0


__all__ = ["EarlyStopping", "WorkerOutcome", "WorkerRequest", "run_worker", "train_one_epoch", "evaluate_shard"]

if __name__ == "__main__":
    sys.exit(main())
