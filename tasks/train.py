"""Train the classifier on one explicit version of the curated table and log it to MLflow.

* Input: ``curated_table`` at ``curated_version`` (time travel), never "latest". The train and
  val splits are decoded once into tensors, in sha256 order, so row order in the Delta files
  does not change the result.
* Deterministic: ``settings.training.seed`` seeds weights and shuffling; the thread count is
  fixed (``settings.training.num_threads``).
* Early stopping on val accuracy (``patience`` epochs without an improvement of more than
  ``min_delta``); the best epoch's weights are the ones logged.
* Idempotent: unless ``force``, a FINISHED run in this environment's experiment with the same
  curated table, curated version and training config hash is returned (``reused=True``)
  and nothing is trained.
"""

from __future__ import annotations

import copy
import logging
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from mlflow import MlflowClient
from mlflow.data.delta_dataset_source import DeltaDatasetSource
from torch import nn

from tasks import lake
from tasks.errors import DataError
from tasks.images import decode_batch
from tasks.model import build_model, log_pyfunc_model
from tasks.registry import (
    TAG_AIRFLOW_RUN_ID,
    TAG_CONFIG_HASH,
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    TAG_ENV,
    TAG_GIT_COMMIT,
    TAG_LOGICAL_DATE,
    TAG_MODEL_URI,
    TAG_RAW_VERSION,
    ensure_experiment,
    mlflow_client,
)
from tasks.settings import REPO_ROOT, Settings

log = logging.getLogger(__name__)

TAG_EPOCHS_RUN = "cd4ml.epochs_run"
TAG_BEST_EPOCH = "cd4ml.best_epoch"
# The final metrics a TrainResult carries (logged once, at the end of a run).
FINAL_METRICS = ("best_val_accuracy", "best_val_loss", "final_train_loss", "train_seconds")


class NoTrainingDataError(DataError, ValueError):
    """The curated version has no rows in a split that training needs."""


@dataclass(frozen=True)
class TrainResult:
    mlflow_run_id: str
    curated_table: str
    curated_version: int
    raw_version: int | None
    metrics: dict[str, float]
    epochs_run: int
    best_epoch: int
    model_uri: str
    reused: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def git_commit(timeout_s: float = 5.0) -> str | None:
    """The repository's HEAD commit, best effort: None without git, a repo or a commit."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else None


def raw_version_of(curated_table: str, curated_version: int) -> int | None:
    """The raw table version a curated version was built from (its commit's ``raw_version``)."""
    for commit in lake.history(curated_table):
        if commit.version == curated_version:
            value = commit.metadata.get("raw_version")
            try:
                return int(value) if value not in (None, "", "None") else None
            except ValueError:
                return None
    return None


def class_order(labels: list[str]) -> list[str]:
    """Classes in a stable order: numerically when every label is an integer, else as text."""
    unique = sorted(set(labels))
    if all(label.lstrip("-").isdigit() for label in unique):
        return sorted(unique, key=int)
    return unique


def load_split_rows(curated_table: str, curated_version: int, splits: tuple[str, ...]) -> pa.Table:
    """The rows of ``splits`` (sha256, image, label, split) at that exact version, in sha256 order."""
    table = lake.read(
        curated_table, curated_version, columns=["sha256", "image", "label", "split"], filter=[("split", "in", list(splits))]
    )
    return table.sort_by([("sha256", "ascending"), ("split", "ascending"), ("label", "ascending")])


def _find_reusable_run(
    client: MlflowClient, experiment_id: str, curated_table: str, curated_version: int, config_hash: str
) -> Any | None:
    runs = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.`{TAG_CURATED_TABLE}` = '{curated_table}' and "
            f"tags.`{TAG_CURATED_VERSION}` = '{curated_version}' and "
            f"tags.`{TAG_CONFIG_HASH}` = '{config_hash}' and "
            "attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time ASC"],
        max_results=20,
    )
    for run in runs:
        if run.data.tags.get(TAG_MODEL_URI):
            return run
    return None


def _result_from_run(run: Any, raw_version: int | None, reused: bool) -> TrainResult:
    tags, metrics = run.data.tags, run.data.metrics
    return TrainResult(
        mlflow_run_id=run.info.run_id,
        curated_table=tags[TAG_CURATED_TABLE],
        curated_version=int(tags[TAG_CURATED_VERSION]),
        raw_version=raw_version,
        metrics={k: float(metrics[k]) for k in FINAL_METRICS if k in metrics},
        epochs_run=int(tags[TAG_EPOCHS_RUN]),
        best_epoch=int(tags[TAG_BEST_EPOCH]),
        model_uri=tags[TAG_MODEL_URI],
        reused=reused,
    )


@dataclass
class _Fit:
    model: nn.Module
    epochs_run: int
    best_epoch: int
    best_val_accuracy: float
    best_val_loss: float
    final_train_loss: float


def _fit(
    settings: Settings, x_train: torch.Tensor, y_train: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, n_classes: int
) -> _Fit:
    cfg = settings.training
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, n_classes, cfg.image_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(cfg.seed)

    best_acc, best_loss, best_epoch = -1.0, float("inf"), 0
    best_state: dict[str, torch.Tensor] = {}
    stale, epoch, train_loss = 0, 0, float("nan")
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=shuffle)
        total = 0.0
        for start in range(0, len(order), cfg.batch_size):
            idx = order[start : start + cfg.batch_size]
            if len(idx) < 2 and len(order) > 1:  # batch norm cannot train on a single sample
                continue
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        train_loss = total / len(x_train)

        with torch.no_grad():
            model.eval()
            logits = torch.cat([model(x_val[i : i + 1024]) for i in range(0, len(x_val), 1024)])
            val_loss = float(loss_fn(logits, y_val))
            val_acc = float((logits.argmax(dim=1) == y_val).float().mean())
        mlflow.log_metrics({"train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc}, step=epoch)
        log.info("epoch %d: train_loss %.4f val_loss %.4f val_accuracy %.4f", epoch, train_loss, val_loss, val_acc)

        if val_acc > best_acc + cfg.min_delta:
            best_acc, best_loss, best_epoch, stale = val_acc, val_loss, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            stale += 1
            if stale >= max(cfg.patience, 1):
                log.info("early stop at epoch %d: no val improvement > %g for %d epochs", epoch, cfg.min_delta, stale)
                break
    model.load_state_dict(best_state)
    model.eval()
    return _Fit(model, epoch, best_epoch, best_acc, best_loss, train_loss)


def train(
    settings: Settings,
    curated_table: str,
    curated_version: int,
    run_id: str,
    logical_date: str,
    force: bool = False,
) -> TrainResult:
    """Train on ``curated_table`` at ``curated_version``; reuse an identical finished run unless ``force``."""
    cfg = settings.training
    curated_version = int(curated_version)
    config_hash = settings.section_hash("training")
    client = mlflow_client(settings)
    experiment_id = ensure_experiment(settings, client)
    raw_version = raw_version_of(curated_table, curated_version)

    if not force:
        existing = _find_reusable_run(client, experiment_id, curated_table, curated_version, config_hash)
        if existing is not None:
            log.info("reusing run %s (same curated version and training config)", existing.info.run_id)
            return _result_from_run(existing, raw_version, reused=True)

    rows = load_split_rows(curated_table, curated_version, ("train", "val"))
    split = rows["split"].to_pylist()
    labels = rows["label"].to_pylist()
    classes = class_order(labels)
    index = {c: i for i, c in enumerate(classes)}
    is_train = np.array([s == "train" for s in split])
    is_val = ~is_train
    if not is_train.any() or not is_val.any():
        raise NoTrainingDataError(
            f"{curated_table}@v{curated_version} has {int(is_train.sum())} train and {int(is_val.sum())} val rows; "
            "training needs both"
        )
    if len(classes) < 2:
        raise NoTrainingDataError(f"{curated_table}@v{curated_version} has a single class {classes}: nothing to learn")

    torch.set_num_threads(cfg.num_threads)
    images = rows["image"].to_pylist()
    pixels = torch.from_numpy(decode_batch(images, cfg.image_size))
    targets = torch.tensor([index[label] for label in labels], dtype=torch.long)
    train_mask, val_mask = torch.from_numpy(is_train), torch.from_numpy(is_val)
    x_train, y_train = pixels[train_mask], targets[train_mask]
    x_val, y_val = pixels[val_mask], targets[val_mask]

    tags = {
        TAG_ENV: settings.env,
        TAG_CURATED_TABLE: curated_table,
        TAG_CURATED_VERSION: str(curated_version),
        TAG_RAW_VERSION: "" if raw_version is None else str(raw_version),
        TAG_CONFIG_HASH: config_hash,
        TAG_LOGICAL_DATE: str(logical_date),
        TAG_AIRFLOW_RUN_ID: str(run_id),
    }
    commit = git_commit()
    if commit:
        tags[TAG_GIT_COMMIT] = commit

    started = time.perf_counter()
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"train-{logical_date}", tags=tags) as run:
        mlflow.log_params(
            {
                **cfg.model_dump(mode="json"),
                "registered_model_name": settings.registry.model_name,
                "classes": ",".join(classes),
                "n_train": int(is_train.sum()),
                "n_val": int(is_val.sum()),
            }
        )
        meta = pd.DataFrame({"sha256": rows["sha256"].to_pylist(), "label": labels, "split": split})
        dataset = mlflow.data.from_pandas(
            meta,
            source=DeltaDatasetSource(path=curated_table, delta_table_version=curated_version),
            name=f"curated_images@v{curated_version}",
            targets="label",
        )
        mlflow.log_input(
            dataset,
            context="training",
            tags={"delta_table": curated_table, "delta_table_version": str(curated_version), "splits": "train,val"},
        )

        fit = _fit(settings, x_train, y_train, x_val, y_val, len(classes))
        seconds = time.perf_counter() - started
        final = {
            "best_val_accuracy": fit.best_val_accuracy,
            "best_val_loss": fit.best_val_loss,
            "final_train_loss": fit.final_train_loss,
            "train_seconds": round(seconds, 3),
        }
        mlflow.log_metrics({**final, "epochs_run": fit.epochs_run, "best_epoch": fit.best_epoch})

        example = [images[i] for i in np.flatnonzero(is_val)[:2]]
        info = log_pyfunc_model(
            fit.model, architecture=cfg.model, classes=classes, image_size=cfg.image_size, example_images=example
        )
        mlflow.set_tags(
            {TAG_MODEL_URI: info.model_uri, TAG_EPOCHS_RUN: str(fit.epochs_run), TAG_BEST_EPOCH: str(fit.best_epoch)}
        )
        run_id_ = run.info.run_id
    log.info(
        "trained run %s on %s@v%d: best val_accuracy %.4f at epoch %d/%d (%.1fs)",
        run_id_, curated_table, curated_version, fit.best_val_accuracy, fit.best_epoch, fit.epochs_run, seconds,
    )
    return TrainResult(
        mlflow_run_id=run_id_,
        curated_table=curated_table,
        curated_version=curated_version,
        raw_version=raw_version,
        metrics={k: float(v) for k, v in final.items()},
        epochs_run=fit.epochs_run,
        best_epoch=fit.best_epoch,
        model_uri=info.model_uri,
        reused=False,
    )
