"""What crosses into a training process and what comes back, as JSON files.

A ``WorkerRequest`` is everything one training process needs: ``tasks.training.train`` hands
it to ``run_worker`` in this process, or writes it as ``request.json`` for torchrun ranks (and
the same inside a Kubernetes trainer pod). Rank 0 returns a ``WorkerOutcome``; under torchrun
it leaves it as ``result.json`` beside the request.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write-then-rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


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
        _write_atomic(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> WorkerRequest:
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class WorkerOutcome:
    """What rank 0 reports once training ends (other ranks report nothing)."""

    mlflow_run_id: str
    epochs_run: int
    best_epoch: int
    metrics: dict[str, float]
    model_uri: str | None
    stopped_by_callback: bool
    resumed_from_epoch: int
    world_size: int
    device: str

    def write(self, path: Path) -> None:
        _write_atomic(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> WorkerOutcome:
        return cls(**json.loads(path.read_text()))
