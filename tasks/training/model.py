"""The classifier as the project trains and logs it; the networks and preprocessing live in ``cd4ml_runtime``.

* ``build_model(name, num_classes, image_size, in_channels)`` is the one seam where architectures
  are chosen by name (``settings.training.model``: ``small_cnn``, ``resnet18``, ``resnet50``);
  ``architecture(...)`` is the dict stored with the model so it rebuilds the same network.
* ``log_pyfunc_model`` logs the weights, a meta (format 2: classes, architecture, the full
  ``PreprocessSpec`` with the training split's channel statistics) and a copy of the
  ``cd4ml_runtime`` package as artifacts; the pyfunc class is pickled by value. The model
  therefore loads with ``mlflow.pyfunc.load_model`` in a process that has only the pip
  requirements, runs its own copy of the runtime in a process that has imported a newer
  project, and never adds the project to ``sys.path`` (models before format 2 bundled the whole
  ``tasks`` package as code: ``ImageClassifierPyfunc`` below still loads them).
* ``load_logged_weights`` and ``transfer_weights`` serve transfer learning from a registered model.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from torch import nn

import cd4ml_runtime
import cd4ml_runtime.pyfunc as runtime_pyfunc
from cd4ml_runtime import networks
from cd4ml_runtime.predictor import META_FORMAT, Predictor
from cd4ml_runtime.preprocess import PreprocessSpec

RUNTIME_DIR = Path(cd4ml_runtime.__file__).resolve().parent
MODEL_ARTIFACT_NAME = "model"
MODEL_NAMES: tuple[str, ...] = networks.NAMES


def architecture(name: str, num_classes: int, image_size: int, in_channels: int = 1) -> dict[str, Any]:
    """The architecture dict a model is built from and stored with (stem chosen by the image size)."""
    return networks.describe(name, num_classes, in_channels, image_size)


def build_model(name: str, num_classes: int, image_size: int, in_channels: int = 1) -> nn.Module:
    """A freshly initialised network by name (the RNG state decides the initial weights)."""
    return networks.build(architecture(name, num_classes, image_size, in_channels))


@contextlib.contextmanager
def _downloaded(model_uri: str) -> Iterator[tuple[Path, Path, Path]]:
    """(model folder, model_meta.json, state_dict.pt) of a logged model, in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
        metas = sorted(local.rglob("model_meta.json"))
        states = sorted(local.rglob("state_dict.pt"))
        if not metas or not states:
            raise ValueError(f"{model_uri} is not a cd4ml image classifier (no model_meta.json/state_dict.pt)")
        yield local, metas[0], states[0]


def load_logged_weights(model_uri: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The state dict and meta of a model logged by ``log_pyfunc_model`` (any meta format).

    Reads the two artifacts directly instead of loading the pyfunc, so no logged code is
    imported into the training process.
    """
    with _downloaded(model_uri) as (_, meta_path, state_path):
        return torch.load(state_path, map_location="cpu", weights_only=True), json.loads(meta_path.read_text())


def transfer_weights(model: nn.Module, state: dict[str, torch.Tensor], freeze_backbone: bool = False) -> list[str]:
    """Copy every pretrained tensor whose name and shape match; returns the names left as initialised.

    A new class list changes the head's shape, so the head starts fresh while the backbone
    keeps what it learned. ``freeze_backbone`` stops gradients into ``model.features``.
    """
    own = model.state_dict()
    matched = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    own.update(matched)
    model.load_state_dict(own)
    if freeze_backbone:
        for param in model.features.parameters():
            param.requires_grad_(False)
    return sorted(set(own) - set(matched))


@contextlib.contextmanager
def opened_predictor(model_uri: str) -> Iterator[tuple[Predictor, Path]]:
    """(predictor, folder of the runtime it runs) of a logged model, the folder kept for the block's duration.

    The runtime is the copy inside the model (the project's own ``cd4ml_runtime`` for format 1):
    a decode worker process imports that same folder (tasks/serving/decode_worker.py).
    """
    with _downloaded(model_uri) as (local, meta_path, state_path):
        runtimes = sorted(p.parent for p in local.rglob("predictor.py") if p.parent.name == runtime_pyfunc.RUNTIME_ARTIFACT)
        module = runtime_pyfunc.load_bundled_runtime(runtimes[0]) if runtimes else None
        predictor = (module.Predictor if module is not None else Predictor).from_files(meta_path, state_path)
        yield predictor, (runtimes[0] if runtimes else RUNTIME_DIR)


def load_predictor(model_uri: str) -> Predictor:
    """A logged model's predictor, run by the runtime copied into it (the project's own for format 1)."""
    with opened_predictor(model_uri) as (predictor, _):
        return predictor


class ImageClassifierPyfunc(mlflow.pyfunc.PythonModel):
    """Models logged before meta format 2 pickled this class by reference: it serves them unchanged."""

    def load_context(self, context: Any) -> None:
        self.predictor = Predictor.from_files(context.artifacts["model_meta"], context.artifacts["state_dict"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self.predictor.predict_frame(model_input)


def _pip_requirements() -> list[str]:
    import cloudpickle
    import PIL

    return [
        f"mlflow=={mlflow.__version__}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
        f"pillow=={PIL.__version__}",
        f"cloudpickle=={cloudpickle.__version__}",
    ]


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("binary", "image")]),
        outputs=Schema([ColSpec("string", "label"), ColSpec("double", "confidence")]),
    )


def model_meta(arch: dict[str, Any], classes: list[str], spec: PreprocessSpec, channels_last: bool = False) -> dict[str, Any]:
    return {
        "format": META_FORMAT,
        "classes": [str(c) for c in classes],
        "arch": dict(arch),
        "preprocess": spec.to_dict(),
        "channels_last": bool(channels_last),
        # format-1 readers (and people) still find these
        "architecture": arch["name"],
        "image_size": int(spec.size),
    }


def log_pyfunc_model(
    model: nn.Module,
    *,
    arch: dict[str, Any],
    classes: list[str],
    spec: PreprocessSpec,
    example_images: list[bytes],
    name: str = MODEL_ARTIFACT_NAME,
    channels_last: bool = False,
) -> Any:
    """Log ``model`` as a self-contained pyfunc in the active run; returns the ModelInfo (module doc)."""
    import cloudpickle

    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        root = Path(tmp)
        state_path = root / "state_dict.pt"
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, state_path)
        meta_path = root / "model_meta.json"
        meta_path.write_text(json.dumps(model_meta(arch, classes, spec, channels_last), indent=2))
        runtime = root / "runtime"
        runtime.mkdir()
        for source in sorted(RUNTIME_DIR.glob("*.py")):
            shutil.copy2(source, runtime / source.name)
        cloudpickle.register_pickle_by_value(runtime_pyfunc)
        try:
            return mlflow.pyfunc.log_model(
                name=name,
                python_model=runtime_pyfunc.CD4MLImageClassifier(),
                artifacts={
                    runtime_pyfunc.WEIGHTS_ARTIFACT: str(state_path),
                    runtime_pyfunc.META_ARTIFACT: str(meta_path),
                    runtime_pyfunc.RUNTIME_ARTIFACT: str(runtime),
                },
                signature=_signature(),
                input_example=pd.DataFrame({"image": list(example_images)}),
                pip_requirements=_pip_requirements(),
            )
        finally:
            cloudpickle.unregister_pickle_by_value(runtime_pyfunc)
