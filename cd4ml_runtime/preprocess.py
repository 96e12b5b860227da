"""Image bytes to model input: the one preprocessing function of training, evaluation, drift and serving.

A ``PreprocessSpec`` holds every parameter (channels, side, how a non-square image is fitted,
per-channel mean and std of the training split, whether JPEG draft decoding is used) and is
stored inside every model, so a model preprocesses the same way wherever and whenever it runs.

Rules, in order:

* Orientation: EXIF orientation is applied (a phone photo is upright).
* Transparency: alpha is composited on black (``RGBA``, ``LA``, ``P``/``PA`` with transparency).
* Colour: ``channels: 1`` takes the luminance (ITU-R 601-2, Pillow's ``L``), so a colour photo in a
  grey dataset is read as grey; ``channels: 3`` reads RGB, so a grey image in a colour dataset has
  three equal channels. 16-bit grey keeps its high byte; CMYK converts without an ICC profile.
* Fit to ``size`` x ``size``: ``crop`` (default) resizes the shorter side to ``size`` and cuts the
  centre; ``pad`` resizes the longer side to ``size`` and centres it on black; ``squash`` resizes
  both sides (ignores the aspect ratio: what models before format 2 did). A side never shrinks
  below one pixel, so a 1-pixel-wide panorama is fitted (ingest's ``min_side`` quarantines those
  before training; serving answers them by this rule).
* Large JPEGs are decoded at a reduced DCT scale (``draft``) that still covers the target size:
  decoding a 4000 px photo for a 224 px model reads an eighth of the pixels.
* ``normalise`` turns uint8 pixels into ``(x / 255 - mean) / std`` per channel, on any device.

No import of the project: this module is copied into every model (see ``cd4ml_runtime``).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageOps

FITS = ("crop", "pad", "squash")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")


class ImageDecodeError(ValueError):
    """Bytes that are not a decodable image (the message names the position in the batch)."""


@dataclass(frozen=True)
class PreprocessSpec:
    channels: int  # 1 (grey) or 3 (RGB)
    size: int  # side of the square model input
    fit: str = "crop"  # crop | pad | squash
    mean: tuple[float, ...] = field(default=())  # per channel, of x / 255 over the training split; () = 0
    std: tuple[float, ...] = field(default=())  # per channel; () = 1
    draft: bool = True  # JPEG decoded at a reduced scale when that still covers the target size

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels}")
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {self.fit!r}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values and len(values) != self.channels:
                raise ValueError(f"{name} needs one value per channel ({self.channels}), got {list(values)}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be > 0, got {list(self.std)}")

    @property
    def mode(self) -> str:
        return "L" if self.channels == 1 else "RGB"

    def with_stats(self, mean: Sequence[float], std: Sequence[float]) -> PreprocessSpec:
        return PreprocessSpec(self.channels, self.size, self.fit, tuple(map(float, mean)), tuple(map(float, std)), self.draft)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mean"], out["std"] = list(self.mean), list(self.std)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreprocessSpec:
        return cls(
            channels=int(data["channels"]),
            size=int(data["size"]),
            fit=str(data.get("fit", "crop")),
            mean=tuple(float(v) for v in data.get("mean", ())),
            std=tuple(float(v) for v in data.get("std", ())),
            draft=bool(data.get("draft", True)),
        )


def _fitted_size(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int]:
    """The size the whole image is resized to before the centre crop (crop) or the paste on black (pad)."""
    s = spec.size
    if spec.fit == "squash":
        return s, s
    if spec.fit == "crop":
        scale = s / min(width, height)
        return max(s, round(width * scale)), max(s, round(height * scale))
    scale = s / max(width, height)
    return min(s, max(1, round(width * scale))), min(s, max(1, round(height * scale)))


def _to_mode(img: Image.Image, mode: str) -> Image.Image:
    if img.mode in _SIXTEEN_BIT:
        arr = np.asarray(img).astype(np.int64)
        img = Image.fromarray((np.clip(arr, 0, 65535) >> 8).astype(np.uint8), mode="L")
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8), mode="L")
    elif img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba)
    return img if img.mode == mode else img.convert(mode)


def decode(data: bytes, spec: PreprocessSpec) -> np.ndarray:
    """One image's bytes to uint8 pixels of shape (channels, size, size); ValueError if not an image."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if spec.draft and img.format == "JPEG":  # the DCT scale keeps each side >= the request
                img.draft(spec.mode, _fitted_size(*img.size, spec))
            img = ImageOps.exif_transpose(img)
            img = _to_mode(img, spec.mode)
            fitted = _fitted_size(*img.size, spec)
            if img.size != fitted:
                img = img.resize(fitted, Image.BILINEAR)
            s = spec.size
            if fitted != (s, s):
                if spec.fit == "crop":
                    left, top = (fitted[0] - s) // 2, (fitted[1] - s) // 2
                    img = img.crop((left, top, left + s, top + s))
                else:
                    canvas = Image.new(spec.mode, (s, s), 0)
                    canvas.paste(img, ((s - fitted[0]) // 2, (s - fitted[1]) // 2))
                    img = canvas
            arr = np.asarray(img, dtype=np.uint8)
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"not a decodable image: {exc}") from exc
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def decode_many(images: Sequence[bytes], spec: PreprocessSpec, out: np.ndarray | None = None) -> np.ndarray:
    """Many images to uint8 (N, channels, size, size); the error names the failing position."""
    if out is None:
        out = np.empty((len(images), spec.channels, spec.size, spec.size), dtype=np.uint8)
    for i, data in enumerate(images):
        try:
            out[i] = decode(data, spec)
        except ImageDecodeError as exc:
            raise ImageDecodeError(f"image {i}: {exc}") from exc
    return out


def standardise(x01: Any, spec: PreprocessSpec) -> Any:
    """Float pixels in [0, 1] (torch, any device) to ``(x - mean) / std`` per channel."""
    if not spec.mean and not spec.std:
        return x01
    import torch

    c = spec.channels
    mean = torch.tensor(spec.mean or (0.0,) * c, dtype=torch.float32, device=x01.device).view(1, c, 1, 1)
    std = torch.tensor(spec.std or (1.0,) * c, dtype=torch.float32, device=x01.device).view(1, c, 1, 1)
    return (x01 - mean) / std


def normalise(x_u8: Any, spec: PreprocessSpec) -> Any:
    """uint8 (N, C, S, S) torch tensor -> the model's float32 input, on the tensor's device."""
    return standardise(x_u8.float().div_(255), spec)


class ChannelStats:
    """Per-channel mean and std of x / 255 over uint8 batches, from exact per-channel histograms.

    A histogram of 256 counts per channel: no float copy of a batch (a 256-image batch at 224 px
    would need 300 MB as float64), and the result does not depend on how the batches were cut.
    """

    def __init__(self, channels: int) -> None:
        self.hist = np.zeros((channels, 256), dtype=np.int64)

    def add(self, x_u8: np.ndarray) -> None:
        for c in range(self.hist.shape[0]):
            self.hist[c] += np.bincount(np.ascontiguousarray(x_u8[:, c]).ravel(), minlength=256)

    def result(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        n = self.hist.sum(axis=1)
        if not n.all():
            raise ValueError("no pixels: channel statistics need at least one image")
        values = np.arange(256, dtype=np.float64) / 255.0
        mean = (self.hist * values).sum(axis=1) / n
        var = (self.hist * values**2).sum(axis=1) / n - mean**2
        std = np.sqrt(np.maximum(var, 0.0))
        std = np.where(std < 1e-3, 1.0, std)  # a constant channel: leave its scale alone
        return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)
