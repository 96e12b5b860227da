"""Data drift: has the training data moved away from what the current champion learned on?

The reference sample is the ``split == "train"`` rows of the curated table version the
champion was trained on; the current sample is the ``split == "train"`` rows of the version
about to be trained on. Both are sampled deterministically (a salted hash of ``sha256``,
no RNG state), decoded to ``drift.image_size`` grey squares, turned into feature vectors by
``features`` (the seam: pixels today, champion embeddings later), reduced with a PCA fitted
on the reference, and compared with alibi-detect's MMD permutation test (pytorch backend,
fixed torch seed, CPU), so the same inputs always give the same answer.

Every call writes one JSON report under ``<reports>/drift/``. With no champion yet (first
run) the check is skipped, still reported, and nothing heavy (torch, alibi-detect) is imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks import lake
from tasks.reports import write_json
from tasks.settings import Settings

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

SAMPLE_SALT = "cd4ml-drift-v1"  # changing it changes which rows are sampled
PERMUTATION_SEED = 20_261_121  # torch seed for the permutation test
PCA_COMPONENTS = 32  # upper bound; also limited by the reference size and feature width
FEATURE_METHOD = "pixels+pca"
MIN_SAMPLES = 2  # the unbiased MMD^2 estimate needs at least two rows per side


@dataclass(frozen=True)
class DriftReference:
    """The data the current champion was trained on."""

    table: str
    version: int
    model_version: str | None


@dataclass(frozen=True)
class DriftResult:
    status: str  # "skipped" | "no_drift" | "drift"
    reason: str  # one human sentence
    reference_table: str | None
    reference_version: int | None
    champion_version: str | None
    current_table: str
    current_version: int
    p_value: float | None  # permutation-test p-value
    distance: float | None  # MMD^2 between the two samples (in feature space)
    threshold: float | None  # p-value below which drift is flagged (settings.drift.p_value)
    n_reference: int
    n_current: int
    report_path: str
    distance_threshold: float | None = None  # MMD^2 above which drift would be flagged
    n_overlap: int = 0  # rows (by sha256) present in both samples
    run_id: str = ""

    @property
    def is_drift(self) -> bool:
        return self.status == "drift"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- sampling


def _sample_key(sha: str, side: str) -> str:
    return hashlib.sha256(f"{SAMPLE_SALT}:{side}:{sha}".encode()).hexdigest()


def sample_rows(shas: list[str], max_samples: int, side: str) -> list[int]:
    """Indices of at most ``max_samples`` rows, chosen by a salted hash of their sha256.

    Independent of the table's row order and of any RNG state; duplicate sha256 values are
    kept once. The side name is part of the salt, so the reference and current samples are
    drawn independently even when one table version contains the other. The result is
    ordered by sha256.
    """
    first: dict[str, int] = {}
    for i, sha in enumerate(shas):
        first.setdefault(sha, i)
    chosen = sorted(first, key=lambda s: _sample_key(s, side))[:max_samples]
    return [first[s] for s in sorted(chosen)]


def _train_sample(settings: Settings, uri: str, version: int, side: str) -> tuple[list[str], list[bytes], Counter[str]]:
    table = lake.read(uri, version, columns=["sha256", "label", "split"], filter=[("split", "=", "train")])
    shas = [str(s) for s in table.column("sha256").to_pylist()]
    picked = sample_rows(shas, settings.drift.max_samples, side)
    if not picked:
        return [], [], Counter()
    wanted = [shas[i] for i in picked]
    # Second read fetches image bytes for the sampled rows only.
    rows = lake.read(
        uri,
        version,
        columns=["sha256", "image", "label"],
        filter=[("split", "=", "train"), ("sha256", "in", wanted)],
    )
    by_sha: dict[str, tuple[bytes, str]] = {}
    for sha, image, label in zip(
        rows.column("sha256").to_pylist(), rows.column("image").to_pylist(), rows.column("label").to_pylist()
    ):
        by_sha.setdefault(str(sha), (bytes(image), str(label)))
    images = [by_sha[s][0] for s in wanted]
    labels = Counter(by_sha[s][1] for s in wanted)
    return wanted, images, labels


def _count_train_rows(uri: str, version: int) -> int:
    return lake.read(uri, version, columns=["split"], filter=[("split", "=", "train")]).num_rows


# --------------------------------------------------------------------------- features


def features(images: "np.ndarray") -> "np.ndarray":
    """Feature vectors for a batch of decoded images (N, 1, S, S) -> (N, D) float32.

    The seam for a better representation: today the flattened pixels; later the champion
    model's embeddings. Whatever it returns is reduced by a PCA fitted on the reference.
    """
    import numpy as np

    return np.ascontiguousarray(images.reshape(len(images), -1), dtype=np.float32)


def pca_reduce(x_ref: "np.ndarray", x_cur: "np.ndarray", n_components: int = PCA_COMPONENTS) -> tuple["np.ndarray", "np.ndarray"]:
    """Project both samples on the top principal components of the reference (numpy SVD)."""
    import numpy as np

    k = min(n_components, x_ref.shape[0] - 1, x_ref.shape[1])
    if k < 1 or k >= x_ref.shape[1]:
        return x_ref.astype(np.float32), x_cur.astype(np.float32)
    ref = x_ref.astype(np.float64)
    mean = ref.mean(axis=0)
    _, _, vt = np.linalg.svd(ref - mean, full_matrices=False)
    basis = vt[:k].T
    project = lambda x: ((x.astype(np.float64) - mean) @ basis).astype(np.float32)  # noqa: E731
    return project(x_ref), project(x_cur)


# --------------------------------------------------------------------------- the test


def _mmd_test(x_ref: "np.ndarray", x_cur: "np.ndarray", settings: Settings) -> tuple[bool, float, float, float]:
    """alibi-detect MMD permutation test; returns (is_drift, p_value, distance, distance_threshold)."""
    import torch
    from alibi_detect.cd import MMDDrift

    # fork_rng: seed the permutations without disturbing the caller's torch RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PERMUTATION_SEED)
        detector = MMDDrift(
            x_ref,
            backend="pytorch",
            p_val=settings.drift.p_value,
            n_permutations=settings.drift.n_permutations,
            device="cpu",  # same answer on any machine; a few hundred rows need no GPU
        )
        prediction = detector.predict(x_cur, return_p_val=True, return_distance=True)
    data = prediction["data"]
    return (
        bool(data["is_drift"]),
        float(data["p_val"]),
        float(data["distance"]),
        float(data["distance_threshold"]),
    )


# --------------------------------------------------------------------------- report


def report_file(settings: Settings, current_version: int, reference_version: int | None) -> Path:
    name = (
        f"current_v{current_version}_skipped.json"
        if reference_version is None
        else f"current_v{current_version}_ref_v{reference_version}.json"
    )
    return settings.reports_path / "drift" / name


def _finish(result: DriftResult, settings: Settings, extra: dict[str, Any]) -> DriftResult:
    payload = {
        **result.to_dict(),
        "is_drift": result.is_drift,
        "settings": settings.drift.model_dump(mode="json"),
        **extra,
    }
    write_json(Path(result.report_path), payload)
    log.info("drift %s: %s (report %s)", result.status, result.reason, result.report_path)
    return result


def check_drift(
    settings: Settings,
    current_table: str,
    current_version: int,
    reference: DriftReference | None,
    run_id: str,
) -> DriftResult:
    """Compare the current training data with the champion's; always writes a JSON report."""
    threshold = settings.drift.p_value
    if reference is None:
        path = report_file(settings, current_version, None)
        result = DriftResult(
            status="skipped",
            reason=f"no champion in {settings.env}: first run, nothing to compare against",
            reference_table=None,
            reference_version=None,
            champion_version=None,
            current_table=current_table,
            current_version=current_version,
            p_value=None,
            distance=None,
            threshold=threshold,
            n_reference=0,
            n_current=_count_train_rows(current_table, current_version),
            report_path=str(path),
            run_id=run_id,
        )
        return _finish(result, settings, {"feature_method": None})

    started = time.perf_counter()
    path = report_file(settings, current_version, reference.version)
    ref_shas, ref_images, ref_labels = _train_sample(settings, reference.table, reference.version, "reference")
    cur_shas, cur_images, cur_labels = _train_sample(settings, current_table, current_version, "current")
    template = DriftResult(
        status="skipped",
        reason="",
        reference_table=reference.table,
        reference_version=reference.version,
        champion_version=reference.model_version,
        current_table=current_table,
        current_version=current_version,
        p_value=None,
        distance=None,
        threshold=threshold,
        n_reference=len(ref_shas),
        n_current=len(cur_shas),
        report_path=str(path),
        n_overlap=len(set(ref_shas) & set(cur_shas)),
        run_id=run_id,
    )
    extra: dict[str, Any] = {
        "feature_method": FEATURE_METHOD,
        "label_counts": {
            "reference": dict(sorted(ref_labels.items())),
            "current": dict(sorted(cur_labels.items())),
        },
    }

    if len(ref_shas) < MIN_SAMPLES or len(cur_shas) < MIN_SAMPLES:
        reason = (
            f"too few train rows to test (reference v{reference.version}: {len(ref_shas)}, "
            f"current v{current_version}: {len(cur_shas)}; need at least {MIN_SAMPLES} each)"
        )
        return _finish(dataclasses.replace(template, reason=reason), settings, extra)

    from tasks.images import decode_batch

    size = settings.drift.image_size
    x_ref, x_cur = pca_reduce(features(decode_batch(ref_images, size)), features(decode_batch(cur_images, size)))
    is_drift, p_value, distance, distance_threshold = _mmd_test(x_ref, x_cur, settings)
    versus = f"current v{current_version} vs reference v{reference.version}" + (
        f" (champion {reference.model_version})" if reference.model_version else ""
    )
    if is_drift:
        reason = f"drift: {versus}, MMD p-value {p_value:.4f} < {threshold}"
    else:
        reason = f"no drift: {versus}, MMD p-value {p_value:.4f} >= {threshold}"
    result = dataclasses.replace(
        template,
        status="drift" if is_drift else "no_drift",
        reason=reason,
        p_value=p_value,
        distance=distance,
        distance_threshold=distance_threshold,
    )
    extra["n_features"] = int(x_ref.shape[1])
    log.info("drift check took %.2fs", time.perf_counter() - started)
    return _finish(result, settings, extra)
