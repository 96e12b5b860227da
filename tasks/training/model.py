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
* ``transfer_weights`` copies a registered model's weights (``tasks.models.loading.load_logged_weights``)
  into a new network for transfer learning.
* Reading a logged model back (its weights, its predictor) is ``tasks.models.loading``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
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
from cd4ml_runtime.predictor import META_FORMAT
from cd4ml_runtime.preprocess import PreprocessSpec
from tasks.models.seen_images import FILE_NAME as SEEN_FILE
from tasks.models.seen_images import SEEN_ARTIFACT
from tasks.models.seen_images import write as write_seen

RUNTIME_DIR = Path(cd4ml_runtime.__file__).resolve().parent
MODEL_ARTIFACT_NAME = "model"
MODEL_NAMES: tuple[str, ...] = networks.NAMES


def architecture(name: str, num_classes: int, image_size: int, in_channels: int = 1) -> dict[str, Any]:
    """The architecture dict a model is built from and stored with (stem chosen by the image size)."""
    return networks.describe(name, num_classes, in_channels, image_size)


def build_model(name: str, num_classes: int, image_size: int, in_channels: int = 1) -> nn.Module:
    """A freshly initialised network by name (the RNG state decides the initial weights)."""
    return networks.build(architecture(name, num_classes, image_size, in_channels))


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
    seen_images: Iterable[str] | None = None,
) -> Any:
    """Log ``model`` as a self-contained pyfunc in the active run; returns the ModelInfo (module doc).

    ``seen_images`` (hex sha256 of every image trained or validated on) becomes the model's
    ``seen_images.npy`` (``tasks.models.seen_images``): the gate of any deployment reads it there.
    """
    import cloudpickle

    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        root = Path(tmp)
        state_path = root / "state_dict.pt"
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, state_path)
        meta_path = root / "model_meta.json"
        meta_path.write_text(json.dumps(model_meta(arch, classes, spec, channels_last), indent=2))
        extra = {}
        if seen_images is not None:
            extra[SEEN_ARTIFACT] = str(write_seen(root / SEEN_FILE, seen_images))
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
                    **extra,
                },
                signature=_signature(),
                input_example=pd.DataFrame({"image": list(example_images)}),
                pip_requirements=_pip_requirements(),
            )
        finally:
            cloudpickle.unregister_pickle_by_value(runtime_pyfunc)
