"""The epoch loop every training process runs, alone or as one rank of a DDP job, as named phases around one ``TrainState``.

* Each rank trains on its ``DistributedSampler`` shard; validation is sharded and summed with
  ``all_reduce``, so every rank sees the same metric and takes the same early-stopping
  decision (batch-norm statistics are averaged over ranks first, so all ranks validate the
  model that rank 0 logs). Only rank 0 talks to MLflow and writes checkpoints.
* The learning rate is ``learning_rate`` for ``base_batch_size``, scaled to the global batch
  (``batch_size * world_size``) by ``lr_scaling`` (linear, sqrt or none); warm-up then cosine,
  stepped per batch.
* A checkpoint after every epoch is the ``TrainState``: model, optimizer, scheduler, RNG states,
  early-stopping state, best weights, the per-epoch history and the MLflow run id. A process
  killed mid-run and started again with the same request resumes after the last finished
  epoch and keeps logging into the same MLflow run. Shuffling and augmentation depend only on
  (seed, epoch, rank), so the resumed run trains on exactly the batches an unbroken run would.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from mlflow import MlflowClient
from torch import nn
from torch.utils.data import DataLoader

from cd4ml_runtime.networks import build as build_network
from cd4ml_runtime.preprocess import PreprocessSpec
from tasks.models.loading import load_logged_weights
from tasks.models.registry import client_for
from tasks.models.seen_images import seen_by_model
from tasks.settings import Settings, TrainingSettings
from tasks.training.augment import Augment, augment_generator
from tasks.training.checkpoint import Checkpoints, rng_state, set_rng_state
from tasks.training.data_cache import CachedSplits, SplitStore, load_cache
from tasks.training.device import DevicePlan
from tasks.training.distributed import all_sum, average_buffers, wrap
from tasks.training.loader import batches, model_input, set_epoch, train_loader
from tasks.training.model import architecture, transfer_weights
from tasks.training.request import WorkerOutcome, WorkerRequest
from tasks.training.tracking import TAG_DEVICE, TrainingRun

log = logging.getLogger(__name__)

VAL_BATCH = 1024
CHECKPOINT_FORMAT = 1  # the keys of TrainState.to_checkpoint; a resumed attempt reads what the killed one wrote

# Called on rank 0 after each epoch with (epoch, metrics); True stops the run (a pruned trial).
EpochCallback = Callable[[int, dict[str, float]], bool]


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



@dataclass
class TrainState:
    """Everything the loop carries from one epoch to the next: what a checkpoint saves and a resume restores."""

    model: nn.Module  # unwrapped: the DDP wrapper shares its parameters
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stopper: EarlyStopping
    epoch: int = 0  # the last finished epoch
    best_weights: dict[str, torch.Tensor] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # {"epoch", "metrics"} per finished epoch
    seconds: float = 0.0  # epochs, validation included
    loop_seconds: float = 0.0  # training passes only: the throughput's denominator
    images: int = 0
    stop: bool = False
    stopped_by_callback: bool = False
    mlflow_run_id: str | None = None

    def to_checkpoint(self, plan: DevicePlan, world_size: int) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "early_stopping": asdict(self.stopper),
            "best_state": self.best_weights,
            "history": self.history,
            "rng": rng_state(plan),
            "seconds": self.seconds,
            "loop_seconds": self.loop_seconds,
            "images": self.images,
            "stop": self.stop,
            "stopped_by_callback": self.stopped_by_callback,
            "mlflow_run_id": self.mlflow_run_id,
            "world_size": world_size,
        }

    def restore(self, saved: dict[str, Any], plan: DevicePlan) -> None:
        """Continue from ``saved`` (``to_checkpoint``'s dict), random generators included."""
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.stopper = EarlyStopping(**saved["early_stopping"])
        self.best_weights, self.history = saved["best_state"], list(saved["history"])
        self.seconds, self.loop_seconds, self.images = saved["seconds"], saved["loop_seconds"], saved["images"]
        self.stop, self.stopped_by_callback = saved["stop"], saved.get("stopped_by_callback", False)
        self.mlflow_run_id = saved["mlflow_run_id"] or self.mlflow_run_id
        set_rng_state(saved["rng"], plan)
        self.epoch = int(saved["epoch"])

    def record(self, epoch: int, metrics: dict[str, float], seconds: float, loop_seconds: float, images: int) -> None:
        self.seconds += seconds
        self.loop_seconds += loop_seconds
        self.images += images
        self.history.append({"epoch": epoch, "metrics": metrics})
        self.epoch = epoch

    def final_metrics(self) -> dict[str, float]:
        return {
            "best_val_accuracy": self.stopper.best_accuracy,
            "best_val_loss": self.stopper.best_loss,
            "final_train_loss": self.history[-1]["metrics"]["train_loss"],
            "train_seconds": round(self.seconds, 3),
            "train_images_per_second": round(self.images / self.loop_seconds, 1) if self.loop_seconds > 0 else 0.0,
        }


@dataclass(frozen=True)
class _Setup:
    """What the loop runs with, fixed for the whole run."""

    request: WorkerRequest
    cfg: TrainingSettings
    plan: DevicePlan
    rank: int
    world: int
    data: CachedSplits
    arch: dict[str, Any]
    net: nn.Module  # the model, in DDP with more than one rank
    frozen: nn.Module | None  # a fine-tuned model's frozen backbone
    loader: DataLoader
    augment: Augment
    lr: float


def _build_model(request: WorkerRequest, settings: Settings, data: CachedSplits, plan: DevicePlan) -> tuple[dict[str, Any], nn.Module]:
    """The network, seeded, with the fine-tuning source's weights when there is one (checked first), on the device."""
    cfg = settings.training
    torch.manual_seed(cfg.seed)
    arch = architecture(cfg.model, len(data.classes), data.spec.size, data.spec.channels)
    model = build_network(arch)
    if request.finetune_uri:
        weights, meta = load_logged_weights(settings, request.finetune_uri)
        if meta["architecture"] != cfg.model:
            raise ValueError(f"finetune_from {request.finetune_uri} is a {meta['architecture']}, training.model is {cfg.model}")
        fresh = transfer_weights(model, weights, cfg.freeze_backbone)
        log.info("fine-tuning from %s; initialised fresh: %s", request.finetune_uri, fresh)
    return arch, model.to(plan.device, memory_format=plan.memory_format)


def _set_up(request: WorkerRequest, settings: Settings, plan: DevicePlan, rank: int, world: int) -> tuple[_Setup, TrainState]:
    """Data, model, optimizer, schedule and loader of a fresh run (epoch 0)."""
    cfg = settings.training
    data = load_cache(request.cache_path)
    arch, model = _build_model(request, settings, data, plan)
    net = wrap(model, plan, world)
    frozen = model.features if cfg.freeze_backbone and request.finetune_uri else None
    lr = scaled_learning_rate(cfg, world)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=cfg.weight_decay)
    loader = train_loader(data.train, data.y_train, cfg.batch_size, cfg.seed, rank, world, plan, cfg.num_workers)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, len(loader)))
    setup = _Setup(request, cfg, plan, rank, world, data, arch, net, frozen, loader, Augment.of(cfg), lr)
    return setup, TrainState(model, optimizer, scheduler, EarlyStopping(cfg.patience, cfg.min_delta))


def _resume(s: _Setup, state: TrainState, checkpoints: Checkpoints | None) -> int:
    """Continue from the last checkpoint, if any; returns the epoch resumed from (0: a fresh start)."""
    if checkpoints is None:
        return 0
    saved = checkpoints.load(s.plan.device)
    state.mlflow_run_id = checkpoints.run_id()
    if saved is None:
        return 0
    state.restore(saved, s.plan)
    if s.rank == 0:
        log.info("resuming from the checkpoint of epoch %d in %s", saved["epoch"], s.request.checkpoint_dir)
    return state.epoch


def _open_run(
    s: _Setup, state: TrainState, checkpoints: Checkpoints | None, client: MlflowClient, stack: ExitStack
) -> TrainingRun:
    """Rank 0's MLflow run, with the epochs a killed attempt checkpointed but never logged."""
    extra = {TAG_DEVICE: s.plan.describe(), "cd4ml.world_size": str(s.world), "cd4ml.effective_learning_rate": repr(s.lr)}
    run = TrainingRun.open(s.request, s.cfg, client, state.mlflow_run_id, stack, extra)
    state.mlflow_run_id = run.run_id
    if checkpoints:
        checkpoints.remember_run(run.run_id)
    for entry in state.history:
        run.log_epoch(entry["epoch"], entry["metrics"])
    return run


def _fit(s: _Setup, state: TrainState, epoch: int) -> tuple[torch.Tensor, int]:
    """One training pass over this rank's shard, shuffled and augmented for (seed, epoch, rank)."""
    set_epoch(s.loader, epoch)
    generator = augment_generator(s.plan, s.cfg.seed, epoch, s.rank)
    return train_one_epoch(
        s.net, s.loader, state.optimizer, state.scheduler, s.plan, s.augment, s.data.spec, generator, s.frozen
    )


def _measure(s: _Setup, state: TrainState, loss_sum: torch.Tensor, seen: int) -> tuple[dict[str, float], int]:
    """The epoch's metrics over all ranks (one all-reduce) and the images all ranks trained on."""
    average_buffers(state.model, s.world)
    val = evaluate_shard(state.model, s.data.val, s.data.y_val, s.data.spec, s.plan, s.rank, s.world)
    counts = torch.tensor([float(seen)], dtype=torch.float64, device=s.plan.device)
    totals = all_sum(torch.cat([loss_sum.double().reshape(1), counts, val]), s.world)
    train_loss_sum, n_seen, val_loss_sum, correct, n_val = totals.tolist()
    metrics = {
        "train_loss": train_loss_sum / max(n_seen, 1.0),
        "val_loss": val_loss_sum / n_val,
        "val_accuracy": correct / n_val,
        "learning_rate": float(state.scheduler.get_last_lr()[0]),
    }
    return metrics, int(n_seen)


def _decide(s: _Setup, state: TrainState, epoch: int, metrics: dict[str, float], callback: EpochCallback | None) -> None:
    """Early stopping, the best weights so far, and rank 0's callback: every rank takes the same decision."""
    improved, state.stop = state.stopper.update(epoch, metrics["val_accuracy"], metrics["val_loss"])
    if improved:
        state.best_weights = {k: v.detach().clone() for k, v in state.model.state_dict().items()}
    if s.rank == 0 and callback is not None and callback(epoch, metrics):
        state.stopped_by_callback = True
    flag = all_sum(torch.tensor([1.0 if state.stopped_by_callback else 0.0], device=s.plan.device), s.world)
    state.stopped_by_callback = bool(flag.item() > 0)
    state.stop = state.stop or state.stopped_by_callback


def _run_epochs(
    s: _Setup, state: TrainState, checkpoints: Checkpoints | None, run: TrainingRun | None, callback: EpochCallback | None
) -> None:
    """Epochs after ``state.epoch`` until ``epochs`` or a stop: fit, measure, decide, checkpoint, log."""
    for epoch in range(state.epoch + 1, 1 if state.stop else s.cfg.epochs + 1):
        started = time.perf_counter()
        loss_sum, seen = _fit(s, state, epoch)
        loop_time = time.perf_counter() - started
        metrics, images = _measure(s, state, loss_sum, seen)
        _decide(s, state, epoch, metrics, callback)
        state.record(epoch, metrics, time.perf_counter() - started, loop_time, images)
        if s.rank == 0 and checkpoints is not None:  # before logging: a kill in between replays the epoch
            checkpoints.save(state.to_checkpoint(s.plan, s.world))
        if run is not None:
            run.log_epoch(epoch, metrics)
            log.info(
                "epoch %d: train_loss %.4f val_loss %.4f val_accuracy %.4f (%.1fs)",
                epoch, metrics["train_loss"], metrics["val_loss"], metrics["val_accuracy"], loop_time,
            )
        if state.stop:
            if not state.stopped_by_callback and s.rank == 0:
                log.info("early stop at epoch %d: no val gain > %g for %d epochs", epoch, s.cfg.min_delta, state.stopper.stale)
            break


def _seen_images(settings: Settings, request: WorkerRequest, data: CachedSplits) -> set[str]:
    """Every image trained or validated on, the fine-tuning source's included (it learned from those too)."""
    seen = set(data.rows()["sha256"].to_pylist())
    if request.finetune_uri:
        seen |= seen_by_model(settings, request.finetune_uri)
    return seen


def train_rank(
    request: WorkerRequest, settings: Settings, plan: DevicePlan, rank: int, world: int, callback: EpochCallback | None = None
) -> WorkerOutcome | None:
    """Train as ``rank`` of ``world``: set up, resume, open the run, run the epochs, keep the best weights, log them.

    Rank 0 returns the outcome, other ranks None.
    """
    s, state = _set_up(request, settings, plan, rank, world)
    checkpoints = Checkpoints(request.checkpoint_dir) if request.checkpoint_dir else None
    resumed_from = _resume(s, state, checkpoints)
    client = client_for(request.tracking_uri)
    with ExitStack() as stack:
        run = _open_run(s, state, checkpoints, client, stack) if rank == 0 else None
        _run_epochs(s, state, checkpoints, run, callback)
        if state.best_weights is None:
            raise RuntimeError("no epoch finished: nothing to keep")
        state.model.load_state_dict(state.best_weights)
        state.model.eval()
        if run is None:
            return None
        final = state.final_metrics()
        best_epoch = state.stopper.best_epoch
        seen = _seen_images(settings, request, s.data) if request.log_model else None
        model_uri = run.finish(final, state.epoch, best_epoch, state.model, s.arch, s.data, plan, request.log_model, seen)
    return WorkerOutcome(
        mlflow_run_id=str(state.mlflow_run_id),
        epochs_run=state.epoch,
        best_epoch=best_epoch,
        metrics={k: float(v) for k, v in final.items()},
        model_uri=model_uri,
        stopped_by_callback=state.stopped_by_callback,
        resumed_from_epoch=resumed_from,
        world_size=world,
        device=plan.describe(),
    )
