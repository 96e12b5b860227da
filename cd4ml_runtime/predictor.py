"""A logged model's network, classes and preprocessing, ready to classify image bytes.

``Predictor.from_files(meta_path, weights_path)`` rebuilds the network from the architecture
stored in the model's meta, loads its weights and keeps its ``PreprocessSpec``; everything it
needs is inside the model. Metas written before format 2 (grey, squashed, unnormalised input,
architecture by name) are read with exactly the parameters those models were trained with.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .networks import build, describe
from .preprocess import ImageDecodeError, PreprocessSpec, decode_many, normalise

META_FORMAT = 2
BATCH = 256


def parts_of(meta: dict[str, Any]) -> tuple[dict[str, Any], PreprocessSpec, list[str]]:
    """(architecture, preprocessing, classes) of a model meta, any format."""
    classes = [str(c) for c in meta["classes"]]
    if int(meta.get("format", 1)) >= 2:
        return dict(meta["arch"]), PreprocessSpec.from_dict(meta["preprocess"]), classes
    size = int(meta["image_size"])  # format 1: grey, squashed to size x size, x / 255, full decode
    return describe(meta["architecture"], len(classes), 1, size, "small"), PreprocessSpec(1, size, "squash", draft=False), classes


def as_bytes(value: Any, position: int) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):  # JSON transports (REST serving) carry binary as base64
        try:
            return base64.b64decode(value, validate=True)
        except ValueError as exc:
            raise ImageDecodeError(f"image {position}: text that is not base64 ({exc})") from exc
    raise ImageDecodeError(f"image {position}: expected PNG/JPEG bytes or base64 text, got {type(value).__name__}")


class Predictor:
    """Classify image bytes with one model: the same preprocessing it was trained with."""

    def __init__(self, network: torch.nn.Module, classes: list[str], spec: PreprocessSpec, arch: dict[str, Any],
                 channels_last: bool = False) -> None:
        self.network = network.eval()
        self.classes = classes
        self.spec = spec
        self.arch = arch
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.network.to(memory_format=self.memory_format)

    @classmethod
    def from_files(cls, meta_path: str | Path, weights_path: str | Path) -> Predictor:
        meta = json.loads(Path(meta_path).read_text())
        arch, spec, classes = parts_of(meta)
        network = build(arch)
        network.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True))
        return cls(network, classes, spec, arch, bool(meta.get("channels_last")))

    def inputs(self, images: Sequence[Any]) -> torch.Tensor:
        """Normalised float32 (N, C, S, S) model input for image bytes (or base64 text)."""
        raw = decode_many([as_bytes(v, i) for i, v in enumerate(images)], self.spec)
        return normalise(torch.from_numpy(raw), self.spec)

    @torch.no_grad()
    def embed_and_proba(self, images: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """(penultimate embedding (N, D), softmax (N, K)) as float32, in batches."""
        embeds, probs = [], []
        for i in range(0, len(images), BATCH):
            x = self.inputs(images[i : i + BATCH]).contiguous(memory_format=self.memory_format)
            h = torch.flatten(self.network.features(x), 1)
            embeds.append(h.numpy())
            probs.append(torch.softmax(self.network.classifier(h), dim=1).numpy())
        if not embeds:
            return np.zeros((0, 0), np.float32), np.zeros((0, len(self.classes)), np.float32)
        return np.concatenate(embeds).astype(np.float32), np.concatenate(probs).astype(np.float32)

    def predict_proba(self, images: Sequence[Any]) -> np.ndarray:
        return self.embed_and_proba(images)[1]

    @torch.no_grad()
    def proba_of_pixels(self, raw: np.ndarray) -> np.ndarray:
        """Softmax (N, K) of pixels already decoded with this model's spec (``decode_many``'s uint8 output)."""
        probs = []
        for i in range(0, len(raw), BATCH):
            x = normalise(torch.from_numpy(raw[i : i + BATCH]), self.spec).contiguous(memory_format=self.memory_format)
            probs.append(torch.softmax(self.network.classifier(torch.flatten(self.network.features(x), 1)), dim=1).numpy())
        return np.concatenate(probs).astype(np.float32) if probs else np.zeros((0, len(self.classes)), np.float32)

    def predict_frame(self, model_input: Any) -> Any:
        """DataFrame with a column ``image`` in; ``label`` and ``confidence`` out (one row per image)."""
        import pandas as pd

        if not isinstance(model_input, pd.DataFrame) or "image" not in model_input.columns:
            raise ValueError("input must be a DataFrame with a column 'image' of PNG/JPEG bytes (base64 in JSON)")
        probs = self.predict_proba(model_input["image"].tolist())
        index = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
        return pd.DataFrame({
            "label": pd.Series([self.classes[i] for i in index.tolist()], dtype=object),
            "confidence": probs.max(axis=1).astype(np.float64) if len(probs) else np.zeros(0),
        })
