"""Why did the champion say that? Integrated Gradients overlays for the images a monitor picks.

The monitor selects the images worth a look (misclassified, low confidence) from a scored or
monitored batch and calls ``explain``; this module only explains, it never selects.

Method: Integrated Gradients (Sundararajan et al., 2017) from Captum, PyTorch's own
attribution library. The attribution of pixel ``i`` is ``(x_i - x'_i)`` times the gradient of
the predicted class's logit averaged along the straight path from a baseline ``x'`` to the
input ``x`` (``steps`` points, Gauss-Legendre; an image whose attributions miss the
completeness sum by more than 5% is integrated again with four times the steps). Why IG:

* it is axiomatic: *completeness* (the attributions sum to ``logit(x) - logit(x')``) and
  *sensitivity*/*implementation invariance* hold, so a map can be checked rather than trusted;
  Captum returns the completeness error as ``convergence_delta`` and we keep it per image;
* it needs only gradients, ``steps`` forward/backward passes per image: cheap for the small
  CNNs and ResNets this project trains, on CPU, without a surrogate model or sampling noise
  (SHAP's kernel/partition explainers would need thousands of evaluations per image).

Baseline: a black image, i.e. pixels of value 0 put through the model's own normalisation,
``(0 - mean) / std`` per channel of the model's ``PreprocessSpec`` (not zeros of the normalised
space, which would be a mid-grey image for a standardised model). "No ink" is the natural
absence of signal for the digits; a consequence to know when reading a map: a pixel that is
exactly black in the input gets zero attribution.

Target: the class the model predicted, so the map answers "what made it say this".

Overlay (one PNG per image, named after its key, so a re-run overwrites): left, the image as
the model saw it (the normalised input mapped back to [0, 1]: after decoding, fitting and
resizing; grey or RGB), upscaled by nearest neighbour to at least ``MIN_SIDE`` px so single
pixels stay visible; right, the same image dimmed, with the attribution magnitude
``sum over channels |attribution|`` as red heat (scaled per image to its 99th percentile, so
one hot pixel does not wash out the rest); below, a caption: predicted label and confidence,
the runner-up, and the true label when known.

``write_index`` writes an HTML page listing the overlays (relative links), for the monitoring
report and dashboard. Images that do not decode are not explained: they come back in
``Explained.skipped`` with the reason (and are logged), never dropped silently.
"""

from __future__ import annotations

import hashlib
import html
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

log = logging.getLogger(__name__)

MIN_SIDE = 160  # px of each panel in an overlay, at least
INDEX_NAME = "index.html"
_GAP = 8  # px between the two panels
_CAPTION = 18  # px of the caption strip
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
# Completeness check (Sundararajan et al. suggest 5%): an image whose attributions miss
# logit(x) - logit(baseline) by more than this is attributed again with REFINE x the steps.
RELATIVE_TOLERANCE = 0.05
ABSOLUTE_TOLERANCE = 0.01  # logits: a gap near zero cannot be met relatively
REFINE = 4


@dataclass(frozen=True)
class Explanation:
    """One explained image.

    ``ink_share`` is the share of the total |attribution| that falls on "ink" pixels (brighter
    than the image's own mean), ``ink_area`` the share of pixels that are ink: a map that is
    about the drawn object has ``ink_share`` well above ``ink_area``. ``logit_gap`` is
    ``logit(x) - logit(baseline)`` of the predicted class, the sum the attributions must add up
    to; ``convergence_delta`` is Captum's error of that sum (small relative to the gap = the
    integral was computed with enough steps); ``steps`` is how many it took.
    """

    key: str
    predicted: str
    confidence: float
    true_label: str | None
    runner_up: str
    runner_up_confidence: float
    path: Path
    convergence_delta: float
    logit_gap: float
    steps: int
    ink_share: float
    ink_area: float

    @property
    def correct(self) -> bool | None:
        """Whether the prediction matches the true label (None when the label is unknown)."""
        return None if self.true_label is None else self.predicted == self.true_label

    @property
    def caption(self) -> str:
        text = f"predicted {self.predicted} ({self.confidence:.0%}), next {self.runner_up} ({self.runner_up_confidence:.0%})"
        return text if self.true_label is None else f"{text}; true {self.true_label}"


@dataclass(frozen=True)
class Explained:
    """The result of ``explain``: an explanation per decodable image, in input order, and the skipped ones."""

    explanations: tuple[Explanation, ...] = ()
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (key, reason)


def file_name(key: str) -> str:
    """A stable, safe PNG name for a key (sha256 hex stays as it is; paths get a hash suffix)."""
    stem = _SAFE.sub("_", key).strip("._")[:80]
    if not stem or stem != key:  # empty, changed or truncated: keep different keys apart
        stem = f"{stem or 'image'}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    return f"{stem}.png"


def _channel_stats(spec: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    c = int(spec.channels)
    mean = torch.tensor(tuple(spec.mean) or (0.0,) * c, dtype=torch.float32, device=device).view(1, c, 1, 1)
    std = torch.tensor(tuple(spec.std) or (1.0,) * c, dtype=torch.float32, device=device).view(1, c, 1, 1)
    return mean, std


def black_baseline(spec: Any, like: torch.Tensor) -> torch.Tensor:
    """The model input of an all-black image (pixels 0), shaped like ``like``."""
    mean, std = _channel_stats(spec, like.device)
    return ((0.0 - mean) / std).expand_as(like).contiguous()


def unnormalise(spec: Any, x: torch.Tensor) -> torch.Tensor:
    """The model input mapped back to pixels in [0, 1] (the image as the model saw it)."""
    mean, std = _channel_stats(spec, x.device)
    return (x * std + mean).clamp_(0.0, 1.0)


def integrated_gradients(
    network: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, baseline: torch.Tensor, *, steps: int = 32,
    pass_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attributions shaped like ``x``, convergence delta per image) of ``target`` logits; no pass exceeds
    ``max(pass_size, len(x))`` samples."""
    from captum.attr import IntegratedGradients  # imports matplotlib: only when explaining

    ig = IntegratedGradients(network)
    attributions, delta = ig.attribute(
        x, baselines=baseline, target=target, n_steps=steps, internal_batch_size=max(pass_size, len(x)),
        return_convergence_delta=True,
    )
    return attributions.detach(), delta.detach()


def _decode(predictor: Any, images: Sequence[bytes], keys: Sequence[str]) -> tuple[list[int], list[torch.Tensor], list[tuple[str, str]]]:
    """Model inputs of the images that decode (with their positions) and (key, reason) of the others."""
    kept: list[int] = []
    tensors: list[torch.Tensor] = []
    skipped: list[tuple[str, str]] = []
    for i, data in enumerate(images):
        try:
            tensors.append(predictor.inputs([data]))
            kept.append(i)
        except ValueError as exc:  # the runtime's ImageDecodeError (of whichever runtime copy the model runs)
            reason = str(exc).removeprefix("image 0: ")
            log.warning("not explained: %s: %s", keys[i], reason)
            skipped.append((keys[i], reason))
    return kept, tensors, skipped


def _font(size: int) -> Any:
    try:
        return ImageFont.load_default(size=size)  # FreeType available: a scalable font
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font: Any, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def render_overlay(seen: np.ndarray, heat: np.ndarray, caption: str) -> Image.Image:
    """The overlay: the image as seen (C, S, S in [0, 1]) next to it with ``heat`` (S, S in [0, 1]) in red, and a caption."""
    side = seen.shape[-1]
    scale = max(1, math.ceil(MIN_SIDE / side))
    rgb = np.repeat(seen, 3, axis=0) if seen.shape[0] == 1 else seen
    rgb = rgb.transpose(1, 2, 0)  # (S, S, 3)
    red = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    h = heat[..., None]
    hot = (0.45 * rgb) * (1.0 - h) + red * h  # dimmed image under the heat
    panels = []
    for arr in (rgb, hot):
        img = Image.fromarray(np.rint(arr * 255).astype(np.uint8), mode="RGB")
        panels.append(img.resize((side * scale, side * scale), Image.NEAREST))
    panel = side * scale
    canvas = Image.new("RGB", (2 * panel + _GAP, panel + _CAPTION), (255, 255, 255))
    canvas.paste(panels[0], (0, 0))
    canvas.paste(panels[1], (panel + _GAP, 0))
    draw = ImageDraw.Draw(canvas)
    font = _font(12)
    draw.text((2, panel + 3), _fit_text(draw, caption, font, canvas.width - 4), fill=(0, 0, 0), font=font)
    return canvas


def _check_arguments(
    images: Sequence[bytes], keys: Sequence[str], labels: Sequence[str | None] | None, steps: int, batch: int
) -> None:
    if len(keys) != len(images):
        raise ValueError(f"{len(images)} images but {len(keys)} keys")
    if labels is not None and len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if len(set(keys)) != len(keys):
        raise ValueError("keys must be unique: each names one overlay file")
    if steps < 2 or batch < 1:
        raise ValueError(f"steps must be >= 2 and batch >= 1, got steps={steps}, batch={batch}")


@dataclass(frozen=True)
class _Attributed:
    """One batch of decoded images, predicted and attributed (row ``j`` = the batch's ``j``-th kept image)."""

    seen: np.ndarray  # (n, C, S, S) in [0, 1]: the images as the model saw them
    magnitude: np.ndarray  # (n, S, S): sum over channels of |attribution|
    top: Any  # softmax top-2: values and indices per image
    target: torch.Tensor  # the predicted class, attributed
    gap: torch.Tensor  # logit(x) - logit(baseline) of the target
    delta: torch.Tensor  # Captum's completeness error
    steps: torch.Tensor  # integration steps used per image


def _attribute(network: torch.nn.Module, spec: Any, x: torch.Tensor, steps: int, batch: int) -> _Attributed:
    """Predict, then Integrated Gradients of the prediction; images that miss completeness are integrated finer."""
    baseline = black_baseline(spec, x)
    with torch.no_grad():
        logits = network(x)
        top = torch.softmax(logits, dim=1).topk(2, dim=1)  # a network has >= 2 classes
        target = top.indices[:, 0]
        rows = torch.arange(len(x))
        gap = logits[rows, target] - network(baseline)[rows, target]
    attributions, delta = integrated_gradients(network, x, target, baseline, steps=steps, pass_size=batch)
    used = torch.full((len(x),), steps)
    coarse = (delta.abs() > RELATIVE_TOLERANCE * gap.abs() + ABSOLUTE_TOLERANCE).nonzero().flatten()
    if len(coarse):  # too few steps for these: integrate again, finer
        attributions[coarse], delta[coarse] = integrated_gradients(
            network, x[coarse], target[coarse], baseline[coarse], steps=steps * REFINE, pass_size=batch
        )
        used[coarse] = steps * REFINE
    seen = unnormalise(spec, x.detach().float()).numpy()
    magnitude = attributions.abs().sum(dim=1).numpy()  # (n, S, S)
    return _Attributed(seen, magnitude, top, target, gap, delta, used)


def _explanation(a: _Attributed, j: int, key: str, label: str | None, classes: list[str], path: Path) -> Explanation:
    """Row ``j`` of an attributed batch as an ``Explanation`` (its overlay to be written at ``path``)."""
    brightness = a.seen[j].mean(axis=0)
    ink = brightness > brightness.mean()
    total = float(a.magnitude[j].sum())
    return Explanation(
        key=key,
        predicted=classes[int(a.target[j])],
        confidence=float(a.top.values[j, 0]),
        true_label=label,
        runner_up=classes[int(a.top.indices[j, 1])],
        runner_up_confidence=float(a.top.values[j, 1]),
        path=path,
        convergence_delta=float(a.delta[j]),
        logit_gap=float(a.gap[j]),
        steps=int(a.steps[j]),
        ink_share=float(a.magnitude[j][ink].sum() / total) if total > 0 else 0.0,
        ink_area=float(ink.mean()),
    )


def _save_overlay(explanation: Explanation, seen: np.ndarray, magnitude: np.ndarray) -> None:
    """The overlay PNG, with the key and caption as text chunks; heat scaled to the image's 99th percentile."""
    ceiling = float(np.percentile(magnitude, 99))
    heat = np.clip(magnitude / ceiling, 0.0, 1.0) if ceiling > 0 else np.zeros_like(magnitude)
    info = PngInfo()
    info.add_text("key", explanation.key)
    info.add_text("caption", explanation.caption)
    render_overlay(seen, heat, explanation.caption).save(explanation.path, format="PNG", pnginfo=info)


def explain(
    predictor: Any,
    images: Sequence[bytes],
    keys: Sequence[str],
    out_dir: Path,
    *,
    labels: Sequence[str | None] | None = None,
    steps: int = 32,
    batch: int = 16,
) -> Explained:
    """Integrated Gradients overlays for ``images`` (named by ``keys``) in ``out_dir``.

    ``predictor`` is a cd4ml runtime ``Predictor`` (``tasks.models.loading.load_predictor``);
    ``labels`` are the true labels when known (None per image when not). Images are decoded,
    attributed and drawn ``batch`` at a time, so memory does not grow with the selection.
    An image that does not decode is skipped and reported in ``Explained.skipped``; no input
    means no files.
    """
    _check_arguments(images, keys, labels, steps, batch)
    if not images:
        return Explained()
    network, spec, classes = predictor.network, predictor.spec, list(predictor.classes)
    memory_format = getattr(predictor, "memory_format", torch.contiguous_format)
    out = Path(out_dir)
    explanations: list[Explanation] = []
    skipped: list[tuple[str, str]] = []
    for start in range(0, len(images), batch):
        kept, tensors, bad = _decode(predictor, images[start : start + batch], keys[start : start + batch])
        skipped += bad
        if not kept:
            continue
        attributed = _attribute(network, spec, torch.cat(tensors).contiguous(memory_format=memory_format), steps, batch)
        out.mkdir(parents=True, exist_ok=True)
        for j, position in enumerate(start + i for i in kept):
            label = None if labels is None or labels[position] is None else str(labels[position])
            key = keys[position]
            explanation = _explanation(attributed, j, key, label, classes, out / file_name(key))
            _save_overlay(explanation, attributed.seen[j], attributed.magnitude[j])
            explanations.append(explanation)
    return Explained(tuple(explanations), tuple(skipped))


def write_index(
    explanations: Sequence[Explanation], out_dir: Path, *, skipped: Sequence[tuple[str, str]] = (),
    title: str = "Explanations",
) -> Path:
    """``out_dir/index.html``: the overlays with their captions (relative links), and the images not explained."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    esc = html.escape
    parts = [
        "<!doctype html>",
        f'<html><head><meta charset="utf-8"><title>{esc(title)}</title></head><body>',
        f'<section class="cd4ml-explanations"><h2>{esc(title)}</h2>',
        "<p>Integrated Gradients (Captum) of the predicted class against a black image: "
        "left, the image as the model saw it; right, where the evidence was (red).</p>",
    ]
    if not explanations:
        parts.append("<p>No images to explain.</p>")
    for e in explanations:
        src = Path(os.path.relpath(e.path, out)).as_posix()
        parts.append(
            f'<figure><img src="{esc(src, quote=True)}" alt="{esc(e.key, quote=True)}">'
            f"<figcaption><code>{esc(e.key)}</code>: {esc(e.caption)}</figcaption></figure>"
        )
    if skipped:
        parts.append("<h3>Not explained</h3><ul>")
        parts += [f"<li><code>{esc(key)}</code>: {esc(reason)}</li>" for key, reason in skipped]
        parts.append("</ul>")
    parts.append("</section></body></html>")
    path = out / INDEX_NAME
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path
