"""Settings: one code path, the environment picks the file.

Every default lives here, in the models below, each field with a description (the reference
docs/configuration.md is generated from them: ``python -m tasks.settings_reference``). The
YAML files hold only deliberate overrides: ``conf/base.yaml`` for every environment,
``conf/<env>.yaml`` for one (``CD4ML_ENV``: sit | uat | prod, default sit), and
``conf/datasets/<name>.yaml`` for a dataset (``CD4ML_DATASET``), merged in that order.
``{home}`` (``CD4ML_HOME``, default ``./.cd4ml``, the root of all local state) and ``{env}``
are filled into every string. ``MLFLOW_TRACKING_URI`` overrides the tracking store, so
production points at PostgreSQL without a code change. Everything is validated at load: a
bad environment name, a bad threshold or a key under its old name fails with one clear
message, before any work starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import DataError

ENVIRONMENTS: tuple[str, ...] = ("sit", "uat", "prod")
DEFAULT_ENV = "sit"
REPO_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(DataError, ValueError):
    """The settings cannot be loaded; the message says which key and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSettings(_Section):
    """Where the data lives. ``{home}`` is CD4ML_HOME, ``{env}`` the environment name."""

    landing_uri: str = Field("{home}/landing", description="Folder or fsspec URL where new images arrive (label = folder name, or a manifest).")
    lake_uri: str = Field("{home}/{env}/lake", description="Root of the Delta tables (raw_images, rejects, curated_images, ...); CD4ML_LAKE_URI overrides.")
    reports_dir: str = Field("{home}/{env}/reports", description="Folder of the validation, curation, drift, gate and monitoring reports.")
    scoring_uri: str = Field("{home}/{env}/scoring", description="Unlabelled images the scheduled cd4ml_score run scores (folder or fsspec URL).")
    feedback_uri: str = Field("{home}/{env}/feedback", description="True labels that arrive later: *.csv / *.jsonl files with columns image,label.")


class TrackingSettings(_Section):
    """The MLflow tracking store."""

    uri: str = Field("sqlite:///{home}/mlflow.db", description="MLflow tracking URI; MLFLOW_TRACKING_URI overrides it (PostgreSQL in production).")
    artifact_root: str = Field("{home}/mlartifacts", description="Artifact root of a newly created experiment (a tracking server keeps its own).")
    experiment: str = Field("cd4ml-{env}", description="MLflow experiment name of the training runs.")


class RegistrySettings(_Section):
    """The MLflow registered model of this environment."""

    model_name: str = Field("digits-classifier-{env}", description="Registered model name: one per environment (and dataset).")
    champion_alias: str = Field("champion", description="Registry alias of the model that serves, is monitored and is the gate's baseline.")


class IngestSettings(_Section):
    """Admission of new images into raw_images (tasks/data/ingest.py and its Spark twin)."""

    schedule: str | None = Field("@daily", description="When cd4ml_ingest looks at the landing zone (cron or preset); null = only when triggered.")
    image_extensions: tuple[str, ...] = Field(
        (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"),
        description="File name endings read as images (case-insensitive); other files are ignored.")
    min_side: int = Field(8, gt=0, description="Pixels: an image whose width or height is below is rejected at ingest (too_small); validation checks it again.")
    max_side: int = Field(4096, gt=0, description="Pixels: an image whose width or height is above is rejected at ingest (too_large); at least min_side.")
    max_pixels: int = Field(16777216, gt=0, description="Pixels (width x height) above which a file is rejected unread: the decompression-bomb guard.")
    allowed_labels: tuple[str, ...] | Literal["discover"] = Field(
        ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9"),
        description='The class names, or "discover": the first validated version names them (tasks/data/classes.py).')
    batch_size: int = Field(512, gt=0, description="Files read and decoded per streamed batch (one Delta commit per run).")
    label_source: Literal["folders", "csv", "jsonl"] = Field(
        "folders", description="Where labels come from: the folder names, or a csv/jsonl manifest (columns path,label; needs manifest_uri).")
    manifest_uri: str | None = Field(None, description="The csv/jsonl manifest; relative = inside the landing root, its paths relative to its folder.")
    keep_modes: tuple[str, ...] = Field(
        ("L", "RGB"), description="Pillow image modes stored untouched; with the L/RGB targets of convert_modes, the only modes validation accepts.")
    convert_modes: tuple[Literal["1", "P", "PA", "LA", "RGBA", "I;16", "I;16B", "I;16L", "I", "CMYK"], ...] = Field(
        ("1", "P", "PA", "LA", "RGBA", "I;16", "I;16B", "I;16L", "I"),
        description="Pillow modes converted to L or RGB at ingest (stored as lossless PNG); any other mode is rejected.")
    target_file_mb: int = Field(16, gt=0, description="MB: Delta data file size; bounds the writer's memory.")
    commit_retries: int = Field(8, gt=0, description="Re-plans and retries after losing a Delta commit race to another writer.")
    engine: Literal["local", "spark"] = Field("local", description="local: delta-rs on one machine | spark: a delta-spark job (requirements-spark.txt).")
    spark_master: str = Field("local[*]", description="Spark master URL of the spark engine.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description='Extra Spark configuration, e.g. {"spark.jars": "...delta-spark jars"}.')
    allowed_schemes: tuple[str, ...] = Field(
        ("file",), description="URI schemes a landing source or manifest may use (a plain path is file); add s3, gs, abfs... "
        "to read an object store. Anything else (http, data, ...) is refused before it is opened.")
    max_file_bytes: int = Field(
        64 << 20, gt=0, description="Bytes: a file larger than this is rejected unread (file_too_large), at ingest and "
        "scoring; checked from the listed size, and no read takes more.")
    max_manifest_row_bytes: int = Field(
        65536, gt=0, description="Bytes: a manifest line longer than this is rejected as that row (bad_manifest_row), unread.")

    @property
    def stored_modes(self) -> tuple[str, ...]:
        """The modes raw_images may hold: kept as they are, or the L/RGB a conversion produces."""
        return tuple(sorted(set(self.keep_modes) | ({"L", "RGB"} if self.convert_modes else set())))

    @model_validator(mode="after")
    def _sides(self) -> "IngestSettings":
        if self.min_side > self.max_side:
            raise ValueError(f"min_side {self.min_side} > max_side {self.max_side}")
        if self.label_source != "folders" and not self.manifest_uri:
            raise ValueError(f"label_source {self.label_source!r} needs manifest_uri")
        return self


class ValidationSettings(_Section):
    """Great Expectations checks of a raw version before anything uses it (tasks/data/validate.py)."""

    min_images_per_class: int = Field(50, ge=0, description="Images every allowed class needs in the raw version.")
    max_class_imbalance: float = Field(3.0, ge=1.0, description="Largest class / smallest class, at most.")
    max_rejected_share: float = Field(0.05, ge=0.0, le=1.0, description="Rejected files / files seen in the batch, at most (a fraction).")


class RetentionSettings(_Section):
    """VACUUM: how long unreferenced Delta files stay; versions models were trained on always stay."""

    retention_hours: int = Field(168, ge=0, description="Hours VACUUM keeps unreferenced Delta files; trained-on versions are kept always.")
    protect_tagged: bool = Field(True, description="Named dataset versions are protected like trained-on versions.")


class OutlierSettings(_Section):
    """Bad-image rules on the project's own image statistics (tasks/curation/image_stats.py; rules: docs/curation.md)."""

    # Relative by default: each statistic is judged against this raw version's own images of the
    # same mode family (tasks/curation/bulk_limits.py); the numbers come from bench/outlier_calibration.py.
    relative_sigmas: float = Field(
        5.0, gt=0.0, description="Robust sigmas (1.4826 x MAD of the transformed statistic) beyond the family's median "
        "at which an image becomes a candidate outlier (calibrated by bench/outlier_calibration.py).")
    relative_gap: float = Field(
        1.0, ge=0.0, description="Robust sigmas of empty space the candidates must have between them and the bulk; "
        "candidates before the first such gap are kept as the bulk's tail, and no gap at all makes the rule abstain.")
    relative_min_images: int = Field(
        50, ge=2, description="Images a mode family needs before any relative rule applies to it (fewer: the rules abstain).")
    min_blur: float | None = Field(
        None, ge=0.0, description="Absolute override: blur (variance of the Laplacian of the grey image resized to a 64 px "
        "shorter side, tasks/curation/image_stats.py) below which an image is blurry; null = the relative rule.")
    min_mean: float | None = Field(
        None, ge=0.0, le=255.0, description="Absolute override: mean grey (0..255) below which an image is too dark; "
        "null = the relative rule.")
    max_mean: float | None = Field(
        None, ge=0.0, le=255.0, description="Absolute override: mean grey (0..255) above which an image is too bright; "
        "null = the relative rule.")
    min_training_side: int = Field(
        8, gt=0, description="Pixels: an image whose decoded width or height is below is dropped from the curated data (too_small); "
        "absolute, the model's input floor; ingest.min_side already rejects below its own floor, so only a larger value has an effect.")
    max_share: float = Field(
        0.05, gt=0.0, le=1.0, description="A relative rule that would drop more than this share of one class's images abstains; "
        "an absolute override that flags more than this share of all images (and at least 10) stops curation with the numbers.")

    @model_validator(mode="after")
    def _means(self) -> "OutlierSettings":
        if self.min_mean is not None and self.max_mean is not None and self.min_mean >= self.max_mean:
            raise ValueError(f"min_mean {self.min_mean} must be below max_mean {self.max_mean}")
        return self


class CurationSettings(_Section):
    """Grouping, copy removal, splits and outliers (tasks/curation/)."""

    # Grouping is generous (components decide splits: near-copies never straddle them), dropping
    # precise: an image is dropped only as a copy of a kept image, by the copy score (tasks/curation/copy_pairs.py).
    near_duplicate_threshold: float = Field(
        0.97, gt=0.0, le=1.0, description="Embedding cosine at or above which two images are one component: decides splits, drops nothing.")
    copy_similarity: float = Field(
        0.9974, gt=0.0, le=1.0, description="Copy score to a kept image at or above which an image is dropped as its copy "
        "(calibrated by bench/dedup_calibration.py).")
    copy_candidates: int = Field(8, ge=1, le=256, description="Nearest neighbours of each new image given a copy score, "
        "in each view of the embedding (tasks/curation/neighbours.py).")
    similar_neighbours: int = Field(
        32, ge=1, le=1024, description="Nearest neighbours of each new image by the embedding that join its component when "
        "their cosine reaches near_duplicate_threshold (the same neighbour graph gives the copy candidates).")
    exact_search_below: int = Field(
        5000, ge=0, description="Eligible images below which neighbours come from an exact cosine product (numpy); from "
        "there on from a faiss HNSW index per embedding version, stored next to the curated tables; the eligible images it "
        "lacks (a batch's) are searched exactly beside it until they are more than 10% of its rows, then added to it "
        "(tasks/curation/neighbours.py).")
    copy_min_separation: float = Field(
        3.0, ge=0.0, description="Robust z of copy_similarity above a class's bulk (each image's -log(1 - copy score) to its "
        "nearest scored image of the class: (threshold - median) / lower spread) below which curation drops no near_duplicate "
        "in that class and lists them as possible copies (tasks/curation/separation.py).")
    copy_min_class_images: int = Field(
        30, ge=3, description="Images of a class with a scored neighbour needed to show that copies stand out from its bulk; "
        "a smaller class drops no near_duplicate.")
    max_class_drop_share: float = Field(
        0.02, ge=0.0, le=1.0, description="One curation drops at most floor(share x images of the class) of any class as "
        "near_duplicate plus bad images; beyond that it keeps them and lists them (tasks/curation/class_guard.py). "
        "Exact duplicates (identical decoded pixels) and constant images are outside this budget.")
    split_ratios: dict[Literal["train", "val", "test"], float] = Field(
        default_factory=lambda: {"train": 0.7, "val": 0.15, "test": 0.15},
        description="Fractions of new components per split: train, val and test, each >= 0, summing to 1.")
    split_salt: str = Field("cd4ml-v1", description="Salt of the split hash; changing it reshuffles every split.")
    embedding: Literal["pixels", "fastdup"] = Field(
        "pixels", description="pixels: grey-pixel embedding (tiny digits) | fastdup: fastdup's model (photos; "
        "needs fastdup installed, requirements-fastdup.txt: refused before any work otherwise).")
    feature_size: int = Field(8, gt=0, description="Pixels: side of the grey-pixel embedding (embedding: pixels).")
    outliers: OutlierSettings = Field(default_factory=OutlierSettings, description="Bad-image rules.")

    @field_validator("split_ratios")
    @classmethod
    def _ratios(cls, v: dict[str, float]) -> dict[str, float]:
        if set(v) != {"train", "val", "test"}:
            raise ValueError(f"split_ratios needs train, val and test, got {sorted(v)}")
        if any(r < 0 for r in v.values()) or abs(sum(v.values()) - 1.0) > 1e-6:
            raise ValueError(f"split_ratios must be >= 0 and sum to 1, got {v}")
        return v


DRIFT_TEST_COUNT = 3  # tests sharing drift.familywise_alpha (tasks.monitoring.drift.TESTS; a test checks they agree)


class DriftSettings(_Section):
    """tasks/monitoring/drift.py: new data against the champion's training data, on the champion's own features."""

    familywise_alpha: float = Field(
        0.05, gt=0.0, lt=1.0, description="Significance level of the whole drift check: its three tests share it (each at alpha / 3), "
        "so data from the same distribution raises a false alarm with probability at most this.")
    max_samples: int = Field(500, gt=1, description="New images tested per check (a deterministic hash sample).")
    image_size: int = Field(16, gt=0, description="Pixels: input side of the pixel fallback only; a champion is read at its own image size.")
    n_permutations: int = Field(
        500, gt=0, description="Permutations of the MMD test: its smallest p-value is 1 / (n + 1), which must lie below its share "
        "of familywise_alpha (alpha / 3), or the test could never fire; its cost grows linearly with n.")
    max_reference: int = Field(10000, gt=1, description="Reference images the detectors are fitted on (once per champion version).")
    mmd_reference: int = Field(1000, gt=1, description="Of those, the MMD test's reference (its cost grows with the square).")
    policy: Literal["warn", "block", "retrain"] = Field(
        "warn", description="warn: alert and train | block: harmful drift stops training and alerts on-call | "
        "retrain: train only when the new data drifted (or there is no champion yet).")
    harmful_accuracy_drop: float = Field(
        0.05, ge=0.0, le=1.0, description="Absolute accuracy: a detected drift is harmful when the champion's accuracy on the new "
        "labelled images is more than this below its test accuracy (or cannot be measured).")

    @model_validator(mode="after")
    def _permutation_test_can_fire(self) -> DriftSettings:
        # A permutation test's p-value is never below 1 / (n + 1): with too few permutations the
        # MMD test could never reach its share of the familywise level and would be silently dead.
        floor = 1.0 / (self.n_permutations + 1)
        if floor >= self.familywise_alpha / DRIFT_TEST_COUNT:
            raise ValueError(f"drift.n_permutations {self.n_permutations} gives p-values >= {floor:.4f}, not below the MMD "
                             f"test's level familywise_alpha / {DRIFT_TEST_COUNT} = "
                             f"{self.familywise_alpha / DRIFT_TEST_COUNT:.4f}: raise n_permutations")
        return self


class KubernetesTrainerSettings(_Section):
    """The trainer pod a ``kubernetes`` launcher asks for (spec built by ``tasks.training.train.trainer_pod_spec``)."""

    image: str = Field("cd4ml-trainer:latest", description="Container image of the trainer pod.")
    namespace: str = Field("cd4ml", description="Kubernetes namespace of the trainer pod.")
    gpus: int = Field(0, ge=0, description="GPUs requested (nvidia.com/gpu).")
    cpu: str = Field("2", description="CPU request (Kubernetes quantity).")
    memory: str = Field("8Gi", description="Memory request and limit (Kubernetes quantity).")
    state_pvc: str = Field(
        "cd4ml-state", description="PersistentVolumeClaim mounted at CD4ML_HOME: the decode cache and checkpoints outlive a pod, "
        "so a retry resumes instead of restarting at epoch 1.")
    service_account: str | None = Field(None, description="Service account of the pod; null = the namespace's default.")
    secret_name: str = Field("cd4ml-secrets", description="Kubernetes Secret holding MLFLOW_TRACKING_URI for the pod (never in the repo or the spec).")


class TrainingSettings(_Section):
    """The network and how it is trained (tasks/training/)."""

    model: Literal["small_cnn", "resnet18", "resnet50"] = Field("small_cnn", description="Network architecture.")
    image_size: int = Field(16, gt=0, description="Pixels: side of the square model input (cd4ml_runtime.preprocess).")
    channels: Literal[1, 3, "auto"] = Field(
        "auto", description="Input channels: 1 (grey), 3 (RGB) or auto: the majority of the images' stored modes (L -> 1, RGB -> 3).")
    fit: Literal["crop", "pad", "squash"] = Field("crop", description="Non-square images: centre crop | letterbox | stretch.")
    epochs: int = Field(15, gt=0, description="Maximum epochs (early stopping may end sooner).")
    batch_size: int = Field(64, gt=0, description="Images per step per process; the global batch is batch_size x processes.")
    learning_rate: float = Field(0.002, gt=0, description="Adam learning rate for base_batch_size, scaled to the global batch by lr_scaling.")
    weight_decay: float = Field(0.0001, ge=0, description="Adam weight decay.")
    patience: int = Field(4, ge=0, description="Epochs without a validation improvement of min_delta before early stopping.")
    min_delta: float = Field(0.001, ge=0, description="Smallest validation improvement that counts for early stopping.")
    seed: int = Field(7, description="Random seed of weights, shuffling and augmentation.")
    num_threads: int = Field(1, gt=0, description="Torch CPU threads (a small CNN on 2 cores: extra threads only contend).")
    lr_scaling: Literal["linear", "sqrt", "none"] = Field(
        "linear", description="How learning_rate scales with global batch / base_batch_size.")
    base_batch_size: int = Field(64, gt=0, description="The global batch size learning_rate is tuned for.")
    scheduler: Literal["cosine", "constant"] = Field(
        "cosine", description="Per-step learning-rate schedule over epochs, after warmup_epochs of linear warm-up.")
    warmup_epochs: int = Field(0, ge=0, description="Epochs of linear learning-rate warm-up.")
    augment_shift: int = Field(1, ge=0, description="Pixels of random translation, train split only; 0 = off.")
    augment_crop_scale: float = Field(
        1.0, gt=0.0, le=1.0, description="Random resized crop: smallest fraction of the area kept, train split only; 1 = off.")
    augment_hflip: bool = Field(False, description="Random horizontal flip: only where a mirrored image keeps its label (photos yes, digits no).")
    augment_color_jitter: float = Field(
        0.0, ge=0.0, le=1.0, description="Brightness/contrast/saturation multiplied by U(1-j, 1+j); 0 = off.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available.")
    amp: bool = Field(True, description="bf16 autocast on CUDA; CPU always trains in float32.")
    channels_last: bool = Field(True, description="NHWC memory format, CUDA and CPU (oneDNN measured ~1.5x faster for the small CNN).")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes (the decoded cache is in memory: workers only add IPC).")
    finetune_from: str | None = Field(
        None, description="A model URI (models:/name@alias or models:/name/N) whose weights start training: transfer learning.")
    freeze_backbone: bool = Field(False, description="With finetune_from: train the classifier head only.")
    launcher: Literal["in_process", "torchrun", "kubernetes"] = Field(
        "in_process", description="in_process | torchrun (DDP over nproc_per_node processes) | kubernetes (a trainer pod).")
    nproc_per_node: int = Field(1, gt=0, description="Training processes (torchrun or kubernetes launcher only).")
    checkpoint_dir: str = Field("{home}/{env}/checkpoints", description="Checkpoints: one folder per table, version, config and Airflow run.")
    cache_dir: str = Field("{home}/{env}/cache", description="Decoded pixels per table version and image size.")
    keep_checkpoints: bool = Field(False, description="Keep the checkpoint folder after a successful run.")
    kubernetes: KubernetesTrainerSettings = Field(
        default_factory=KubernetesTrainerSettings, description="The trainer pod of launcher kubernetes.")

    @field_validator("channels", mode="before")
    @classmethod
    def _channels(cls, v: Any) -> Any:
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v  # "3" from a form or --set

    @model_validator(mode="after")
    def _launcher(self) -> "TrainingSettings":
        if self.launcher == "in_process" and self.nproc_per_node > 1:
            raise ValueError("nproc_per_node > 1 needs launcher torchrun or kubernetes, not in_process")
        return self


class TrainingDataSettings(_Section):
    """Which curated images this environment trains on (tasks/data/sampling.py)."""

    sample_fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="Fraction of the curated images trained on: below 1, a deterministic sample "
        "(sha256 of salt and image key) written as a named dataset version.")
    sample_salt: str = Field("cd4ml-sample-v1", description="Salt of the sample hash; changing it draws another sample.")


class SearchParam(_Section):
    """One tuned training field: a float or int range (optionally log-scaled) or a list of choices."""

    type: Literal["float", "int", "categorical"] = Field(description="float or int range, or categorical choices.")
    low: float | None = Field(None, description="Lower end of a float/int range.")
    high: float | None = Field(None, description="Upper end of a float/int range (above low).")
    log: bool = Field(False, description="Sample the range on a log scale (needs low > 0).")
    choices: tuple[bool | int | float | str, ...] | None = Field(None, description="The values of a categorical parameter.")

    @model_validator(mode="after")
    def _shape(self) -> "SearchParam":
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs choices")
        elif self.low is None or self.high is None or self.low >= self.high:
            raise ValueError(f"a {self.type} parameter needs low < high, got {self.low}..{self.high}")
        elif self.log and self.low <= 0:
            raise ValueError("a log-scaled parameter needs low > 0")
        return self


def _default_search_space() -> dict[str, SearchParam]:
    return {
        "learning_rate": SearchParam(type="float", low=0.0003, high=0.01, log=True),
        "weight_decay": SearchParam(type="float", low=0.000001, high=0.001, log=True),
        "batch_size": SearchParam(type="categorical", choices=(32, 64, 128)),
        "augment_shift": SearchParam(type="categorical", choices=(0, 1, 2)),
    }


class TuningSettings(_Section):
    """Hyper-parameter search with Optuna (tasks/training/tune.py)."""

    on_by_default: bool = Field(False, description="Default of cd4ml_train's `tune` Param: scheduled (asset-triggered) runs tune too.")
    n_trials: int = Field(8, gt=0, description="Trials per study.")
    epochs_per_trial: int = Field(6, gt=0, description="Epochs of a trial: the pruner's maximum resource.")
    sampler: Literal["tpe", "random"] = Field("tpe", description="Optuna sampler.")
    seed: int = Field(0, description="Seed of the sampler.")
    pruner: Literal["none", "median", "successive_halving", "hyperband"] = Field("hyperband", description="Optuna pruner.")
    min_resource: int = Field(1, gt=0, description="Epochs before a trial may be pruned (successive_halving, hyperband).")
    reduction_factor: int = Field(3, gt=1, description="Reduction factor of successive_halving and hyperband.")
    n_startup_trials: int = Field(2, ge=0, description="Median pruner: trials completed before pruning starts.")
    n_warmup_steps: int = Field(0, ge=0, description="Median pruner: epochs of a trial before it may be pruned.")
    storage: str = Field("sqlite:///{home}/{env}/optuna.db", description="Optuna storage URL; CD4ML_OPTUNA_STORAGE overrides (PostgreSQL in production).")
    search_space: dict[str, SearchParam] = Field(
        default_factory=_default_search_space, description="Training field -> its range or choices (fields of the training section only).")

    @field_validator("search_space")
    @classmethod
    def _known_fields(cls, v: dict[str, SearchParam]) -> dict[str, SearchParam]:
        unknown = sorted(set(v) - set(TrainingSettings.model_fields))
        if unknown:
            raise ValueError(f"search_space names fields that training does not have: {unknown}")
        return v


class GateSettings(_Section):
    """The automatic gate (tasks/release/evaluate.py): floors, a paired test, per-class recall, smoke, latency, size."""

    metric: Literal["accuracy", "macro_f1"] = Field("accuracy", description="The metric min_value applies to.")
    min_value: float = Field(0.85, ge=0.0, le=1.0, description="Absolute floor of the candidate's metric on the test split.")
    max_regression: float = Field(
        0.03, ge=0.0, le=1.0, description="Non-inferiority margin (absolute accuracy): the candidate may trail the champion by at most "
        "this before the paired test is asked; a larger drop fails whatever the test says.")
    alpha: float = Field(
        0.05, gt=0.0, lt=1.0, description="Significance level of the one-sided exact McNemar tests (overall and per class) that the "
        "candidate is worse than the champion: p < alpha = significantly worse.")
    min_test_images: int = Field(100, gt=0, description="Test images (after removing any either model trained on) below which the gate refuses to decide.")
    max_class_recall_drop: float = Field(
        0.15, ge=0.0, le=1.0, description="Absolute recall a class may lose against the champion (failing only when also significant at alpha).")
    min_class_support: int = Field(10, gt=0, description="Test images a class needs to be judged; smaller classes are reported only.")
    smoke_test: bool = Field(True, description="Load the registered pyfunc in a fresh process and classify real PNG and JPEG bytes.")
    latency_samples: int = Field(50, gt=0, description="Single-image predictions timed in the smoke process.")
    max_latency_p95_ms: float = Field(250.0, gt=0.0, description="Milliseconds: p95 single-image latency in the smoke process, at most.")
    max_model_mb: float = Field(100.0, gt=0.0, description="MB: size of the logged model, at most.")
    smoke_timeout_s: int = Field(300, gt=0, description="Seconds the smoke process may take.")


class UpstreamRegistrySettings(_Section):
    """deploy_model across deployments: the upstream environment's own MLflow registry, read as a read-only account."""

    tracking_uri: str | None = Field(
        None, description="The upstream's MLflow tracking server (https://host) or store; null = the upstream environment's "
        "tracking store as these settings name it (one registry for every environment). Never holds credentials; "
        "CD4ML_UPSTREAM_REGISTRY_URI overrides (a deployment's terraform variable upstream_registry_uri).")
    conn_id: str = Field(
        "cd4ml_upstream_registry", pattern=r"^[A-Za-z0-9_]{1,64}$", description="Airflow Connection (login, password) of the upstream's read-only account; "
        "outside Airflow the variable AIRFLOW_CONN_<CONN_ID> in Airflow's URI or JSON form. Not defined: no credentials sent.")
    allowed_schemes: tuple[str, ...] = Field(
        ("https", "http", "sqlite"), description="URI schemes tracking_uri may use; anything else is refused before it is "
        "contacted (drop http where the upstream is reached over a network).")
    timeout_s: int = Field(30, gt=0, le=600, description="Seconds per request to the upstream registry.")
    attempts: int = Field(3, ge=1, le=10, description="Tries per request to the upstream registry before it counts as unreachable.")
    reconcile_schedule: str | None = Field(
        "@hourly", description="deploy_model: when cd4ml_reconcile compares the upstream champion with the last gated import "
        "and starts cd4ml_promote when they differ (cron or preset); null = never.")

    @model_validator(mode="after")
    def _uri(self) -> "UpstreamRegistrySettings":
        if self.tracking_uri is not None:
            check_registry_uri(self.tracking_uri, self.allowed_schemes)
        return self


def check_registry_uri(uri: str, allowed_schemes: tuple[str, ...]) -> str:
    """``uri`` when its scheme is allowed and it carries no credentials; else ValueError (naming the scheme only)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
    except ValueError:
        raise ValueError("the upstream registry URI cannot be parsed") from None
    if parts.scheme not in allowed_schemes:
        raise ValueError(f"upstream registry scheme {parts.scheme[:20]!r} is not in allowed_schemes {list(allowed_schemes)}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the upstream registry URI must not carry credentials: put them in the Connection conn_id names")
    return uri


class MessageQueueSettings(_Section):
    """A message queue of the release hand-off between two deployments (docs/release.md, "The hand-off as an event")."""

    scheme: Literal["redis+pubsub", "sqs"] = Field(
        "redis+pubsub", description="The queue's kind, which decides the sender and the trigger: redis+pubsub (Redis "
        "pub/sub on the Connection conn_id) | sqs (Amazon SQS: the queue queue_url, the aws Connection conn_id or the "
        "default AWS credential chain).")
    channel: str = Field(
        ..., pattern=r"^[A-Za-z0-9_.:-]{1,128}$", description="The channel the upstream publishes its champion changes to "
        "and the downstream listens on: one per hop (e.g. cd4ml-sit-to-uat); with sqs, the queue's name.")
    queue_url: str | None = Field(
        None, max_length=512, pattern=r"^https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?/[0-9]{1,12}/[A-Za-z0-9_-]{1,80}(\.fifo)?$",
        description="sqs only (then required): the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<name> "
        "(terraform output of the hop's queue); no credentials, no query.")
    conn_id: str = Field(
        "redis_default", pattern=r"^[A-Za-z0-9_]{1,64}$", description="Airflow Connection of the queue (redis: host, port, "
        "password, extra db/ssl; sqs: an aws Connection, and when it is not defined the default AWS credential chain, "
        "e.g. the pod's role); outside Airflow the variable AIRFLOW_CONN_<CONN_ID>.")
    poll_interval_s: float = Field(
        5.0, gt=0.0, le=600.0, description="Consumer: seconds the trigger waits between two looks at the channel when it "
        "was empty.")

    @model_validator(mode="after")
    def _queue_url_for_sqs(self) -> MessageQueueSettings:
        if (self.scheme == "sqs") != (self.queue_url is not None):
            raise ValueError("queue_url is required with scheme sqs and only there")
        return self


class ReleaseSettings(_Section):
    """How a model reaches this environment's champion alias (tasks/release/release.py)."""

    pattern: Literal["deploy_code", "deploy_model"] = Field(
        "deploy_code", description="deploy_code: this environment trains on its own data | deploy_model: it copies the champion of "
        "upstream into its own registered model and gates it here.")
    upstream: Literal["sit", "uat", "prod"] | None = Field(
        None, description="deploy_model: the environment whose champion is copied (not this environment).")
    approval: Literal["none", "required"] = Field(
        "none", description="none: a passing challenger is promoted at once | required: a person decides in the Airflow UI.")
    approval_timeout_hours: float = Field(72.0, gt=0.0, description="Hours without an answer after which the approval counts as rejected.")
    approvers: tuple[str, ...] = Field(
        (), description="Who may answer: user names, or role:<Role> under the FAB auth manager; empty = anyone who can open the DAG.")
    challenger_alias: str = Field("challenger", description="Registry alias of a candidate waiting for approval.")
    airflow_api_url: str = Field(
        "http://localhost:8080", description="approval required: the Airflow API server the cd4ml command triggers "
        "cd4ml_rollback, cd4ml_promote and cd4ml_accept_class through, as the signed-in user; CD4ML_AIRFLOW_URL overrides.")
    upstream_registry: UpstreamRegistrySettings = Field(
        default_factory=UpstreamRegistrySettings, description="deploy_model: where the upstream's champion is read "
        "(its own registry in another deployment, or the shared one).")
    publish: MessageQueueSettings | None = Field(
        None, description="Where a change of this environment's champion (promote, rollback) is announced to the "
        "downstream deployment; null = not announced (one deployment: its champion Asset is the hand-off).")
    upstream_event: MessageQueueSettings | None = Field(
        None, description="deploy_model: the queue the upstream announces its champion on; cd4ml_promote then runs on "
        "its messages (an AssetWatcher); null = on the upstream's champion Asset inside this deployment.")

    @model_validator(mode="after")
    def _pattern(self) -> "ReleaseSettings":
        if self.pattern == "deploy_model" and not self.upstream:
            raise ValueError("pattern deploy_model needs upstream (the environment whose champion is copied)")
        return self


Channel = Literal["log", "slack", "pagerduty", "email"]


class AlertRetrySettings(_Section):
    """Each channel's send is tried ``attempts`` times, waiting backoff_s, 2*backoff_s, ... (capped)."""

    attempts: int = Field(3, ge=1, description="Sends tried per channel.")
    backoff_s: float = Field(2.0, ge=0.0, description="Seconds before the second try; doubled before each next one.")
    max_backoff_s: float = Field(30.0, ge=0.0, description="Seconds: the longest wait between tries.")
    timeout_s: int = Field(10, gt=0, description="Seconds per HTTP request (Slack, PagerDuty).")


class DeadlineSettings(_Section):
    """A DAG run must finish within ``minutes`` of its logical date or of being queued (Airflow DeadlineAlert)."""

    reference: Literal["logical_date", "queued_at"] = Field(description="What the deadline counts from.")
    minutes: float = Field(gt=0.0, description="Minutes after the reference by which the run must have finished.")


def _default_deadlines() -> dict[str, DeadlineSettings]:
    return {
        "cd4ml_ingest": DeadlineSettings(reference="logical_date", minutes=120),
        "cd4ml_curate": DeadlineSettings(reference="queued_at", minutes=60),
        "cd4ml_train": DeadlineSettings(reference="queued_at", minutes=240),
        "cd4ml_rollback": DeadlineSettings(reference="queued_at", minutes=30),
    }


class AlertSettings(_Section):
    """Where alerts go (tasks/alerting/delivery.py): channels per severity, the Airflow Connections behind them."""

    routes: dict[Literal["info", "warning", "critical"], tuple[Channel, ...]] = Field(
        default_factory=lambda: {"info": ("log",), "warning": ("log",), "critical": ("log",)},
        description="Severity (info, warning, critical: each needed) -> channels (log, slack, pagerduty, email); "
        "log is in every route, the record of every alert.")
    ui_base_url: str = Field("http://localhost:8080", description="Airflow UI: task-log and Required Actions links in alerts.")
    runbook_base_url: str | None = Field(
        None, description="Where docs/runbooks/ is browsable (e.g. your git host's blob URL); null = the repository path.")
    slack_conn_id: str = Field("cd4ml_slack", description="Airflow Connection (slackwebhook): password = webhook token or URL.")
    pagerduty_conn_id: str = Field("cd4ml_pagerduty", description="Airflow Connection (pagerduty_events): password = routing key.")
    smtp_conn_id: str = Field("cd4ml_smtp", description="Airflow Connection (smtp): host, port, login, password, extra from_email.")
    email_to: tuple[str, ...] = Field((), description="Recipients of the email channel (needed when a route sends email).")
    retry: AlertRetrySettings = Field(default_factory=AlertRetrySettings, description="Retries of each channel's send.")
    deadlines: dict[str, DeadlineSettings] = Field(
        default_factory=_default_deadlines, description="DAG id -> the deadline its runs must meet; DAGs not listed have none.")

    @model_validator(mode="after")
    def _routes(self) -> "AlertSettings":
        missing = {"info", "warning", "critical"} - set(self.routes)
        if missing:
            raise ValueError(f"alerts.routes needs every severity; missing: {', '.join(sorted(missing))}")
        for severity, channels in self.routes.items():
            if "log" not in channels:
                raise ValueError(f"alerts.routes.{severity} must include log (the record of every alert)")
        if any("email" in c for c in self.routes.values()) and not self.email_to:
            raise ValueError("alerts.routes sends email but alerts.email_to is empty")
        return self


class ServingSettings(_Section):
    """The champion at work (tasks/serving/): batch scoring and the REST server."""

    schedule: str | None = Field("@daily", description="When cd4ml_score scores storage.scoring_uri (cron or preset); null = only when triggered.")
    allowed_schemes: tuple[str, ...] = Field(
        ("file",), description="URI schemes a scoring source or feedback file may use (a plain path is file); add s3, gs, "
        "abfs... to read an object store. Anything else (http, data, ...) is refused before it is opened.")
    max_feedback_row_bytes: int = Field(
        65536, gt=0, description="Bytes: a feedback line longer than this is rejected as that row (bad_row), unread.")
    batch_size: int = Field(256, gt=0, description="Images read, decoded and predicted together (memory stays flat).")
    decode_workers: int = Field(1, ge=0, description="Processes decoding images with the model's own runtime while the network runs; 0 = none.")
    decode_min_files: int = Field(2048, ge=0, description="Files in a run below which images are decoded in process (a worker costs ~0.3 s to start).")
    commit_every: int = Field(20000, gt=0, description="Predictions per Delta commit: a killed run keeps what it committed.")
    port: int = Field(5001, gt=0, lt=65536, description="TCP port of `cd4ml serve` (MLflow's scoring server).")
    max_request_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Bytes of a request body above which `cd4ml serve` answers HTTP 413 without "
        "reading the rest (images in a request are also held to ingest.max_pixels, from their headers).")


class MonitoringSettings(_Section):
    """Live metrics of the champion (tasks/monitoring/monitor.py); each rule is judged against its own test split."""

    schedule: str | None = Field("@daily", description="When cd4ml_monitor loads feedback and judges the window; null = only when triggered.")
    window_days: int = Field(7, gt=0, description="Days: predictions of the scoring runs in this many days up to the logical date.")
    min_predictions: int = Field(100, ge=1, description="Predictions below which distributions are reported, not judged.")
    min_feedback: int = Field(50, ge=1, description="Labelled predictions below which accuracy, recall and calibration are reported, not judged.")
    rule_alpha: float = Field(
        0.01, gt=0.0, lt=1.0, description="Significance level each rule's test must reach: a rule fires only when the change is "
        "significant at this level AND larger than its limit.")
    max_live_accuracy_drop: float = Field(
        0.05, ge=0.0, le=1.0, description="Absolute accuracy: live accuracy may be below the champion's test accuracy by at most this.")
    max_class_recall_drop: float = Field(0.15, ge=0.0, le=1.0, description="Absolute recall a class's live recall may be below its test recall.")
    min_class_support: int = Field(20, ge=1, description="Labelled predictions of a class before its recall is judged.")
    max_ece_increase: float = Field(0.05, ge=0.0, le=1.0, description="Expected calibration error may exceed the test split's by at most this.")
    max_label_shift: float = Field(
        0.15, ge=0.0, le=1.0, description="Total variation distance of the predicted labels vs the test split's predictions, at most.")
    max_confidence_shift: float = Field(0.15, ge=0.0, le=1.0, description="KS statistic of the confidences vs the test split's, at most.")
    alert_on_harmless_shift: bool = Field(
        False, description="A label/confidence shift alerts even when the judged live accuracy holds.")
    retrain_on_breach: bool = Field(
        False, description="On a breach: the window's labelled images go to the landing zone and the retrain-request Asset is emitted.")
    severity: Literal["info", "warning", "critical"] = Field("warning", description="Alert severity of a breach (routes in alerts.routes).")
    low_confidence: float = Field(
        0.5, ge=0.0, le=1.0, description="Confidence below which a prediction is explained in the monitoring report.")
    max_explanations: int = Field(24, ge=0, description="Attribution overlays per monitoring run (misclassified first).")


class Settings(_Section):
    env: Literal["sit", "uat", "prod"] = Field(description="The environment (CD4ML_ENV or --env); set by the loader, never in a file.")
    home: str = Field(description="Root of all local state (CD4ML_HOME, default ./.cd4ml); set by the loader, never in a file.")
    storage: StorageSettings = Field(default_factory=StorageSettings, description="Where the data lives.")
    tracking: TrackingSettings = Field(default_factory=TrackingSettings, description="The MLflow tracking store.")
    registry: RegistrySettings = Field(default_factory=RegistrySettings, description="The registered model.")
    ingest: IngestSettings = Field(default_factory=IngestSettings, description="Admission of new images.")
    validation: ValidationSettings = Field(default_factory=ValidationSettings, description="Checks of a raw version.")
    retention: RetentionSettings = Field(default_factory=RetentionSettings, description="VACUUM of the Delta tables.")
    curation: CurationSettings = Field(default_factory=CurationSettings, description="Grouping, copies, splits, outliers.")
    drift: DriftSettings = Field(default_factory=DriftSettings, description="New data against the champion's training data.")
    training_data: TrainingDataSettings = Field(default_factory=TrainingDataSettings, description="The images trained on.")
    training: TrainingSettings = Field(default_factory=TrainingSettings, description="The network and its training.")
    tuning: TuningSettings = Field(default_factory=TuningSettings, description="Hyper-parameter search.")
    gate: GateSettings = Field(default_factory=GateSettings, description="The automatic gate.")
    release: ReleaseSettings = Field(default_factory=ReleaseSettings, description="How a model becomes champion.")
    alerts: AlertSettings = Field(default_factory=AlertSettings, description="Where alerts go.")
    serving: ServingSettings = Field(default_factory=ServingSettings, description="Batch scoring and the REST server.")
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings, description="Live metrics of the champion.")

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Table locations: one name per table, the environment lives in lake_uri.
    def table_uri(self, name: str) -> str:
        return f"{self.storage.lake_uri.rstrip('/')}/{name}"

    @property
    def raw_table(self) -> str:
        return self.table_uri("raw_images")

    @property
    def rejects_table(self) -> str:
        return self.table_uri("rejects")

    @property
    def curated_table(self) -> str:
        return self.table_uri("curated_images")

    @property
    def audit_table(self) -> str:
        return self.table_uri("release_audit")

    @property
    def sample_table(self) -> str:
        return self.table_uri("training_sample")

    @property
    def predictions_table(self) -> str:
        return self.table_uri("predictions")

    @property
    def reports_path(self) -> Path:
        return Path(self.storage.reports_dir)

    @property
    def tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or self.tracking.uri

    def missing_tracking_store(self) -> Path | None:
        """The file of a ``sqlite:///`` tracking store that does not exist yet, else None.

        Asking MLflow about a missing SQLite store creates an empty one; status and the serving
        commands look here first.
        """
        prefix = "sqlite:///"
        if not self.tracking_uri.startswith(prefix):
            return None  # a server or database: ask it
        path = Path(self.tracking_uri[len(prefix):].split("?", 1)[0])
        return None if path.exists() else path

    def section_hash(self, *sections: str) -> str:
        """Stable short hash of some sections: names a result by the config that made it."""
        payload = {s: getattr(self, s).model_dump(mode="json") for s in sections}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# Keys under an old name or removed: refused with the new name, never read silently or dropped.
RENAMED_KEYS: dict[str, str] = {
    "release.sample_fraction": "training_data.sample_fraction",
    "release.sample_salt": "training_data.sample_salt",
    "serving.low_confidence": "monitoring.low_confidence",
    "serving.max_explanations": "monitoring.max_explanations",
    "curation.outliers.min_side": "curation.outliers.min_training_side",
    "drift.p_value": "drift.familywise_alpha",
    "drift.max_accuracy_drop": "drift.harmful_accuracy_drop",
    "monitoring.p_value": "monitoring.rule_alpha",
    "monitoring.max_accuracy_drop": "monitoring.max_live_accuracy_drop",
}
REMOVED_KEYS: dict[str, str] = {
    "project": "it was read nowhere",
    "validation.allowed_modes": "validation accepts the modes ingest stores: ingest.keep_modes and the L/RGB of ingest.convert_modes",
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base`` key by key (nested mappings merged, anything else replaced); neither is changed."""
    out = dict(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _fill(value: Any, fields: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**fields)
    if isinstance(value, dict):
        return {k: _fill(v, fields) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, fields) for v in value)
    return value


def resolve_env(env: str | None = None) -> str:
    name = (env if env is not None else os.environ.get("CD4ML_ENV", DEFAULT_ENV)).strip().lower()
    if name not in ENVIRONMENTS:
        raise SettingsError(
            f"environment {name!r} (CD4ML_ENV or --env) is not a known environment; use one of {', '.join(ENVIRONMENTS)}"
        )
    return name


ABSENT = object()  # a key a mapping does not set (unlike one it sets to null)


def dotted_value(data: dict[str, Any], dotted: str) -> Any:
    """``data["a"]["b"]`` for ``"a.b"``; ``ABSENT`` where the nested mappings do not have the key."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def _has_key(data: dict[str, Any], dotted: str) -> bool:
    return dotted_value(data, dotted) is not ABSENT


def refuse_old_keys(data: dict[str, Any], source: str) -> None:
    """Stop on a key under its old name (naming the new one) or a removed key (saying why)."""
    for old, new in RENAMED_KEYS.items():
        if _has_key(data, old):
            raise SettingsError(f"{source}: {old} was renamed to {new}")
    for old, why in REMOVED_KEYS.items():
        if _has_key(data, old):
            raise SettingsError(f"{source}: {old} was removed ({why}); delete it")


def read_yaml(path: Path) -> dict[str, Any]:
    """One settings file as a mapping, refused when it holds a key under an old name."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise SettingsError(f"settings file {path} is missing") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"settings file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping, got {type(data).__name__}")
    refuse_old_keys(data, f"settings file {path}")
    return data


def resolve_conf_dir(conf: Path | None = None) -> Path:
    """The settings folder: the argument, else CD4ML_CONF_DIR, else the repository's conf/."""
    return Path(conf or os.environ.get("CD4ML_CONF_DIR") or REPO_ROOT / "conf")


def dataset_name() -> str:
    """``CD4ML_DATASET``, checked to name a file conf/datasets/<name>.yaml ("" = none)."""
    dataset = (os.environ.get("CD4ML_DATASET") or "").strip()
    if dataset and not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", dataset):
        raise SettingsError(f"CD4ML_DATASET {dataset!r} must be a plain name (a file conf/datasets/<name>.yaml)")
    return dataset


def code_defaults() -> dict[str, Any]:
    """Every section's defaults as the models define them, placeholders ({home}, {env}) unfilled."""
    return Settings(env=DEFAULT_ENV, home="").model_dump(exclude={"env", "home"})


def _validated(values: dict[str, Any], name: str, conf: Path) -> Settings:
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"invalid settings for env {name!r} ({conf}): {problems}") from exc


# What a deployment (terraform/modules/airflow) hands its pods as environment variables, over the files:
# variable -> the dotted key it sets. The hop queues are SQS there: a queue URL names the whole queue section.
DEPLOYMENT_VARIABLES = {
    "CD4ML_LAKE_URI": "storage.lake_uri",  # the lake bucket (terraform output lake_uri), like MLFLOW_TRACKING_URI
    "CD4ML_UPSTREAM_REGISTRY_URI": "release.upstream_registry.tracking_uri",  # the upstream deployment's MLflow
    "CD4ML_PUBLISH_QUEUE_URL": "release.publish",  # this environment's hop queue (terraform output hop_queue_url)
    "CD4ML_UPSTREAM_QUEUE_URL": "release.upstream_event",  # the upstream's hop queue (variable upstream_queue_url)
}
AWS_CONN_ID = "aws_default"


def _sqs_queue(url: str, current: Any) -> dict[str, Any]:
    """The queue section an SQS URL names: scheme sqs, the queue's name as channel; a file's conn_id and poll kept."""
    kept = {k: v for k, v in (current or {}).items() if k in ("conn_id", "poll_interval_s")} if (
        isinstance(current, dict) and current.get("scheme") == "sqs") else {}
    return {"conn_id": AWS_CONN_ID, **kept, "scheme": "sqs", "queue_url": url, "channel": url.rstrip("/").rsplit("/", 1)[-1]}


def _apply_deployment_variables(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Set each key of DEPLOYMENT_VARIABLES whose variable is set (non-empty), in place; validated with the rest."""
    for variable, dotted in DEPLOYMENT_VARIABLES.items():
        value = environ.get(variable)
        if not value:
            continue
        *parents, leaf = dotted.split(".")
        section = values
        for key in parents:
            if not isinstance(section.get(key), dict):
                section[key] = {}
            section = section[key]
        section[leaf] = _sqs_queue(value, section.get(leaf)) if variable.endswith("_QUEUE_URL") else value


def load_settings(
    env: str | None = None, home: str | os.PathLike[str] | None = None, conf_dir: Path | None = None
) -> Settings:
    """Load and validate the settings for ``env`` (default: ``CD4ML_ENV`` or sit)."""
    name = resolve_env(env)
    conf = resolve_conf_dir(conf_dir)
    root = Path(home or os.environ.get("CD4ML_HOME") or Path.cwd() / ".cd4ml").resolve()
    merged = deep_merge(read_yaml(conf / "base.yaml"), read_yaml(conf / f"{name}.yaml"))
    dataset = dataset_name()
    if dataset:  # what the data needs (classes, channels, size, model) over every environment's settings
        merged = deep_merge(merged, read_yaml(conf / "datasets" / f"{dataset}.yaml"))
    for key in ("env", "home"):
        if key in merged:
            raise SettingsError(f"settings in {conf}: {key} is set by the loader (CD4ML_ENV / CD4ML_HOME), not in a file")
    # The files merge over the code's defaults key by key (a file naming one alert route keeps the others).
    values = _fill(deep_merge(code_defaults(), merged), {"home": str(root), "env": name})
    _apply_deployment_variables(values, os.environ)
    settings = _validated({"env": name, "home": str(root), **values}, name, conf)
    if settings.release.upstream == name:
        raise SettingsError(f"invalid settings for env {name!r} ({conf}): release.upstream cannot be the environment itself")
    return settings
