"""The image classifier: network definitions and the MLflow pyfunc that serves them.

* ``build_model(name, ...)`` is the one seam where architectures are chosen by name
  (``settings.training.model``); a ResNet-18-style net slots in next to ``small_cnn``.
* ``ImageClassifierPyfunc`` takes raw image bytes (PNG/JPEG) in a DataFrame column ``image``
  and returns ``label`` and ``confidence``. Decoding and resizing (``tasks.images.decode_batch``)
  happen inside the model, so training, evaluation and serving share one preprocessing path.
* ``log_pyfunc_model`` logs the state dict and a small JSON (classes, image size, network
  name) as artifacts, together with a snapshot of the ``tasks`` package as code, so the model
  loads with ``mlflow.pyfunc.load_model`` in a fresh process that has only the requirements.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from torch import nn

PACKAGE_DIR = Path(__file__).resolve().parent
STATE_DICT_ARTIFACT = "state_dict"
META_ARTIFACT = "model_meta"
MODEL_ARTIFACT_NAME = "model"
PREDICT_BATCH = 512


class SmallCNN(nn.Module):
    """Two conv blocks (conv 3x3, batch norm, ReLU, 2x2 max pool) and one linear layer."""

    def __init__(self, num_classes: int, image_size: int, channels: tuple[int, int] = (16, 32)) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if image_size < 4:
            raise ValueError(f"image_size must be >= 4 for two 2x2 poolings, got {image_size}")
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(c1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(c2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        side = image_size // 2 // 2
        self.classifier = nn.Linear(c2 * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


_BUILDERS: dict[str, Callable[[int, int], nn.Module]] = {
    "small_cnn": lambda num_classes, image_size: SmallCNN(num_classes, image_size),
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_model(name: str, num_classes: int, image_size: int) -> nn.Module:
    """A freshly initialised network by name (the RNG state decides the initial weights)."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}") from None
    return builder(num_classes, image_size)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):  # JSON transports (REST serving) carry binary as base64
        return base64.b64decode(value)
    raise TypeError(f"image must be bytes (PNG/JPEG) or base64 text, got {type(value).__name__}")


@torch.no_grad()
def predict_proba(model: nn.Module, images: np.ndarray | torch.Tensor, batch_size: int = PREDICT_BATCH) -> torch.Tensor:
    """Softmax probabilities for a float32 (N, 1, S, S) batch, in eval mode."""
    model.eval()
    x = torch.as_tensor(images, dtype=torch.float32)
    if len(x) == 0:
        return torch.empty((0, 0))
    return torch.cat([torch.softmax(model(x[i : i + batch_size]), dim=1) for i in range(0, len(x), batch_size)])


class ImageClassifierPyfunc(mlflow.pyfunc.PythonModel):
    """Raw image bytes in (column ``image``), ``label`` and ``confidence`` out."""

    def load_context(self, context: Any) -> None:
        from tasks.images import decode_batch  # imported here: resolved from the logged code

        meta = json.loads(Path(context.artifacts[META_ARTIFACT]).read_text())
        self.classes: list[str] = list(meta["classes"])
        self.image_size: int = int(meta["image_size"])
        self._decode = decode_batch
        self.model = build_model(meta["architecture"], len(self.classes), self.image_size)
        state = torch.load(context.artifacts[STATE_DICT_ARTIFACT], map_location="cpu", weights_only=True)
        self.model.load_state_dict(state)
        self.model.eval()

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        if not isinstance(model_input, pd.DataFrame) or "image" not in model_input.columns:
            raise ValueError("input must be a DataFrame with a column 'image' of PNG/JPEG bytes")
        images = [_as_bytes(v) for v in model_input["image"].tolist()]
        if not images:
            return pd.DataFrame({"label": pd.Series([], dtype=object), "confidence": pd.Series([], dtype="float64")})
        probs = predict_proba(self.model, self._decode(images, self.image_size))
        confidence, index = probs.max(dim=1)
        return pd.DataFrame(
            {
                "label": [self.classes[i] for i in index.tolist()],
                "confidence": confidence.double().numpy(),
            }
        )


def _pip_requirements() -> list[str]:
    import PIL

    return [
        f"mlflow=={mlflow.__version__}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
        f"pillow=={PIL.__version__}",
    ]


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("binary", "image")]),
        outputs=Schema([ColSpec("string", "label"), ColSpec("double", "confidence")]),
    )


def log_pyfunc_model(
    model: nn.Module,
    *,
    architecture: str,
    classes: list[str],
    image_size: int,
    example_images: list[bytes],
    name: str = MODEL_ARTIFACT_NAME,
) -> Any:
    """Log ``model`` as an ``ImageClassifierPyfunc`` in the active run; returns the ModelInfo.

    The code snapshot holds the ``tasks`` package's Python files only, so the model loads in
    a process that has the pip requirements but not this repository.
    """
    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        root = Path(tmp)
        state_path = root / "state_dict.pt"
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, state_path)
        meta_path = root / "model_meta.json"
        meta_path.write_text(
            json.dumps({"architecture": architecture, "classes": list(classes), "image_size": int(image_size)}, indent=2)
        )
        code_root = root / "code" / "tasks"
        code_root.mkdir(parents=True)
        for source in sorted(PACKAGE_DIR.glob("*.py")):
            shutil.copy2(source, code_root / source.name)
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=ImageClassifierPyfunc(),
            artifacts={STATE_DICT_ARTIFACT: str(state_path), META_ARTIFACT: str(meta_path)},
            code_paths=[str(code_root)],
            signature=_signature(),
            input_example=pd.DataFrame({"image": list(example_images)}),
            pip_requirements=_pip_requirements(),
        )
