"""The inference runtime: one preprocessing rule set, and models that run the code they were trained with.

A model carries its preprocessing parameters and a copy of ``cd4ml_runtime``; these tests change
the project's runtime after a model was logged and check the model still predicts the same, in this
process (which has imported the project) and in a fresh one (which has not, or has a newer copy).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from cd4ml_runtime.preprocess import ChannelStats, PreprocessSpec, decode

REPO = Path(__file__).resolve().parents[2]


def image_bytes(array: np.ndarray, mode: str, fmt: str = "PNG", **save: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format=fmt, **save)
    return buffer.getvalue()


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth colour gradient with a red left half: crops, pads and channels are visible in it."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    out = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), np.full((h, w), 60)], axis=-1)
    out[:, : w // 2, 0] = 250
    return np.clip(out + rng.integers(0, 3, out.shape), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- preprocessing rules


def test_colour_and_grey_follow_the_spec_whatever_the_file_holds() -> None:
    rgb = image_bytes(photo(40, 40), "RGB")
    grey = image_bytes(photo(40, 40)[..., 1], "L")
    as_grey = decode(rgb, PreprocessSpec(1, 16))
    as_colour = decode(grey, PreprocessSpec(3, 16))
    assert as_grey.shape == (1, 16, 16) and as_colour.shape == (3, 16, 16)
    assert np.array_equal(as_colour[0], as_colour[1]) and np.array_equal(as_colour[1], as_colour[2])
    # luminance, not one channel: the red half is brighter than its green channel alone
    colour = decode(rgb, PreprocessSpec(3, 16)).astype(float)
    expected = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
    assert np.abs(as_grey[0] - expected).max() <= 2


def test_non_square_images_are_fitted_by_the_documented_rule() -> None:
    wide = photo(20, 80)  # red left half
    crop = decode(image_bytes(wide, "RGB"), PreprocessSpec(3, 20, "crop"))
    assert crop.shape == (3, 20, 20)
    assert abs(int(crop[0, :, :10].mean()) - 250) <= 3 and crop[0, :, 12:].mean() < 200  # the centre: half red
    pad = decode(image_bytes(wide, "RGB"), PreprocessSpec(3, 20, "pad"))
    assert pad[:, :7].max() == 0 and pad[:, -7:].max() == 0 and pad[:, 8:12].min() > 0  # letterboxed on black
    squash = decode(image_bytes(wide, "RGB"), PreprocessSpec(3, 20, "squash"))
    assert squash[0, :, :8].mean() > 240  # the whole red half, squeezed


def test_odd_inputs_decode_or_fail_with_a_clear_error() -> None:
    spec = PreprocessSpec(3, 32)
    panorama = image_bytes(np.full((1, 600, 3), 120, np.uint8), "RGB")
    assert decode(panorama, spec).shape == (3, 32, 32)  # 1 px high: stretched to the side, not a crash
    assert decode(panorama, PreprocessSpec(3, 32, "pad"))[:, 0].max() == 0
    huge = image_bytes(photo(2400, 3200), "RGB", "JPEG", quality=85)  # decoded at a DCT scale, not in full
    out = decode(huge, spec)
    assert out.shape == (3, 32, 32) and abs(int(out[0, :, :12].mean()) - 250) <= 6
    rgba = np.dstack([photo(30, 30), np.zeros((30, 30), np.uint8)])  # fully transparent: black
    assert decode(image_bytes(rgba, "RGBA"), spec).max() == 0
    sixteen = Image.fromarray((np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16))
    buf = io.BytesIO()
    sixteen.save(buf, format="PNG")
    assert decode(buf.getvalue(), PreprocessSpec(1, 16)).max() > 200  # the high byte, not clipped white
    cmyk = io.BytesIO()
    Image.fromarray(photo(30, 30)).convert("CMYK").save(cmyk, format="JPEG")
    assert decode(cmyk.getvalue(), spec).shape == (3, 32, 32)
    from cd4ml_runtime.preprocess import ImageDecodeError, decode_many

    with pytest.raises(ImageDecodeError, match="image 1: not a decodable image"):
        decode_many([image_bytes(photo(8, 8), "RGB"), b"this is text"], spec)


def test_channel_statistics_are_the_pixels_own() -> None:
    x = np.random.default_rng(0).integers(0, 256, (50, 3, 8, 8)).astype(np.uint8)
    stats = ChannelStats(3)
    stats.add(x[:20])
    stats.add(x[20:])
    mean, std = stats.result()
    f = x.astype(np.float64) / 255
    assert np.allclose(mean, f.mean(axis=(0, 2, 3)), atol=1e-6) and np.allclose(std, f.std(axis=(0, 2, 3)), atol=1e-6)
    with pytest.raises(ValueError, match="one value per channel"):
        PreprocessSpec(3, 8, mean=(0.5,))


# --------------------------------------------------------------------------- a model runs its own runtime


@pytest.fixture()
def logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A small colour model with normalisation, logged in a private store."""
    import mlflow

    from tasks.training.model import architecture, build_model, log_pyfunc_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    classes = ["china", "flower", "sky"]
    spec = PreprocessSpec(3, 24, "crop", mean=(0.5, 0.4, 0.3), std=(0.25, 0.2, 0.3))
    torch.manual_seed(0)
    model = build_model("small_cnn", len(classes), 24, in_channels=3).eval()
    images = [
        image_bytes(photo(24, 24, 1), "RGB"),
        image_bytes(photo(90, 30, 2), "RGB", "JPEG"),  # another size and format
        image_bytes(photo(40, 40, 3)[..., 0], "L"),  # grey into a colour model
        image_bytes(np.dstack([photo(33, 17, 4), np.full((33, 17), 128, np.uint8)]), "RGBA"),
        image_bytes(photo(700, 500, 5), "RGB", "JPEG"),  # large: the draft path
    ]
    with mlflow.start_run(experiment_id=mlflow.create_experiment("runtime", artifact_location=str(tmp_path / "artifacts"))):
        info = log_pyfunc_model(model, arch=architecture("small_cnn", 3, 24, 3), classes=classes, spec=spec,
                                example_images=images[:2])
    paths = []
    for i, data in enumerate(images):
        path = tmp_path / f"img_{i}"
        path.write_bytes(data)
        paths.append(str(path))
    return {"uri": uri, "model_uri": info.model_uri, "images": images, "paths": paths, "classes": classes}


def predict_here(model_uri: str, images: list[bytes]) -> dict[str, list]:
    import mlflow

    out = mlflow.pyfunc.load_model(model_uri).predict(pd.DataFrame({"image": images}))
    return {"labels": out["label"].tolist(), "confidence": [round(v, 6) for v in out["confidence"]]}


FRESH = """
import json, sys
first = sys.argv[4] if len(sys.argv) > 4 else None
if first:  # a newer runtime already imported by the serving process
    sys.path.insert(0, first)
    import cd4ml_runtime.preprocess
    assert cd4ml_runtime.preprocess.__file__.startswith(first), cd4ml_runtime.preprocess.__file__
import mlflow, pandas as pd
mlflow.set_tracking_uri(sys.argv[1])
paths = json.loads(sys.argv[3])
before = list(sys.path)
out = mlflow.pyfunc.load_model(sys.argv[2]).predict(pd.DataFrame({"image": [open(p, "rb").read() for p in paths]}))
print(json.dumps({"labels": out["label"].tolist(), "confidence": [round(v, 6) for v in out["confidence"]],
                  "path_changed": sys.path != before}))
"""


def predict_fresh(logged: dict[str, Any], cwd: Path, newer_runtime: Path | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [sys.executable, "-c", FRESH, logged["uri"], logged["model_uri"], json.dumps(logged["paths"])]
    if newer_runtime is not None:
        args.append(str(newer_runtime))
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_pyfunc_takes_any_size_and_mode_and_answers_with_class_names(logged: dict[str, Any]) -> None:
    out = predict_here(logged["model_uri"], logged["images"])
    assert len(out["labels"]) == 5 and set(out["labels"]) <= set(logged["classes"])
    assert all(0 < c <= 1 for c in out["confidence"])
    from cd4ml_runtime.preprocess import ImageDecodeError

    with pytest.raises(Exception) as caught:  # MLflow may wrap it; the message names the bad row
        predict_here(logged["model_uri"], [logged["images"][0], b"not an image"])
    assert isinstance(caught.value, ImageDecodeError) or "image 1" in str(caught.value)


def test_a_model_predicts_the_same_after_the_project_runtime_changes(
    logged: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = predict_here(logged["model_uri"], logged["images"])
    fresh = predict_fresh(logged, tmp_path)
    assert fresh["labels"] == before["labels"] and fresh["confidence"] == pytest.approx(before["confidence"], abs=1e-5)
    assert not fresh["path_changed"]

    # A preprocessing change lands in the project: inverted pixels and another resize filter.
    newer = tmp_path / "newer"
    shutil.copytree(REPO / "cd4ml_runtime", newer / "cd4ml_runtime")
    source = newer / "cd4ml_runtime" / "preprocess.py"
    text = source.read_text().replace("arr = np.asarray(img, dtype=np.uint8)", "arr = 255 - np.asarray(img, dtype=np.uint8)")
    source.write_text(text.replace("Image.BILINEAR", "Image.NEAREST"))
    changed = predict_fresh(logged, tmp_path, newer_runtime=newer)
    assert changed["labels"] == before["labels"] and changed["confidence"] == pytest.approx(before["confidence"], abs=1e-5)

    # ... and in this process, which imported the project's runtime before loading the model.
    import cd4ml_runtime.preprocess as project_preprocess

    monkeypatch.setattr(project_preprocess, "decode", lambda data, spec: np.zeros((spec.channels, spec.size, spec.size), np.uint8))
    monkeypatch.setattr(project_preprocess, "normalise", lambda x, spec: x.float() * 0)
    again = predict_here(logged["model_uri"], logged["images"])
    assert again["labels"] == before["labels"] and again["confidence"] == pytest.approx(before["confidence"], abs=1e-5)


def test_models_logged_before_format_2_still_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The meta of a format-1 model (grey, squashed, x / 255) rebuilds the same network and input."""
    from cd4ml_runtime.predictor import Predictor
    from tasks.training.model import build_model

    torch.manual_seed(3)
    net = build_model("small_cnn", 10, 16).eval()
    torch.save(net.state_dict(), tmp_path / "state_dict.pt")
    (tmp_path / "model_meta.json").write_text(json.dumps(
        {"architecture": "small_cnn", "classes": [str(i) for i in range(10)], "image_size": 16, "channels_last": True}))
    predictor = Predictor.from_files(tmp_path / "model_meta.json", tmp_path / "state_dict.pt")
    assert predictor.spec == PreprocessSpec(1, 16, "squash", draft=False)
    data = image_bytes(photo(30, 20)[..., 0], "L")
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("L").resize((16, 16), Image.BILINEAR), np.float32) / 255
    with torch.no_grad():
        expected = torch.softmax(net(torch.from_numpy(pixels)[None, None]), 1).numpy()
    assert np.allclose(predictor.predict_proba([data]), expected, atol=1e-6)
