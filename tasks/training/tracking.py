"""Rank 0's MLflow run of one training process: opened or resumed, each epoch logged once, closed with the model.

A process killed mid-run and started again with the same request keeps logging into the same
MLflow run; epochs it had logged are not logged twice. Only rank 0 talks to MLflow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import mlflow
import pandas as pd
import torch
from mlflow import MlflowClient
from mlflow.data.delta_dataset_source import DeltaDatasetSource
from mlflow.exceptions import MlflowException
from torch import nn

from tasks.models.registry import TAG_MODEL_URI
from tasks.settings import TrainingSettings
from tasks.training.data_cache import CachedSplits, load_cache
from tasks.training.device import DevicePlan
from tasks.training.model import log_pyfunc_model
from tasks.training.request import WorkerRequest

log = logging.getLogger(__name__)

TAG_EPOCHS_RUN = "cd4ml.epochs_run"
TAG_BEST_EPOCH = "cd4ml.best_epoch"
TAG_DEVICE = "cd4ml.device"


def _flat_params(cfg: TrainingSettings) -> dict[str, str]:
    return {k: str(v) for k, v in cfg.model_dump(mode="json").items() if not isinstance(v, dict)}


def _log_training_input(request: WorkerRequest) -> None:
    """The curated rows trained on, as an MLflow dataset pointing at the exact Delta version."""
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


class TrainingRun:
    """The open MLflow run and the epochs it already holds."""

    def __init__(self, run_id: str, logged: set[int]) -> None:
        self.run_id, self.logged = run_id, logged

    @classmethod
    def open(
        cls, request: WorkerRequest, cfg: TrainingSettings, client: MlflowClient, existing: str | None, stack: ExitStack,
        extra: dict[str, str],
    ) -> TrainingRun:
        """Resume ``existing`` (a checkpointed attempt's run) or start a new run, closed by ``stack``."""
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
            return cls(existing, logged)
        run = stack.enter_context(
            mlflow.start_run(
                experiment_id=request.experiment_id,
                run_name=request.run_name,
                tags={**request.tags, **extra},
                parent_run_id=request.parent_run_id,
            )
        )
        mlflow.log_params({**_flat_params(cfg), **request.params})
        _log_training_input(request)
        return cls(run.info.run_id, set())

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        """An epoch's metrics, unless this run already has them (a resumed attempt)."""
        if epoch not in self.logged:
            mlflow.log_metrics(metrics, step=epoch)
            self.logged.add(epoch)

    def finish(
        self, final: dict[str, float], epochs_run: int, best_epoch: int, model: nn.Module, arch: dict[str, Any],
        data: CachedSplits, plan: DevicePlan, log_model: bool, seen_images: Iterable[str] | None = None,
    ) -> str | None:
        """Final metrics and tags, and (``log_model``) the model as a pyfunc with what it saw; returns its URI."""
        mlflow.log_metrics({**final, "epochs_run": epochs_run, "best_epoch": best_epoch})
        model_uri = None
        if log_model:
            cpu_model = model.to("cpu", memory_format=torch.contiguous_format)
            info = log_pyfunc_model(
                cpu_model,
                arch=arch,
                classes=data.classes,
                spec=data.spec,
                example_images=data.examples,
                channels_last=plan.memory_format == torch.channels_last,
                seen_images=seen_images,
            )
            model_uri = info.model_uri
            mlflow.set_tag(TAG_MODEL_URI, model_uri)
        mlflow.set_tags({TAG_EPOCHS_RUN: str(epochs_run), TAG_BEST_EPOCH: str(best_epoch)})
        return model_uri
