"""A logged model's files, read back: its weights for transfer learning, its predictor for serving.

``load_predictor`` / ``opened_predictor`` run a model with the copy of ``cd4ml_runtime`` that was
logged inside it (the project's own for meta format 1), so scoring, serving, drift and the
monitor run exactly the code the model was gated with. ``load_logged_weights`` reads the state
dict and meta directly, importing no logged code.

Every load of a registered version first checks its files against the manifest recorded at
registration (``tasks.models.integrity``) and loads the checked copy; a mismatch is a
``ModelIntegrityError`` before any of its code is imported. A predictor is built only from a
registered version (``models:/<name>/<version>`` or ``@alias``); weights alone (no code runs,
``weights_only``) may also come from a run's URI, which has no manifest to check. ``ImageClassifierPyfunc`` is what models
logged before meta format 2 pickled by reference (as ``tasks.model.ImageClassifierPyfunc``).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import torch

import cd4ml_runtime
import cd4ml_runtime.pyfunc as runtime_pyfunc
from cd4ml_runtime.predictor import Predictor
from tasks.models.integrity import is_registry_uri, verified_model
from tasks.settings import Settings

RUNTIME_DIR = Path(cd4ml_runtime.__file__).resolve().parent


def _model_files(model_uri: str, local: Path) -> tuple[Path, Path, Path]:
    metas = sorted(local.rglob("model_meta.json"))
    states = sorted(local.rglob("state_dict.pt"))
    if not metas or not states:
        raise ValueError(f"{model_uri} is not a cd4ml image classifier (no model_meta.json/state_dict.pt)")
    return local, metas[0], states[0]


@contextlib.contextmanager
def _downloaded(settings: Settings, model_uri: str, verified_only: bool = True) -> Iterator[tuple[Path, Path, Path]]:
    """(model folder, model_meta.json, state_dict.pt) of a logged model, in a temporary folder, checked first.

    ``verified_only=False`` lets a URI that names no registered version through unchecked (weights only).
    """
    if verified_only or is_registry_uri(model_uri):
        with verified_model(settings, model_uri) as (local, _):
            yield _model_files(model_uri, local)
        return
    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp,
                                                         tracking_uri=settings.tracking_uri))
        yield _model_files(model_uri, local)


def load_logged_weights(settings: Settings, model_uri: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The state dict and meta of a model logged by ``log_pyfunc_model`` (any meta format).

    Reads the two artifacts directly instead of loading the pyfunc, so no logged code is
    imported into the training process.
    """
    with _downloaded(settings, model_uri, verified_only=False) as (_, meta_path, state_path):
        return torch.load(state_path, map_location="cpu", weights_only=True), json.loads(meta_path.read_text())


@contextlib.contextmanager
def opened_predictor(settings: Settings, model_uri: str) -> Iterator[tuple[Predictor, Path]]:
    """(predictor, folder of the runtime it runs) of a registered model version, kept for the block's duration.

    The runtime is the copy inside the model (the project's own ``cd4ml_runtime`` for format 1):
    a decode worker process imports that same folder (tasks/serving/decode_worker.py).
    """
    with _downloaded(settings, model_uri) as (local, meta_path, state_path):
        runtimes = sorted(p.parent for p in local.rglob("predictor.py") if p.parent.name == runtime_pyfunc.RUNTIME_ARTIFACT)
        module = runtime_pyfunc.load_bundled_runtime(runtimes[0]) if runtimes else None
        predictor = (module.Predictor if module is not None else Predictor).from_files(meta_path, state_path)
        yield predictor, (runtimes[0] if runtimes else RUNTIME_DIR)


def load_predictor(settings: Settings, model_uri: str) -> Predictor:
    """A registered version's predictor, run by the runtime copied into it (the project's own for format 1)."""
    with opened_predictor(settings, model_uri) as (predictor, _):
        return predictor


class ImageClassifierPyfunc(mlflow.pyfunc.PythonModel):
    """Models logged before meta format 2 pickled this class by reference: it serves them unchanged."""

    def load_context(self, context: Any) -> None:
        self.predictor = Predictor.from_files(context.artifacts["model_meta"], context.artifacts["state_dict"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self.predictor.predict_frame(model_input)
