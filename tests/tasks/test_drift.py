"""Drift check on real digits: skipped without a champion, quiet on the same distribution,
loud on a shifted one, and deterministic. Uses the real alibi-detect MMD test (no mocks)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from tasks import lake
from tasks.drift import DriftReference, DriftResult, check_drift, features, pca_reduce, sample_rows
from tasks.sample_data import digits_arrays

REPO_ROOT = Path(__file__).resolve().parents[2]


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _curated(images: np.ndarray, labels: np.ndarray, splits: list[str]) -> pa.Table:
    data = [_png(a) for a in images]
    shas = [hashlib.sha256(d).hexdigest() for d in data]
    n = len(data)
    return pa.table(
        {
            "sha256": pa.array(shas, pa.string()),
            "image": pa.array(data, pa.binary()),
            "label": pa.array([str(int(v)) for v in labels], pa.string()),
            "split": pa.array(splits, pa.string()),
            "component": pa.array(shas, pa.string()),
            "width": pa.array([images.shape[2]] * n, pa.int32()),
            "height": pa.array([images.shape[1]] * n, pa.int32()),
        }
    )


@pytest.fixture(scope="module")
def curated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One curated table, several versions.

    Half A and half B are disjoint halves of the real digits. Each version also carries
    inverted images in its val/test rows: only ``split == "train"`` may be compared, so a
    check that leaked val/test rows into its sample would see drift where there is none.
    """
    images, labels = digits_arrays()
    idx = np.arange(len(images))
    a, b = idx[idx % 2 == 0], idx[idx % 2 == 1]
    uri = str(tmp_path_factory.mktemp("drift_lake") / "curated_images")

    def version(train: np.ndarray, other: np.ndarray, train_pixels: np.ndarray | None = None, tag: str = "") -> int:
        pixels = np.concatenate([images[train] if train_pixels is None else train_pixels, 255 - images[other]])
        labs = np.concatenate([labels[train], labels[other]])
        splits = ["train"] * len(train) + [("val", "test")[i % 2] for i in range(len(other))]
        return lake.overwrite(uri, _curated(pixels, labs, splits), metadata={"run_id": f"test-{tag}"})

    v_ref = version(a, b[:300], tag="ref")  # half A as train
    v_same = version(b, a[:300], tag="same")  # half B as train: same distribution
    v_inverted = version(b, a[:300], train_pixels=255 - images[b], tag="inverted")  # negatives
    ones = b[labels[b] == 1]
    v_one_class = version(ones, a[:300], tag="one-class")  # only the digit 1
    v_tiny = version(b[:1], a[:300], tag="tiny")  # a single train row
    return {
        "uri": uri,
        "ref": v_ref,
        "same": v_same,
        "inverted": v_inverted,
        "one_class": v_one_class,
        "tiny": v_tiny,
        "n_a": len(a),
        "n_b": len(b),
        "n_ones": len(ones),
    }


def _reference(curated: dict[str, object]) -> DriftReference:
    return DriftReference(table=str(curated["uri"]), version=int(curated["ref"]), model_version="3")


def _report(result: DriftResult) -> dict[str, object]:
    return json.loads(Path(result.report_path).read_text())


# --------------------------------------------------------------------------- no champion


def test_skipped_without_champion(settings, curated) -> None:
    uri, version = str(curated["uri"]), int(curated["same"])
    result = check_drift(settings, uri, version, None, run_id="run-1")

    assert result.status == "skipped"
    assert "no champion" in result.reason and "first run" in result.reason
    assert result.reference_table is None and result.reference_version is None
    assert result.p_value is None and result.distance is None
    assert result.n_current == curated["n_b"] and result.n_reference == 0
    path = Path(result.report_path)
    assert path == settings.reports_path / "drift" / f"current_v{version}_skipped.json"
    report = _report(result)
    assert report["status"] == "skipped" and report["run_id"] == "run-1"
    assert report["current_version"] == version and report["is_drift"] is False


def test_skipped_path_imports_nothing_heavy(tmp_path: Path, curated) -> None:
    code = (
        "import sys\n"
        "from tasks.settings import load_settings\n"
        "from tasks.drift import check_drift\n"
        f"r = check_drift(load_settings(), {str(curated['uri'])!r}, {int(curated['same'])}, None, 'run-x')\n"
        "assert r.status == 'skipped', r\n"
        "heavy = sorted(m for m in ('alibi_detect', 'torch') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "CD4ML_HOME": str(tmp_path / "home"), "CD4ML_ENV": "sit", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_too_few_rows_is_skipped(settings, curated) -> None:
    result = check_drift(settings, str(curated["uri"]), int(curated["tiny"]), _reference(curated), run_id="run-1")
    assert result.status == "skipped" and "too few" in result.reason
    assert result.n_current == 1 and result.reference_version == curated["ref"]
    assert Path(result.report_path).name == f"current_v{curated['tiny']}_ref_v{curated['ref']}.json"


# --------------------------------------------------------------------------- the MMD test


def test_same_distribution_is_no_drift_and_deterministic(settings, curated) -> None:
    import torch

    uri, version, ref = str(curated["uri"]), int(curated["same"]), _reference(curated)
    rng_before = torch.get_rng_state()
    first = check_drift(settings, uri, version, ref, run_id="run-1")
    first_report = Path(first.report_path).read_bytes()
    second = check_drift(settings, uri, version, ref, run_id="run-1")

    assert first.status == "no_drift", first.reason
    assert first.p_value is not None and first.p_value >= settings.drift.p_value
    assert first.threshold == settings.drift.p_value
    cap = settings.drift.max_samples
    assert first.n_reference == min(cap, curated["n_a"]) and first.n_current == min(cap, curated["n_b"])
    assert first.n_overlap == 0  # disjoint halves
    assert first.champion_version == "3"
    assert Path(first.report_path) == settings.reports_path / "drift" / f"current_v{version}_ref_v{curated['ref']}.json"
    report = _report(first)
    assert {k: report[k] for k in first.to_dict()} == first.to_dict()

    # Same inputs, same answer, same report bytes; the caller's torch RNG is left alone.
    assert second == first
    assert Path(second.report_path).read_bytes() == first_report
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_inverted_images_are_drift(settings, curated) -> None:
    result = check_drift(settings, str(curated["uri"]), int(curated["inverted"]), _reference(curated), run_id="run-2")
    assert result.status == "drift", result.reason
    assert result.p_value is not None and result.p_value < result.threshold
    assert result.distance is not None and result.distance_threshold is not None
    assert result.distance > result.distance_threshold
    report = _report(result)
    assert report["is_drift"] is True and report["status"] == "drift"


def test_one_class_only_is_drift(settings, curated) -> None:
    result = check_drift(settings, str(curated["uri"]), int(curated["one_class"]), _reference(curated), run_id="run-3")
    assert result.status == "drift", result.reason
    assert result.n_current == curated["n_ones"]
    assert _report(result)["label_counts"]["current"] == {"1": curated["n_ones"]}


# --------------------------------------------------------------------------- pieces


def test_sample_rows_is_deterministic_and_order_free() -> None:
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(100)]
    picked = sample_rows(shas, 10, "reference")
    assert len(picked) == 10
    chosen = [shas[i] for i in picked]
    assert chosen == sorted(chosen)
    reversed_shas = shas[::-1]
    assert [reversed_shas[i] for i in sample_rows(reversed_shas, 10, "reference")] == chosen
    assert sample_rows(shas, 10, "current") != picked  # sides are sampled independently
    assert sorted(sample_rows(shas + shas[:5], 1000, "reference")) == list(range(100))  # dedupe, cap


def test_features_and_pca_shapes() -> None:
    rng = np.random.default_rng(0)
    images = rng.random((40, 1, 16, 16), dtype=np.float32)
    x = features(images)
    assert x.shape == (40, 256) and x.dtype == np.float32
    ref, cur = pca_reduce(x[:20], x[20:])
    assert ref.shape == (20, 19) and cur.shape == (20, 19)  # components <= n_reference - 1
    ref, cur = pca_reduce(x, x[:5], n_components=8)
    assert ref.shape == (40, 8) and cur.shape == (5, 8)
    assert np.allclose(ref.mean(axis=0), 0.0, atol=1e-5)
