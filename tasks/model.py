"""The image classifier: network definitions and the MLflow pyfunc that serves them.

* ``build_model(name, ...)`` is the one seam where architectures are chosen by name
  (``settings.training.model``): ``small_cnn`` or ``resnet18`` (a ResNet-18 for small
  images: 3x3 stem, no max pool, so 16x16 inputs keep spatial detail). Both expose
  ``features`` (the backbone) and ``classifier`` (the head), which is what transfer learning
  (``load_logged_weights`` + ``transfer_weights``) and ``freeze_backbone`` rely on.
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


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18Small(nn.Module):
    """ResNet-18 (2-2-2-2 basic blocks, widths 64-512) with a CIFAR-style stem for small images.

    The ImageNet stem (7x7 stride 2 + max pool) would shrink a 16x16 digit to 4x4 before the
    first block; a 3x3 stride-1 stem keeps the resolution, and adaptive pooling lets any
    ``image_size`` >= 8 work.
    """

    def __init__(self, num_classes: int, image_size: int, in_channels: int = 1, width: int = 64) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8 for three stride-2 stages, got {image_size}")
        widths = (width, width * 2, width * 4, width * 8)
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        ]
        c_in = width
        for stage, c_out in enumerate(widths):
            stride = 1 if stage == 0 else 2
            layers += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_in, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


_BUILDERS: dict[str, Callable[[int, int], nn.Module]] = {
    "small_cnn": lambda num_classes, image_size: SmallCNN(num_classes, image_size),
    "resnet18": lambda num_classes, image_size: ResNet18Small(num_classes, image_size),
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_model(name: str, num_classes: int, image_size: int) -> nn.Module:
    """A freshly initialised network by name (the RNG state decides the initial weights)."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}") from None
    return builder(num_classes, image_size)


def load_logged_weights(model_uri: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The state dict and meta (architecture, classes, image size) of a model logged by ``log_pyfunc_model``.

    Reads the two artifacts directly instead of loading the pyfunc, so no logged code is
    imported into the training process.
    """
    with tempfile.TemporaryDirectory(prefix="cd4ml-pretrained-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
        metas = sorted(local.rglob("model_meta.json"))
        states = sorted(local.rglob("state_dict.pt"))
        if not metas or not states:
            raise ValueError(f"{model_uri} is not a cd4ml image classifier (no model_meta.json/state_dict.pt)")
        meta = json.loads(metas[0].read_text())
        state = torch.load(states[0], map_location="cpu", weights_only=True)
    return state, meta


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


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):  # JSON transports (REST serving) carry binary as base64
        return base64.b64decode(value)
    raise TypeError(f"image must be bytes (PNG/JPEG) or base64 text, got {type(value).__name__}")


@torch.no_grad()
def predict_proba(
    model: nn.Module,
    images: np.ndarray | torch.Tensor,
    batch_size: int = PREDICT_BATCH,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> torch.Tensor:
    """Softmax probabilities for a float32 (N, 1, S, S) batch, in eval mode.

    ``memory_format`` should be the one training validated with, so serving runs the same kernels.
    """
    model.eval()
    x = torch.as_tensor(images, dtype=torch.float32)
    if len(x) == 0:
        return torch.empty((0, 0))
    return torch.cat(
        [
            torch.softmax(model(x[i : i + batch_size].contiguous(memory_format=memory_format)), dim=1)
            for i in range(0, len(x), batch_size)
        ]
    )


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
        self.memory_format = torch.channels_last if meta.get("channels_last") else torch.contiguous_format
        self.model.to(memory_format=self.memory_format)
        self.model.eval()

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        if not isinstance(model_input, pd.DataFrame) or "image" not in model_input.columns:
            raise ValueError("input must be a DataFrame with a column 'image' of PNG/JPEG bytes")
        images = [_as_bytes(v) for v in model_input["image"].tolist()]
        if not images:
            return pd.DataFrame({"label": pd.Series([], dtype=object), "confidence": pd.Series([], dtype="float64")})
        probs = predict_proba(self.model, self._decode(images, self.image_size), memory_format=self.memory_format)
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
    channels_last: bool = False,
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
            json.dumps(
                {
                    "architecture": architecture,
                    "classes": list(classes),
                    "image_size": int(image_size),
                    "channels_last": bool(channels_last),
                },
                indent=2,
            )
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
