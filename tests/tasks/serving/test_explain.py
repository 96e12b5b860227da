"""Explanations of the champion's hard cases: real model, real digits, real Captum.

The images are what a monitor would pick from the test split: every misclassified digit and
the least confident correct ones. Checked: an overlay PNG per image, IG's completeness, re-runs
overwrite, undecodable bytes are reported and do not stop the rest, and the attributions are
about the digit (on the ink, and removing the most attributed pixels hurts the prediction more
than removing as many random ink pixels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tasks.serving.explain import (
    ABSOLUTE_TOLERANCE,
    MIN_SIDE,
    REFINE,
    RELATIVE_TOLERANCE,
    Explained,
    black_baseline,
    explain,
    file_name,
    integrated_gradients,
    write_index,
)
from tests.factories.digits import encode, split_rows

LOW_CONFIDENCE = 16  # least confident correct digits, next to every misclassified one


@dataclass(frozen=True)
class Selection:
    predictor: Any
    images: list[bytes]
    keys: list[str]
    labels: list[str]
    proba: np.ndarray


@pytest.fixture(scope="module")
def selection(champion) -> Selection:
    from tasks.models.loading import load_predictor
    from tasks.models.registry import mlflow_client

    settings, model = champion
    mlflow_client(settings)
    predictor = load_predictor(settings, model.uri)
    rows = split_rows("test")
    proba = predictor.predict_proba([r["image"] for r in rows])
    predicted = [predictor.classes[i] for i in proba.argmax(axis=1)]
    wrong = [i for i, r in enumerate(rows) if predicted[i] != r["label"]]
    right = sorted((i for i, r in enumerate(rows) if predicted[i] == r["label"]), key=lambda i: proba[i].max())
    picked = wrong + right[:LOW_CONFIDENCE]
    return Selection(
        predictor=predictor,
        images=[rows[i]["image"] for i in picked],
        keys=[rows[i]["sha256"] for i in picked],
        labels=[rows[i]["label"] for i in picked],
        proba=proba[picked],
    )


@pytest.fixture(scope="module")
def explained(selection: Selection, tmp_path_factory: pytest.TempPathFactory) -> tuple[Explained, Path]:
    out = tmp_path_factory.mktemp("explained")
    return explain(selection.predictor, selection.images, selection.keys, out, labels=selection.labels), out


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_an_overlay_png_per_selected_image(selection: Selection, explained: tuple[Explained, Path]) -> None:
    result, out = explained
    assert result.skipped == ()
    assert [e.key for e in result.explanations] == selection.keys
    assert sorted(p.name for p in out.iterdir()) == sorted(file_name(k) for k in selection.keys)
    classes = selection.predictor.classes
    for e, proba, label in zip(result.explanations, selection.proba, selection.labels):
        assert e.path.parent == out and e.path.name == f"{e.key}.png"  # a sha256 key is its own file name
        with Image.open(e.path) as img:
            img.verify()
        with Image.open(e.path) as img:
            assert img.format == "PNG" and img.mode == "RGB"
            assert img.width >= 2 * MIN_SIDE and img.height >= MIN_SIDE
            assert img.text["key"] == e.key
        assert e.predicted == classes[int(proba.argmax())]
        assert e.confidence == pytest.approx(float(proba.max()), abs=1e-5)
        assert e.true_label == label and e.correct is (e.predicted == label)
        assert e.confidence >= e.runner_up_confidence and e.runner_up != e.predicted
        assert f"predicted {e.predicted} " in e.caption and e.caption.endswith(f"true {label}")


def test_index_links_every_overlay(explained: tuple[Explained, Path]) -> None:
    result, out = explained
    index = write_index(result.explanations, out, skipped=[("a<b>", "not a decodable image")])
    page = index.read_text()
    assert index == out / "index.html"
    for e in result.explanations:
        assert f'src="{e.path.name}"' in page  # relative: the page and its images move together
        assert e.caption in page
    assert "a&lt;b&gt;" in page and "<b>" not in page


def test_integrated_gradients_are_complete(explained: tuple[Explained, Path]) -> None:
    """Attributions add up to logit(image) - logit(black): Captum's convergence delta is small next to that gap."""
    result, _ = explained
    deltas = np.array([e.convergence_delta for e in result.explanations])
    gaps = np.array([e.logit_gap for e in result.explanations])
    steps = np.array([e.steps for e in result.explanations])
    assert np.all(np.abs(deltas) <= RELATIVE_TOLERANCE * np.abs(gaps) + ABSOLUTE_TOLERANCE), list(zip(deltas, gaps, steps))
    assert np.abs(deltas).sum() <= 0.02 * np.abs(gaps).sum()
    assert set(steps) <= {32, 32 * REFINE} and np.mean(steps == 32) >= 0.5  # most need no refinement


def test_a_rerun_overwrites_the_same_files(selection: Selection, tmp_path: Path) -> None:
    keys = [f"landing/2026-11-21/{label}/{key[:8]}.png" for key, label in zip(selection.keys, selection.labels)]
    first = explain(selection.predictor, selection.images, keys, tmp_path, labels=selection.labels)
    before = files(tmp_path)
    second = explain(selection.predictor, selection.images, keys, tmp_path, labels=selection.labels)
    assert files(tmp_path) == before  # same names, same pixels: nothing new, nothing duplicated
    assert second == first
    explain(selection.predictor, selection.images, keys, tmp_path, labels=selection.labels, batch=5)
    assert files(tmp_path).keys() == before.keys()  # cut into other batches: still the same files
    assert all(e.path.parent == tmp_path and "/" not in e.path.name for e in first.explanations)


def test_undecodable_images_are_skipped_and_reported(selection: Selection, tmp_path: Path) -> None:
    good = list(zip(selection.images[:6], selection.keys[:6]))
    truncated = selection.images[0][: len(selection.images[0]) // 2]
    images = [good[0][0], b"not an image", good[1][0], truncated, "\u00e9t\u00e9", *[g[0] for g in good[2:]]]
    keys = [good[0][1], "bad/text.png", good[1][1], "bad/truncated.png", "bad/str.png", *[g[1] for g in good[2:]]]
    result = explain(selection.predictor, images, keys, tmp_path, batch=2)  # one batch holds nothing decodable
    assert [k for k, _ in result.skipped] == ["bad/text.png", "bad/truncated.png", "bad/str.png"]
    reasons = [reason for _, reason in result.skipped]
    assert "not a decodable image" in reasons[0] and "not a decodable image" in reasons[1]
    assert "not base64" in reasons[2]
    assert [e.key for e in result.explanations] == [k for _, k in good]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{k}.png" for _, k in good)
    assert all(e.true_label is None and e.correct is None for e in result.explanations)


def test_no_images_no_files(selection: Selection, tmp_path: Path) -> None:
    out = tmp_path / "explanations"
    assert explain(selection.predictor, [], [], out) == Explained()
    assert not out.exists()
    with pytest.raises(ValueError, match="keys"):
        explain(selection.predictor, selection.images[:2], selection.keys[:1], out)
    with pytest.raises(ValueError, match="unique"):
        explain(selection.predictor, selection.images[:2], [selection.keys[0]] * 2, out)
    assert not out.exists()


def test_the_baseline_is_a_black_image_as_the_model_sees_it(selection: Selection) -> None:
    predictor = selection.predictor
    black = predictor.inputs([encode(np.zeros((8, 8), np.uint8))])
    assert torch.allclose(black_baseline(predictor.spec, black), black)
    assert float(black.abs().max()) > 0.5  # a standardised model: black is not zero in its input space


def test_attributions_are_about_the_digit(selection: Selection, explained: tuple[Explained, Path]) -> None:
    result, _ = explained
    correct = [e for e in result.explanations if e.correct]
    assert len(correct) >= LOW_CONFIDENCE
    on_ink = [e.ink_share > e.ink_area for e in correct]  # mean |attribution| on ink > on background
    assert sum(on_ink) >= 0.9 * len(correct), [(e.ink_share, e.ink_area) for e in correct]

    # Faithfulness: blacking out the 32 most attributed pixels costs the predicted logit more than
    # blacking out 32 random ink pixels.
    predictor, k = selection.predictor, 32
    picked = [i for i, e in enumerate(result.explanations) if e.correct]
    x = predictor.inputs([selection.images[i] for i in picked])
    with torch.no_grad():
        logits = predictor.network(x)
    target = logits.argmax(dim=1)
    baseline = black_baseline(predictor.spec, x)
    attributions, delta = integrated_gradients(predictor.network, x, target, baseline)
    rows = torch.arange(len(x))
    with torch.no_grad():
        gap = logits[rows, target] - predictor.network(baseline)[rows, target]
    assert torch.allclose(attributions.sum(dim=(1, 2, 3)) - gap, delta, atol=1e-3)  # what delta means

    def drop(j: int, pixels: torch.Tensor) -> float:
        y = x[j].clone().flatten()
        y[pixels] = baseline[j].flatten()[pixels]
        with torch.no_grad():
            return float(logits[j, target[j]] - predictor.network(y.view(1, *x.shape[1:]))[0, target[j]])

    generator = torch.Generator().manual_seed(0)
    wins = 0
    for j in range(len(x)):
        ink = (x[j].mean(dim=0).flatten() > x[j].mean()).nonzero().flatten()
        random_ink = ink[torch.randperm(len(ink), generator=generator)[:k]]
        most = attributions[j].sum(dim=0).flatten().topk(k).indices
        wins += drop(j, most) > drop(j, random_ink)
    assert wins >= 0.8 * len(x), f"{wins}/{len(x)}"


def test_file_names_are_safe_and_distinct() -> None:
    sha = "ab" * 32
    assert file_name(sha) == f"{sha}.png"
    names = [file_name(k) for k in ("a/b.png", "a_b.png", "a\\b.png", "../../etc/passwd", "", ".", "x" * 300)]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name and "\\" not in name and not name.startswith(".") and len(name) < 120
    assert file_name("a/b.png") == file_name("a/b.png")
