"""Data drift: is the NEW data something the champion has not learned? A gate with a policy per environment.

What is compared
- ``new``: the batch as it arrived: the images of the raw version the current curated version was
  built from (the DAG passes it; else its commit's ``raw_version``) that neither the champion's
  raw version nor its curated data has, up to ``drift.max_samples`` chosen by a salted hash of
  sha256 (no RNG state). Not the curated survivors: curation's drops are not a random sample (a
  near-duplicate rule that thins one class of thin strokes), and judged on what it kept a batch
  from the same source looked drifted (issue 23). Ingest admits only images it decoded, with their
  labels, so every raw row can be read. Exact copies of images the champion's data already had
  share their sha256 and are left out: they are not new data. A small drifted batch is not diluted
  by the old data. This decides. A curated version with no raw version recorded is judged on its
  curated images, and the report says so.
- ``whole``: the current version's held-out splits against the champion's; reported, not decided on.
- ``reference``: for the softmax and embedding tests, the held-out (val and test) images of the
  curated version the champion was trained on, up to ``drift.max_reference``. Not its train split:
  on the images it fitted, a model is more confident than on any unseen image, so every new batch
  would look drifted. Curated, so without the near-copies and outliers curation removed: it is the
  only held-out set there is (a dropped copy has no split, and a copy of a train image would look
  "fitted"); what remains is the bias of a reference curation thinned, as small as curation's drops
  (its per-class share is capped) and measured in bench/drift_families.py. For the label test, the champion's raw version (every label as it
  arrived: labels need no model), so neither side of the label test passes through curation.

Features from the champion itself (black-box shift detection, Rabanser et al., "Failing
Loudly", 2019): its softmax outputs, tested with a one-sided Kolmogorov-Smirnov test on its
confidence (the max softmax: is it less sure on the new images?), the per-class KS p-values
(Bonferroni) reported beside it; and its penultimate-layer embedding projected on the top
principal components of the champion's train-split embeddings (independent of both tested
samples: a basis fitted on the reference favours it), tested with MMD (alibi-detect, permutation test, fixed
seed, exact permutation p-value). Per-class KS as the decision false-alarmed 8% of the time at
a 5% level on a few-hundred-image reference; the confidence test 0% (bench/drift_eval.py). Where labels exist, a
chi-square contingency test of the new class counts against the reference's, classes expected fewer
than 5 times pooled (the approximation's validity rule). The three tests share
``drift.familywise_alpha`` (Bonferroni: each at alpha / 3), so a check on data from the same
distribution raises a false alarm with probability at most that alpha; the MMD permutation p-value
is never below 1 / (``drift.n_permutations`` + 1), so settings refuse a permutation count whose
floor is not below alpha / 3 (the default 500 gives 0.002 against 0.0167). A model that is not a
cd4ml image classifier falls back to grey pixels for the MMD test (no softmax test).

Severity: the champion's accuracy on the new labelled sample against its accuracy on the
reference version's test split.

The detectors (the reference softmax, MMD with a ``drift.mmd_reference`` subsample: its cost
grows with the square of the sample, PCA basis, class proportions, the champion's test
accuracy) are fitted once per champion version and settings, saved with alibi-detect's
``save_detector`` under ``<reports>/drift/detectors/`` and loaded by later checks.

Harmful or not: a detected drift is *harmful* when the champion's accuracy on the new labelled
sample is more than ``drift.harmful_accuracy_drop`` (5 points) below its test accuracy, or when that
cannot be measured (no labels, no champion softmax). A harmless drift (the data moved, the
champion copes: a slightly darker camera) is reported and alerted as a warning.

Policy (``drift.policy`` per environment): ``warn`` alerts and trains; ``block`` stops training
on a harmful drift (``DriftBlockedError``) and alerts on-call (a harmless one warns and trains);
``retrain`` trains only when the new data drifted or there is no champion yet
(``should_train``): a batch the champion already handles does not start a new model. With no
champion, or no new image, the check is skipped cheaply (no torch or alibi-detect import). Every check writes a JSON report and an HTML
page with plots (p-values per test, the embedding projection of both samples, class counts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.data import lake
from tasks.errors import DataError
from tasks.files import write_json
from tasks.settings import Settings

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

SAMPLE_SALT = "cd4ml-drift-v1"  # changing it changes which rows are sampled
PERMUTATION_SEED = 20_261_121  # torch seed for the permutation test
PCA_COMPONENTS = 32  # upper bound; also limited by the reference size and feature width
MIN_SAMPLES = 10  # fewer new images: reported, not tested (no power, and the MMD estimate needs >= 2)
MIN_EXPECTED = 5.0  # chi-square cells expected below this are pooled (the usual validity rule of the approximation)
TESTS = ("softmax_ks", "embedding_mmd", "label_chi2")  # settings.DRIFT_TEST_COUNT counts them
REFERENCE_SPLITS = ("val", "test")  # the champion's data it did not fit on


class DriftBlockedError(DataError, RuntimeError):
    """The new data drifted and this environment's policy is ``block``: training stops."""


@dataclass(frozen=True)
class DriftReference:
    """The data the current champion was trained on, and the champion."""

    table: str
    version: int
    model_version: str | int | None
    # The raw version that curated data was built from; None: read from the curated commit (or unrecorded).
    raw_version: int | None = None


@dataclass(frozen=True)
class Batch:
    """Where the new images are read, and which they are (their sha256)."""

    table: str
    version: int
    source: str  # "raw": as ingested, before curation | "curated": no raw version recorded (older data)
    shas: set[str]


@dataclass(frozen=True)
class DriftResult:
    status: str  # "skipped" | "no_drift" | "drift"
    reason: str  # one human sentence
    reference_table: str | None
    reference_version: int | None
    champion_version: str | None
    current_table: str
    current_version: int
    p_value: float | None  # the smallest Bonferroni-adjusted p-value of the decisive tests
    threshold: float | None  # the family-wise level (settings.drift.familywise_alpha)
    n_reference: int
    n_current: int  # new images tested (the decision's sample)
    report_path: str
    n_new: int = 0  # new images in the batch (before sampling)
    raw_table: str | None = None  # where the new images were read: the raw table as ingested ...
    raw_version: int | None = None  # ... at this version (None: read from the curated version, no raw one recorded)
    reference_raw_version: int | None = None  # the raw version the champion's data was curated from
    tests: list[dict] = field(default_factory=list)  # per test: name, p_value, threshold, drift, statistic
    severity: dict = field(default_factory=dict)  # champion accuracy: test split, new data, drop
    whole: dict = field(default_factory=dict)  # the whole train split against the reference
    feature_method: str | None = None  # champion | pixels
    policy: str = "warn"
    html_path: str | None = None
    run_id: str = ""
    # Detected drift only: True when it costs the champion more than drift.harmful_accuracy_drop, or when that
    # cannot be measured; False when the champion's accuracy on the new images holds. None: no drift.
    harmful: bool | None = None

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
    kept once. The side name is part of the salt, so samples of different roles are drawn
    independently. The result is ordered by sha256.
    """
    first: dict[str, int] = {}
    for i, sha in enumerate(shas):
        first.setdefault(sha, i)
    chosen = sorted(first, key=lambda s: _sample_key(s, side))[:max_samples]
    return [first[s] for s in sorted(chosen)]


@dataclass(frozen=True)
class Sample:
    shas: list[str]
    images: list[bytes]
    labels: list[str]


def _read_sample(uri: str, version: int, limit: int, side: str, splits: tuple[str, ...] | None = ("train",),
                 only: set[str] | None = None) -> tuple[Sample, int]:
    """(a hash sample of at most ``limit`` rows, optionally among ``only``; how many rows were eligible)."""
    filters = [("split", "in", list(splits))] if splits else None
    if only is not None and not splits:  # the caller already read the column: ``only`` is the eligible set
        shas = sorted(only)
    else:
        table = lake.read(uri, version, columns=["sha256"], filter=filters)
        shas = [str(s) for s in table.column("sha256").to_pylist()]
        if only is not None:
            shas = [s for s in shas if s in only]
    eligible = len(set(shas))
    wanted = [shas[i] for i in sample_rows(shas, limit, side)]
    if not wanted:
        return Sample([], [], []), eligible
    rows = lake.read(uri, version, columns=["sha256", "image", "label"],
                     filter=[*(filters or []), ("sha256", "in", wanted)])
    by_sha = {}
    for sha, image, label in zip(rows.column("sha256").to_pylist(), rows.column("image").to_pylist(),
                                 rows.column("label").to_pylist()):
        by_sha.setdefault(str(sha), (bytes(image), str(label)))
    return Sample(wanted, [by_sha[s][0] for s in wanted], [by_sha[s][1] for s in wanted]), eligible


def _shas(uri: str, version: int) -> set[str]:
    return {str(s) for s in lake.read(uri, version, columns=["sha256"]).column("sha256").to_pylist()}


def recorded_raw_version(curated_table: str, curated_version: int) -> int | None:
    """The raw version a curated (or sampled) version was built from, as its commit records it; None if it does not."""
    commit = lake.commit_at(curated_table, curated_version)
    value = commit.metadata.get("raw_version", "") if commit is not None else ""
    return int(value) if value.isdigit() else None


def arrived_batch(settings: Settings, current_table: str, current_version: int, reference: DriftReference,
                  raw_version: int | None) -> Batch:
    """The images that arrived since the champion's training data, as ingested (module doc: what is compared).

    New = the raw version's images that neither the champion's raw version nor its curated data
    has. Curation's drops never touch this side: a class it thinned still counts in full. Exact
    copies of images the champion's data already had share their sha256 and are not new (the raw
    table keeps one row per sha256). Without a recorded raw version: the curated images, as before.
    """
    known = _shas(reference.table, reference.version)
    if raw_version is None or not lake.exists(settings.raw_table):
        log.warning("drift: %s v%s records no raw version: judging its curated images (curation's drops included)",
                    current_table, current_version)
        return Batch(current_table, current_version, "curated", _shas(current_table, current_version) - known)
    if reference.raw_version is not None:
        known |= _shas(settings.raw_table, reference.raw_version)
    return Batch(settings.raw_table, raw_version, "raw", _shas(settings.raw_table, raw_version) - known)


def reference_label_counts(settings: Settings, reference: DriftReference, held_out: list[str]) -> dict[str, int]:
    """The champion's class counts as its data arrived (its raw version), or its held-out labels without one.

    Labels need no model, so unlike the softmax and embedding tests the label test may use every
    image the champion's data arrived with: both sides are then counted before curation, and
    curation's drops bias neither.
    """
    if reference.raw_version is None or not lake.exists(settings.raw_table):
        return dict(sorted(Counter(held_out).items()))
    labels = lake.read(settings.raw_table, reference.raw_version, columns=["label"]).column("label").to_pylist()
    return dict(sorted(Counter(str(v) for v in labels).items()))


# --------------------------------------------------------------------------- features


class Featurizer:
    """The champion's softmax and penultimate embedding for image bytes; pixels when it has none.

    The champion runs its own preprocessing and network (the runtime copied into it), so drift
    sees the images exactly as the served model does.
    """

    def __init__(self, settings: Settings, model_uri: str | None) -> None:
        from cd4ml_runtime.preprocess import PreprocessSpec

        self.predictor: Any = None
        self.classes: list[str] = []
        self.pixel_spec = PreprocessSpec(1, settings.drift.image_size, "squash", draft=False)
        self.method = "pixels"
        if model_uri is None:
            return
        from tasks.models.loading import load_predictor
        from tasks.models.registry import mlflow_client

        mlflow_client(settings)
        try:
            self.predictor = load_predictor(settings, model_uri)
        except ValueError as exc:  # not a cd4ml image classifier: no softmax or embedding to read
            log.warning("drift: %s; falling back to pixels", exc)
            return
        self.classes = list(self.predictor.classes)
        self.method = "champion"

    def __call__(self, images: list[bytes]) -> tuple["np.ndarray | None", "np.ndarray"]:
        """(softmax (N, K) or None, embedding (N, D)) as float32."""
        import numpy as np

        if self.predictor is None:
            from cd4ml_runtime.preprocess import decode_many

            x = decode_many(images, self.pixel_spec).astype(np.float32) / 255.0
            return None, x.reshape(len(x), -1)
        embeds, probs = self.predictor.embed_and_proba(images)
        return probs, embeds

    def accuracy(self, probs: "np.ndarray | None", labels: list[str]) -> float | None:
        if probs is None or not labels:
            return None
        predicted = probs.argmax(axis=1)
        return float(sum(self.classes[p] == y for p, y in zip(predicted, labels)) / len(labels))


# --------------------------------------------------------------------------- detectors


@dataclass
class Detectors:
    folder: Path
    ref_probs: "np.ndarray | None"  # the champion's softmax on the reference images (None: pixels)
    mmd: Any  # alibi-detect MMDDrift on the projected embedding
    mean: "np.ndarray"
    basis: "np.ndarray"
    meta: dict  # classes, class proportions, test accuracy, sizes, method

    def project(self, embedding: "np.ndarray") -> "np.ndarray":
        import numpy as np

        return ((embedding.astype(np.float64) - self.mean) @ self.basis).astype(np.float32)


def _pca(x: "np.ndarray", k: int) -> tuple["np.ndarray", "np.ndarray"]:
    import numpy as np

    ref = x.astype(np.float64)
    mean = ref.mean(axis=0)
    k = max(1, min(k, ref.shape[0] - 1, ref.shape[1]))
    _, _, vt = np.linalg.svd(ref - mean, full_matrices=False)
    return mean, vt[:k].T


def detector_folder(settings: Settings, reference: DriftReference, method_key: str) -> Path:
    cfg = settings.drift
    key = hashlib.sha256(json.dumps({
        "table": reference.table, "version": reference.version, "model": str(reference.model_version),
        "raw": reference.raw_version,
        "max_reference": cfg.max_reference, "mmd_reference": cfg.mmd_reference, "p": cfg.familywise_alpha,
        "perm": cfg.n_permutations, "size": cfg.image_size, "method": method_key, "salt": SAMPLE_SALT, "format": 4,
    }, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{settings.registry.model_name}-v{reference.model_version}-{key}"
    return settings.reports_path / "drift" / "detectors" / name


def load_or_fit(settings: Settings, reference: DriftReference, featurizer: Featurizer) -> Detectors:
    """The champion's detectors: loaded when fitted before for this champion and settings, else fitted and saved."""
    import numpy as np
    from alibi_detect.saving import load_detector, save_detector

    folder = detector_folder(settings, reference, featurizer.method)
    meta_file = folder / "meta.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        arrays = np.load(folder / "reference.npz")
        return Detectors(folder, arrays["probs"] if meta["has_softmax"] else None, load_detector(folder / "mmd"),
                         arrays["mean"], arrays["basis"], meta)

    from alibi_detect.cd import MMDDrift

    cfg = settings.drift
    alpha = cfg.familywise_alpha / len(TESTS)
    # Held out from fitting: on its own training images a model is more confident than on any unseen
    # image, so a train-split reference would call every new batch "drift" (measured: p = 0).
    sample, _ = _read_sample(reference.table, reference.version, cfg.max_reference, "reference",
                             splits=REFERENCE_SPLITS)
    if len(sample.shas) < MIN_SAMPLES:
        raise DriftBlockedError(f"the champion's data {reference.table} v{reference.version} has {len(sample.shas)} "
                                f"held-out ({'/'.join(REFERENCE_SPLITS)}) images; the drift reference needs {MIN_SAMPLES}")
    probs, embedding = featurizer(sample.images)
    # The basis from the train split, not from the reference: a basis fitted on the reference is tuned to
    # that sample's own noise, so the reference spreads more along it than any other sample of the same
    # distribution and the MMD sees a difference that is not there. Independent of both tested samples,
    # it keeps the permutation test exact.
    train, _ = _read_sample(reference.table, reference.version, cfg.max_reference, "pca", splits=("train",))
    mean, basis = _pca(featurizer(train.images)[1] if len(train.shas) > PCA_COMPONENTS else embedding, PCA_COMPONENTS)
    projected = ((embedding.astype(np.float64) - mean) @ basis).astype(np.float32)
    mmd_rows = sample_rows(sample.shas, cfg.mmd_reference, "mmd-reference")
    with _seeded():
        mmd = MMDDrift(projected[mmd_rows], backend="pytorch", p_val=alpha, n_permutations=cfg.n_permutations,
                       device="cpu")
    test, _ = _read_sample(reference.table, reference.version, cfg.max_reference, "reference-test", splits=("test",))
    test_probs = featurizer(test.images)[0] if test.images else None
    counts = reference_label_counts(settings, reference, sample.labels)
    total = sum(counts.values())
    meta = {
        "has_softmax": probs is not None, "method": featurizer.method, "classes": featurizer.classes,
        "n_permutations": cfg.n_permutations,
        "class_counts": counts, "label_reference": "raw" if reference.raw_version is not None else "held-out",
        "class_proportions": {c: n / total for c, n in counts.items()},
        "n_reference": len(sample.shas), "n_mmd_reference": len(mmd_rows), "n_test": len(test.shas),
        "test_accuracy": featurizer.accuracy(test_probs, test.labels),
        "reference_projection": projected[:, :2][sample_rows(sample.shas, 1000, "plot")].tolist(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_detector(mmd, folder / "mmd")
    np.savez(folder / "reference.npz", mean=mean, basis=basis,
             probs=probs if probs is not None else np.zeros((0, 0), dtype=np.float32))
    write_json(meta_file, meta)  # last: a folder without meta.json is refitted
    return Detectors(folder, probs, mmd, mean, basis, meta)


class _seeded:
    """Seed torch for the permutation test without disturbing the caller's RNG state."""

    def __enter__(self):
        import torch

        self._fork = torch.random.fork_rng(devices=[])
        self._fork.__enter__()
        torch.manual_seed(PERMUTATION_SEED)

    def __exit__(self, *exc):
        return self._fork.__exit__(*exc)


# --------------------------------------------------------------------------- the tests


def run_tests(detectors: Detectors, featurizer: Featurizer, sample: Sample, alpha: float) -> tuple[list[dict], dict]:
    """The three tests on one sample; (tests, extra: accuracy, projection, class counts)."""
    from scipy import stats

    probs, embedding = featurizer(sample.images)
    projected = detectors.project(embedding)
    tests: list[dict] = []
    if detectors.ref_probs is not None:
        # Decides: is the champion LESS confident on the new images (one-sided KS on the max softmax)?
        # Reported: KS per class (Bonferroni), which on a few hundred held-out reference images
        # false-alarmed 8% of the time at a 5% level (bench/drift_eval.py), against 0% for this.
        confidence = stats.ks_2samp(probs.max(axis=1), detectors.ref_probs.max(axis=1), alternative="greater")
        per_class = [float(stats.ks_2samp(probs[:, k], detectors.ref_probs[:, k]).pvalue)
                     for k in range(probs.shape[1])]
        tests.append({"name": "softmax_ks", "p_value": float(confidence.pvalue), "threshold": alpha,
                      "drift": bool(confidence.pvalue < alpha), "statistic": float(confidence.statistic),
                      "per_class_p_bonferroni": {c: min(1.0, p * len(per_class))
                                                 for c, p in zip(detectors.meta["classes"], per_class)}})
    with _seeded():
        data = detectors.mmd.predict(projected, return_p_val=True, return_distance=True)["data"]
    # alibi-detect reports #(permuted >= observed) / n, which can be 0 and runs a little liberal
    # (measured: 2% false alarms at a 1.67% level); the exact permutation p-value counts the
    # observed arrangement too: (1 + #) / (1 + n).
    n = detectors.meta["n_permutations"]
    p_mmd = (1 + round(float(data["p_val"]) * n)) / (1 + n)
    tests.append({"name": "embedding_mmd", "p_value": p_mmd, "threshold": alpha, "drift": bool(p_mmd < alpha),
                  "statistic": float(data["distance"])})
    counts = Counter(sample.labels)
    tests.append({"name": "label_chi2", "threshold": alpha, **label_test(detectors.meta["class_counts"], counts, alpha)})
    extra = {"accuracy": featurizer.accuracy(probs, sample.labels), "class_counts": dict(sorted(counts.items())),
             "projection": projected[:, :2][:1000].tolist()}
    return tests, extra


def label_test(reference: dict[str, int], counts: dict[str, int], alpha: float) -> dict[str, Any]:
    """Chi-square contingency test of two samples' class counts, rare classes pooled.

    Both sides are counted samples, so a contingency test (the reference's proportions are
    estimates too). The chi-square approximation needs every expected count >= ``MIN_EXPECTED``:
    a class of 3 images in 400 would otherwise swing p by itself. The classes whose expected count
    falls below it (in either sample) are pooled into one cell, smallest first, until that cell
    reaches it; with fewer than two cells left there is nothing to test (p = 1).
    """
    import numpy as np
    from scipy import stats

    classes = sorted(set(reference) | set(counts), key=lambda c: (reference.get(c, 0) + counts.get(c, 0), c))
    table = np.array([[reference.get(c, 0) for c in classes], [counts.get(c, 0) for c in classes]], dtype=float)
    totals = table.sum(axis=0)
    shares = table.sum(axis=1) / table.sum()

    def small(total: float) -> bool:
        return bool((shares * total < MIN_EXPECTED).any())

    pooled = 0  # classes are sorted by size: the rare ones are a prefix
    while pooled < len(classes) and (small(totals[pooled]) or (pooled > 0 and small(totals[:pooled].sum()))):
        pooled += 1
    cells = np.column_stack([table[:, :pooled].sum(axis=1), table[:, pooled:]]) if pooled else table
    if cells.shape[1] < 2 or (cells.sum(axis=0) == 0).any():
        p, statistic = 1.0, 0.0
    else:
        chi = stats.chi2_contingency(cells, correction=False)
        p, statistic = float(chi.pvalue), float(chi.statistic)
    return {"p_value": p, "drift": bool(p < alpha), "statistic": statistic, "pooled_classes": classes[:pooled],
            "unseen_classes": sorted(set(counts) - set(reference))}


# --------------------------------------------------------------------------- report


def report_file(settings: Settings, current_version: int, reference_version: int | None) -> Path:
    name = (f"current_v{current_version}_skipped.json" if reference_version is None
            else f"current_v{current_version}_ref_v{reference_version}.json")
    return settings.reports_path / "drift" / name


def _finish(result: DriftResult, settings: Settings, extra: dict[str, Any]) -> DriftResult:
    path = Path(result.report_path)
    if extra.get("plots"):
        from tasks.monitoring.drift_page import write_html

        result = dataclasses.replace(result, html_path=str(write_html(path.with_suffix(".html"), result, extra)))
    write_json(path, {**result.to_dict(), "is_drift": result.is_drift,
                      "settings": settings.drift.model_dump(mode="json"),
                      **{k: v for k, v in extra.items() if k != "plots"}})
    log.info("drift %s: %s (report %s)", result.status, result.reason, result.report_path)
    return result


def _skip(settings: Settings, template: DriftResult, reason: str) -> DriftResult:
    return _finish(dataclasses.replace(template, status="skipped", reason=reason), settings, {})


# --------------------------------------------------------------------------- the check


def check_drift(settings: Settings, current_table: str, current_version: int, reference: DriftReference | None,
                run_id: str, raw_version: int | None = None) -> DriftResult:
    """Compare the new data, as ingested, with the champion's training data; always writes a report. Never raises on drift.

    ``raw_version``: the raw version ``current_version`` was curated from (the DAG passes it); None
    reads it from the curated commit.
    """
    cfg = settings.drift
    template = DriftResult(
        status="skipped", reason="", reference_table=reference.table if reference else None,
        reference_version=reference.version if reference else None,
        champion_version=str(reference.model_version) if reference else None, current_table=current_table,
        current_version=current_version, p_value=None, threshold=cfg.familywise_alpha, n_reference=0, n_current=0,
        report_path=str(report_file(settings, current_version, reference.version if reference else None)),
        policy=cfg.policy, run_id=run_id,
    )
    if reference is None:
        return _skip(settings, template, f"no champion in {settings.env}: first run, nothing to compare against")
    if reference.raw_version is None:
        reference = dataclasses.replace(reference, raw_version=recorded_raw_version(reference.table, reference.version))
    if raw_version is None:
        raw_version = recorded_raw_version(current_table, current_version)
    batch = arrived_batch(settings, current_table, current_version, reference, raw_version)
    template = dataclasses.replace(template, n_new=len(batch.shas), reference_raw_version=reference.raw_version,
                                   raw_table=settings.raw_table if batch.source == "raw" else None,
                                   raw_version=batch.version if batch.source == "raw" else None)
    if len(batch.shas) < MIN_SAMPLES:
        return _skip(settings, template, f"{len(batch.shas)} new image(s) since the champion's training data "
                                         f"{reference.table} v{reference.version} in {_batch_name(batch)}: nothing to "
                                         f"test (need {MIN_SAMPLES})")

    started = time.perf_counter()
    model_uri = f"models:/{settings.registry.model_name}/{reference.model_version}" if reference.model_version else None
    alpha = cfg.familywise_alpha / len(TESTS)
    new, _ = _read_sample(batch.table, batch.version, cfg.max_samples, "new", splits=None, only=batch.shas)
    whole_sample, _ = _read_sample(current_table, current_version, cfg.max_samples, "whole", splits=REFERENCE_SPLITS)
    with _seeded():  # building the model and (re)fitting detectors draw random numbers: not the caller's
        featurizer = Featurizer(settings, model_uri)
        detectors = load_or_fit(settings, reference, featurizer)
        tests, extra_new = run_tests(detectors, featurizer, new, alpha)
        whole_tests, extra_whole = run_tests(detectors, featurizer, whole_sample, alpha)

    drifted = [t["name"] for t in tests if t["drift"]]
    test_accuracy = detectors.meta.get("test_accuracy")
    severity = {"champion_test_accuracy": test_accuracy, "champion_new_accuracy": extra_new["accuracy"],
                "accuracy_drop": (round(test_accuracy - extra_new["accuracy"], 4)
                                  if test_accuracy is not None and extra_new["accuracy"] is not None else None)}
    versus = (f"{len(new.shas)} new images of {_batch_name(batch)} vs the champion's training data "
              f"v{reference.version} (champion v{reference.model_version})")
    smallest = min(t["p_value"] for t in tests)
    harmful = is_harmful(severity["accuracy_drop"], cfg.harmful_accuracy_drop) if drifted else None
    reason = (f"drift in {', '.join(drifted)}: {versus}" if drifted else f"no drift: {versus}") + (
        f"; champion accuracy {extra_new['accuracy']:.3f} on them vs {test_accuracy:.3f} on its test split"
        if severity["accuracy_drop"] is not None else "") + _harm_phrase(harmful, severity["accuracy_drop"],
                                                                          cfg.harmful_accuracy_drop)
    result = dataclasses.replace(
        template, status="drift" if drifted else "no_drift", reason=reason, p_value=smallest, harmful=harmful,
        n_reference=detectors.meta["n_reference"], n_current=len(new.shas), tests=tests, severity=severity,
        whole={"n": len(whole_sample.shas), "tests": whole_tests, "accuracy": extra_whole["accuracy"],
               "drift": any(t["drift"] for t in whole_tests)},
        feature_method=featurizer.method,
    )
    seconds = round(time.perf_counter() - started, 3)
    log.info("drift check took %.2fs (detectors %s)", seconds, detectors.folder)
    return _finish(result, settings, {
        "seconds": seconds, "detectors": str(detectors.folder), "alpha_per_test": alpha,
        "label_counts": {"reference": detectors.meta["class_proportions"], "new": extra_new["class_counts"]},
        "plots": {"reference": detectors.meta["reference_projection"], "new": extra_new["projection"]},
    })


def _batch_name(batch: Batch) -> str:
    if batch.source == "raw":
        return f"raw v{batch.version} (as ingested)"
    return f"curated v{batch.version} (no raw version recorded: as curated)"


def is_harmful(accuracy_drop: float | None, max_drop: float) -> bool:
    """A detected drift is harmful when the champion loses more than ``max_drop`` on it, or when nobody can tell."""
    return accuracy_drop is None or accuracy_drop > max_drop


def _harm_phrase(harmful: bool | None, drop: float | None, max_drop: float) -> str:
    if harmful is None:
        return ""
    if drop is None:
        return "; harmful: the accuracy cost cannot be measured (no labels or no champion softmax)"
    verdict = "harmful" if harmful else "harmless"
    return f"; {verdict}: accuracy drop {100 * drop:.1f} points vs the limit {100 * max_drop:.1f}"


def blocks(settings: Settings, result: DriftResult) -> bool:
    """Whether this check stops training: policy ``block`` and a harmful drift."""
    return settings.drift.policy == "block" and result.is_drift and result.harmful is not False


def enforce_policy(settings: Settings, result: DriftResult) -> None:
    """``block``: a harmful drift stops training with its reason. Otherwise nothing here (the DAG alerts)."""
    if blocks(settings, result):
        raise DriftBlockedError(f"training blocked by drift policy in {settings.env}: {result.reason} "
                                f"(report {result.report_path})")


def should_train(settings: Settings, result: DriftResult, force: bool = False) -> tuple[bool, str]:
    """Whether training goes on after this check, and why; only ``retrain`` says no (``block`` raises instead).

    ``retrain``: train when the new data drifted, when there is no champion yet, or when forced
    (``force_retrain``); a check without drift (or without new images) keeps the champion.
    """
    if settings.drift.policy != "retrain":
        return True, f"policy {settings.drift.policy}: training goes on"
    if force:
        return True, "policy retrain: force_retrain is set, training goes on"
    if result.reference_version is None:
        return True, "policy retrain: no champion yet, training goes on"
    if result.is_drift:
        return True, f"policy retrain: the new data drifted, retraining on it ({result.reason})"
    return False, (f"policy retrain: no drift against champion v{result.champion_version} ({result.reason}): "
                   "the champion stays, no retraining")


def log_report(settings: Settings, mlflow_run_id: str, drift: dict[str, Any]) -> None:
    """Attach the drift report (JSON, HTML page and its plots) to the training run as ``drift/`` artifacts."""
    from tasks.models.registry import mlflow_client

    report = Path(drift.get("report_path") or "")
    files = [report] if report.is_file() else []
    if drift.get("html_path"):
        page = Path(drift["html_path"])
        files += [page, *sorted(page.parent.glob(f"{page.stem}_*.png"))]
    client = mlflow_client(settings)
    for f in files:
        if f.is_file():
            client.log_artifact(mlflow_run_id, str(f), artifact_path="drift")
