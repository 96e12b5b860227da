"""The checkpoint folder of one training task: ``last.pt`` plus small JSON sidecars.

``last.pt`` is rewritten after every epoch (atomic rename) with what ``TrainState`` saves;
``state.json`` names its epoch and MLflow run for anyone watching; ``run.json`` remembers the
MLflow run as soon as it is opened, so an attempt killed before its first checkpoint still
resumes into the same run.
"""

from __future__ import annotations

import json
import os
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.errors import DataError
from tasks.training.device import DevicePlan

LAST_CHECKPOINT = "last.pt"
RUN_FILE = "run.json"
STATE_FILE = "state.json"
# What a checkpoint may hold besides tensors and plain containers: numpy's generator state (a uint32
# array). Loading stays weights_only, so nothing else in the file can name code to run.
# An array's own pickle names its rebuild function (numpy.core or, in numpy 2, numpy._core).
_NUMPY_STATE_GLOBALS = [np.zeros(0).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]


class CheckpointError(DataError):
    """A checkpoint holds more than tensors and the random generators' state: it is not loaded."""


def rng_state(plan: DevicePlan) -> dict[str, Any]:
    """Every random generator the process draws from (CUDA's too on a GPU)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if plan.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(plan.device)
    return state


def set_rng_state(state: dict[str, Any], plan: DevicePlan) -> None:
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
        try:
            with torch.serialization.safe_globals(_NUMPY_STATE_GLOBALS):
                return torch.load(path, map_location=device, weights_only=True)
        except pickle.UnpicklingError:  # names the file, never what it holds
            raise CheckpointError(f"{path} holds objects other than tensors and generator state: not loaded "
                                  "(delete the checkpoint folder to start the run afresh)") from None

    def save(self, state: dict[str, Any]) -> None:
        self._atomic(LAST_CHECKPOINT, lambda p: torch.save(state, p))
        summary = {"epoch": state["epoch"], "mlflow_run_id": state["mlflow_run_id"], "stop": state["stop"]}
        self._atomic(STATE_FILE, lambda p: p.write_text(json.dumps(summary)))

    def run_id(self) -> str | None:
        path = self.root / RUN_FILE
        return json.loads(path.read_text())["mlflow_run_id"] if path.exists() else None

    def remember_run(self, run_id: str) -> None:
        self._atomic(RUN_FILE, lambda p: p.write_text(json.dumps({"mlflow_run_id": run_id})))
