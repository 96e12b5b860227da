"""Settings: one code path, the environment picks the file.

``CD4ML_ENV`` (sit | uat | prod, default sit) selects ``conf/<env>.yaml``, which is
deep-merged over ``conf/base.yaml``. ``CD4ML_HOME`` (default ``./.cd4ml``) is the root of
all local state. ``MLFLOW_TRACKING_URI`` overrides the tracking store, so production points
at PostgreSQL without a code change. Everything is validated at load: a bad environment
name or a bad threshold fails with one clear message, before any work starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
    landing_uri: str
    lake_uri: str
    reports_dir: str
    scoring_uri: str = "{home}/{env}/scoring"  # unlabelled images the scheduled cd4ml_score run scores
    feedback_uri: str = "{home}/{env}/feedback"  # true labels that arrive later (*.csv, *.jsonl: image,label)


class TrackingSettings(_Section):
    uri: str
    artifact_root: str
    experiment: str


class RegistrySettings(_Section):
    model_name: str
    champion_alias: str = "champion"


class IngestSettings(_Section):
    schedule: str | None = "@daily"  # cd4ml_ingest's schedule (cron or preset); null = triggered only
    image_extensions: tuple[str, ...]
    min_side: int = Field(gt=0)
    max_side: int = Field(gt=0)
    max_pixels: int = Field(gt=0)
    # The class names, or "discover": the first validated version names them (tasks/data/classes.py).
    allowed_labels: tuple[str, ...] | Literal["discover"]
    batch_size: int = Field(gt=0)
    # Data plane (tasks/data/sources.py, tasks/data/ingest.py, tasks/data/spark_ingest.py); defaults keep old confs valid.
    label_source: Literal["folders", "csv", "jsonl"] = "folders"
    manifest_uri: str | None = None  # csv/jsonl manifest; relative = inside the landing root
    keep_modes: tuple[str, ...] = ("L", "RGB")  # stored as they are
    # Converted to L/RGB at ingest (stored as lossless PNG); any other mode is rejected.
    convert_modes: tuple[Literal["1", "P", "PA", "LA", "RGBA", "I;16", "I;16B", "I;16L", "I", "CMYK"], ...] = (
        "1", "P", "PA", "LA", "RGBA", "I;16", "I;16B", "I;16L", "I",
    )
    target_file_mb: int = Field(default=16, gt=0)  # Delta data file size: bounds the writer's memory
    commit_retries: int = Field(default=8, gt=0)  # re-plans after a lost Delta commit race
    engine: Literal["local", "spark"] = "local"
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = Field(default_factory=dict)  # e.g. spark.jars for the delta-spark jars

    @model_validator(mode="after")
    def _sides(self) -> "IngestSettings":
        if self.min_side > self.max_side:
            raise ValueError(f"min_side {self.min_side} > max_side {self.max_side}")
        if self.label_source != "folders" and not self.manifest_uri:
            raise ValueError(f"label_source {self.label_source!r} needs manifest_uri")
        return self


class ValidationSettings(_Section):
    allowed_modes: tuple[str, ...]
    min_images_per_class: int = Field(ge=0)
    max_class_imbalance: float = Field(ge=1.0)
    max_rejected_share: float = Field(ge=0.0, le=1.0)


class RetentionSettings(_Section):
    """VACUUM: how long unreferenced Delta files stay; versions models were trained on always stay."""

    retention_hours: int = Field(default=168, ge=0)
    protect_tagged: bool = True  # named dataset versions are kept like trained-on versions


class OutlierSettings(_Section):
    """Bad-image thresholds on fastdup's image statistics (see tasks/curation/curate.py for the tuning)."""

    min_blur: float = Field(default=50.0, ge=0.0)  # variance of the Laplacian of the exported copy
    min_mean: float = Field(default=10.0, ge=0.0, le=255.0)  # below: too dark
    max_mean: float = Field(default=245.0, ge=0.0, le=255.0)  # above: too bright
    min_side: int = Field(default=8, gt=0)  # decoded width or height below: too small
    # A rule that flags more than this share of the images (and at least 10) does not fit the data:
    # curation stops with the numbers instead of dropping them quietly. 1 = never stop.
    max_share: float = Field(default=0.05, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _means(self) -> "OutlierSettings":
        if self.min_mean >= self.max_mean:
            raise ValueError(f"min_mean {self.min_mean} must be below max_mean {self.max_mean}")
        return self


class CurationSettings(_Section):
    # Grouping is generous (components decide splits: near-copies never straddle them), dropping
    # precise: an image is dropped only as a copy of a kept image, by the copy score (tasks/curation/copy_pairs.py).
    near_duplicate_threshold: float = Field(gt=0.0, le=1.0)  # embedding cosine: grouping only
    copy_similarity: float = Field(default=0.9974, gt=0.0, le=1.0)  # copy score: a copy at or above
    copy_candidates: int = Field(default=8, ge=1, le=256)  # nearest neighbours per new image to score
    split_ratios: dict[Literal["train", "val", "test"], float]
    split_salt: str
    # Curation features; defaults keep older confs valid.
    embedding: Literal["pixels", "fastdup"] = "pixels"  # pixels for tiny digits; fastdup's model for photos
    feature_size: int = Field(default=8, gt=0)  # pixels: side of the grey-pixel embedding
    outliers: OutlierSettings = Field(default_factory=OutlierSettings)

    @field_validator("split_ratios")
    @classmethod
    def _ratios(cls, v: dict[str, float]) -> dict[str, float]:
        if set(v) != {"train", "val", "test"}:
            raise ValueError(f"split_ratios needs train, val and test, got {sorted(v)}")
        if any(r < 0 for r in v.values()) or abs(sum(v.values()) - 1.0) > 1e-6:
            raise ValueError(f"split_ratios must be >= 0 and sum to 1, got {v}")
        return v


class DriftSettings(_Section):
    """tasks/monitoring/drift.py: new data against the champion's training data, on the champion's own features."""

    p_value: float = Field(gt=0.0, lt=1.0)  # family-wise level of the whole check (its tests share it)
    max_samples: int = Field(gt=1)  # new images tested per check (hash sample)
    image_size: int = Field(gt=0)  # pixel fallback only: the champion's own image size otherwise
    n_permutations: int = Field(gt=0)
    max_reference: int = Field(default=10000, gt=1)  # reference images the detectors are fitted on
    mmd_reference: int = Field(default=1000, gt=1)  # of those, the MMD test's (its cost grows with the square)
    # warn: alert and train | block: harmful drift stops training and alerts on-call |
    # retrain: train only when the new data drifted (or there is no champion yet)
    policy: Literal["warn", "block", "retrain"] = "warn"
    # A detected drift is harmful when the champion's accuracy on the new labelled images is more than this
    # (absolute) below its test accuracy, or when that cannot be measured (no labels, no champion softmax).
    max_accuracy_drop: float = Field(default=0.05, ge=0.0, le=1.0)


class KubernetesTrainerSettings(_Section):
    """The trainer pod a ``kubernetes`` launcher asks for (spec built by ``tasks.training.train.trainer_pod_spec``)."""

    image: str = "cd4ml-trainer:latest"
    namespace: str = "cd4ml"
    gpus: int = Field(default=0, ge=0)
    cpu: str = "2"
    memory: str = "8Gi"
    # Mounted at CD4ML_HOME: the decode cache and checkpoints must outlive a pod, or a retry restarts at epoch 1.
    state_pvc: str = "cd4ml-state"
    service_account: str | None = None
    # Kubernetes Secret holding MLFLOW_TRACKING_URI for the pod (never in the repo or the spec).
    secret_name: str = "cd4ml-secrets"


class TrainingSettings(_Section):
    model: Literal["small_cnn", "resnet18", "resnet50"]
    image_size: int = Field(gt=0)  # side of the square model input (cd4ml_runtime.preprocess)
    channels: Literal[1, 3, "auto"] = "auto"  # auto: the majority of the images' stored modes (L -> 1, RGB -> 3)
    fit: Literal["crop", "pad", "squash"] = "crop"  # non-square images: centre crop | letterbox | stretch
    epochs: int = Field(gt=0)
    batch_size: int = Field(gt=0)  # per process; the global batch is batch_size * world size
    learning_rate: float = Field(gt=0)  # for base_batch_size; scaled to the global batch by lr_scaling
    weight_decay: float = Field(ge=0)
    patience: int = Field(ge=0)
    min_delta: float = Field(ge=0)
    seed: int
    num_threads: int = Field(gt=0)
    lr_scaling: Literal["linear", "sqrt", "none"] = "linear"
    base_batch_size: int = Field(default=64, gt=0)
    scheduler: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: int = Field(default=0, ge=0)
    augment_shift: int = Field(default=1, ge=0)  # random translation in pixels, train split only; 0 = off
    augment_crop_scale: float = Field(default=1.0, gt=0.0, le=1.0)  # random resized crop, smallest area kept; 1 = off
    augment_hflip: bool = False  # only where a mirrored image keeps its label (photos yes, digits no)
    augment_color_jitter: float = Field(default=0.0, ge=0.0, le=1.0)  # brightness/contrast/saturation x U(1 -+ j)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: bool = True  # bf16 autocast on CUDA; CPU always trains in float32
    channels_last: bool = True  # CUDA and CPU
    num_workers: int = Field(default=0, ge=0)
    finetune_from: str | None = None  # a model URI (models:/name@alias or models:/name/N): transfer learning
    freeze_backbone: bool = False
    launcher: Literal["in_process", "torchrun", "kubernetes"] = "in_process"
    nproc_per_node: int = Field(default=1, gt=0)
    checkpoint_dir: str
    cache_dir: str
    keep_checkpoints: bool = False
    kubernetes: KubernetesTrainerSettings = KubernetesTrainerSettings()

    @field_validator("channels", mode="before")
    @classmethod
    def _channels(cls, v: Any) -> Any:
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v  # "3" from a form or --set

    @model_validator(mode="after")
    def _launcher(self) -> "TrainingSettings":
        if self.launcher == "in_process" and self.nproc_per_node > 1:
            raise ValueError("nproc_per_node > 1 needs launcher torchrun or kubernetes, not in_process")
        return self


class SearchParam(_Section):
    """One tuned training field: a float or int range (optionally log-scaled) or a list of choices."""

    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[bool | int | float | str, ...] | None = None

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


class TuningSettings(_Section):
    on_by_default: bool = False  # the `tune` Param's default: scheduled (asset-triggered) runs tune too
    n_trials: int = Field(gt=0)
    epochs_per_trial: int = Field(gt=0)  # the pruner's maximum resource
    sampler: Literal["tpe", "random"] = "tpe"
    seed: int = 0
    pruner: Literal["none", "median", "successive_halving", "hyperband"]
    min_resource: int = Field(default=1, gt=0)
    reduction_factor: int = Field(default=3, gt=1)
    n_startup_trials: int = Field(default=2, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    storage: str  # CD4ML_OPTUNA_STORAGE overrides (PostgreSQL in production)
    search_space: dict[str, SearchParam]

    @field_validator("search_space")
    @classmethod
    def _known_fields(cls, v: dict[str, SearchParam]) -> dict[str, SearchParam]:
        unknown = sorted(set(v) - set(TrainingSettings.model_fields))
        if unknown:
            raise ValueError(f"search_space names fields that training does not have: {unknown}")
        return v


class GateSettings(_Section):
    """The automatic gate (tasks/release/evaluate.py): floors, a paired test, per-class recall, smoke, latency, size."""

    metric: Literal["accuracy", "macro_f1"]
    min_value: float = Field(ge=0.0, le=1.0)  # absolute floor of the candidate on the test split
    # Non-inferiority margin: the candidate's accuracy may trail the champion's by at most this much
    # (absolute) before the paired test is even asked; a larger drop is "worse" whatever the test says.
    max_regression: float = Field(ge=0.0, le=1.0)
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)  # McNemar exact, one-sided: p < alpha = significantly worse
    min_test_images: int = Field(default=100, gt=0)  # below: the gate refuses to decide
    max_class_recall_drop: float = Field(default=0.15, ge=0.0, le=1.0)  # per class, absolute
    min_class_support: int = Field(default=10, gt=0)  # classes with fewer test images are reported, not judged
    smoke_test: bool = True  # load the registered pyfunc in a fresh process, classify PNG and JPEG bytes
    latency_samples: int = Field(default=50, gt=0)  # single-image predictions timed in the smoke process
    max_latency_p95_ms: float = Field(default=250.0, gt=0.0)
    max_model_mb: float = Field(default=100.0, gt=0.0)
    smoke_timeout_s: int = Field(default=300, gt=0)


class ReleaseSettings(_Section):
    """How a model reaches this environment's champion alias (tasks/release/release.py)."""

    # deploy_code: this environment trains on its own data; deploy_model: it copies the champion of
    # ``upstream`` into its own registered model (MLflow copy_model_version) and gates it here.
    pattern: Literal["deploy_code", "deploy_model"] = "deploy_code"
    upstream: Literal["sit", "uat", "prod"] | None = None
    approval: Literal["none", "required"] = "none"
    approval_timeout_hours: float = Field(default=72.0, gt=0.0)
    approvers: tuple[str, ...] = ()  # user ids allowed to answer (HITL assigned_users); empty = any UI user
    sample_fraction: float = Field(default=1.0, gt=0.0, le=1.0)  # < 1: train on a hash sample of image keys
    sample_salt: str = "cd4ml-sample-v1"
    challenger_alias: str = "challenger"

    @model_validator(mode="after")
    def _pattern(self) -> "ReleaseSettings":
        if self.pattern == "deploy_model" and not self.upstream:
            raise ValueError("pattern deploy_model needs upstream (the environment whose champion is copied)")
        return self


Channel = Literal["log", "slack", "pagerduty", "email"]


class AlertRetrySettings(_Section):
    """Each channel's send is tried ``attempts`` times, waiting backoff_s, 2*backoff_s, ... (capped)."""

    attempts: int = Field(default=3, ge=1)
    backoff_s: float = Field(default=2.0, ge=0.0)
    max_backoff_s: float = Field(default=30.0, ge=0.0)
    timeout_s: int = Field(default=10, gt=0)  # per HTTP request (Slack, PagerDuty)


class DeadlineSettings(_Section):
    """A DAG run must finish within ``minutes`` of its logical date or of being queued (Airflow DeadlineAlert)."""

    reference: Literal["logical_date", "queued_at"]
    minutes: float = Field(gt=0.0)


class AlertSettings(_Section):
    """Where alerts go (tasks/alerting/delivery.py): channels per severity, the Airflow Connections behind them."""

    # severity -> channels. "log" is in every route: the log line is the record of every alert.
    routes: dict[Literal["info", "warning", "critical"], tuple[Channel, ...]]
    ui_base_url: str = "http://localhost:8080"  # Airflow UI: task-log and Required Actions links
    runbook_base_url: str | None = None  # e.g. https://git.example.com/ml/cd4ml/-/blob/main; None = repo path
    slack_conn_id: str = "cd4ml_slack"  # conn type slackwebhook: password = webhook token or URL
    pagerduty_conn_id: str = "cd4ml_pagerduty"  # conn type pagerduty_events: password = routing key
    smtp_conn_id: str = "cd4ml_smtp"  # conn type smtp: host, port, login, password, extra from_email
    email_to: tuple[str, ...] = ()
    retry: AlertRetrySettings = AlertRetrySettings()
    deadlines: dict[str, DeadlineSettings] = {}  # dag_id -> deadline; DAGs not listed have none

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
    """The champion at work (tasks/serving/): batch scoring, the REST server, explanations."""

    schedule: str | None = "@daily"  # cd4ml_score on storage.scoring_uri (cron or preset); None = only when triggered
    batch_size: int = Field(default=256, gt=0)  # images read, decoded and predicted together
    decode_workers: int = Field(default=1, ge=0)  # processes decoding images while the network runs; 0 = none
    decode_min_files: int = Field(default=2048, ge=0)  # fewer files: decoded in process (a worker costs ~0.3 s to start)
    commit_every: int = Field(default=20000, gt=0)  # predictions per Delta commit: a killed run keeps what it committed
    port: int = Field(default=5001, gt=0, lt=65536)  # `cd4ml serve`
    low_confidence: float = Field(default=0.5, ge=0.0, le=1.0)  # below: explained in the monitoring report
    max_explanations: int = Field(default=24, ge=0)  # overlays per monitoring run (misclassified first)


class MonitoringSettings(_Section):
    """Live metrics of the champion (tasks/monitoring/monitor.py); each rule is judged against its own test split."""

    schedule: str | None = "@daily"  # cd4ml_monitor (cron or preset); None = only when triggered
    window_days: int = Field(default=7, gt=0)  # predictions of scoring runs in the N days up to the logical date
    min_predictions: int = Field(default=100, ge=1)  # fewer: distributions are reported, not judged
    min_feedback: int = Field(default=50, ge=1)  # fewer labelled predictions: accuracy/recall/calibration not judged
    p_value: float = Field(default=0.01, gt=0.0, lt=1.0)  # every rule needs significance AND effect size
    max_accuracy_drop: float = Field(default=0.05, ge=0.0, le=1.0)  # live accuracy vs the champion's test accuracy
    max_class_recall_drop: float = Field(default=0.15, ge=0.0, le=1.0)
    min_class_support: int = Field(default=20, ge=1)
    max_ece_increase: float = Field(default=0.05, ge=0.0, le=1.0)  # expected calibration error vs the test split's
    max_label_shift: float = Field(default=0.15, ge=0.0, le=1.0)  # total variation of predicted labels vs test
    max_confidence_shift: float = Field(default=0.15, ge=0.0, le=1.0)  # KS statistic of confidences vs test
    alert_on_harmless_shift: bool = False  # a label/confidence shift alerts even when judged accuracy holds
    retrain_on_breach: bool = False  # on a breach: labelled live images to the landing zone + the retrain-request Asset
    severity: Literal["info", "warning", "critical"] = "warning"


class Settings(_Section):
    env: Literal["sit", "uat", "prod"]
    home: str
    project: str
    storage: StorageSettings
    tracking: TrackingSettings
    registry: RegistrySettings
    ingest: IngestSettings
    validation: ValidationSettings
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    curation: CurationSettings
    drift: DriftSettings
    training: TrainingSettings
    tuning: TuningSettings
    gate: GateSettings
    release: ReleaseSettings = Field(default_factory=ReleaseSettings)
    alerts: AlertSettings
    serving: ServingSettings = Field(default_factory=ServingSettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)

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


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _fill(value: Any, fields: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**fields)
    if isinstance(value, dict):
        return {k: _fill(v, fields) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, fields) for v in value]
    return value


def resolve_env(env: str | None = None) -> str:
    name = (env if env is not None else os.environ.get("CD4ML_ENV", DEFAULT_ENV)).strip().lower()
    if name not in ENVIRONMENTS:
        raise SettingsError(
            f"environment {name!r} (CD4ML_ENV or --env) is not a known environment; use one of {', '.join(ENVIRONMENTS)}"
        )
    return name


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise SettingsError(f"settings file {path} is missing") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"settings file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping, got {type(data).__name__}")
    return data


def load_settings(
    env: str | None = None, home: str | os.PathLike[str] | None = None, conf_dir: Path | None = None
) -> Settings:
    """Load and validate the settings for ``env`` (default: ``CD4ML_ENV`` or sit)."""
    name = resolve_env(env)
    conf = Path(conf_dir or os.environ.get("CD4ML_CONF_DIR") or REPO_ROOT / "conf")
    root = Path(home or os.environ.get("CD4ML_HOME") or Path.cwd() / ".cd4ml").resolve()
    merged = _deep_merge(_read_yaml(conf / "base.yaml"), _read_yaml(conf / f"{name}.yaml"))
    dataset = (os.environ.get("CD4ML_DATASET") or "").strip()
    if dataset:  # what the data needs (classes, channels, size, model) over every environment's settings
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", dataset):
            raise SettingsError(f"CD4ML_DATASET {dataset!r} must be a plain name (a file conf/datasets/<name>.yaml)")
        merged = _deep_merge(merged, _read_yaml(conf / "datasets" / f"{dataset}.yaml"))
    merged = _fill(merged, {"home": str(root), "env": name})
    if os.environ.get("CD4ML_LAKE_URI"):  # a deployment's bucket (terraform output lake_uri), like MLFLOW_TRACKING_URI
        merged.setdefault("storage", {})["lake_uri"] = os.environ["CD4ML_LAKE_URI"]
    try:
        settings = Settings(env=name, home=str(root), **merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"invalid settings for env {name!r} ({conf}): {problems}") from exc
    if settings.release.upstream == name:
        raise SettingsError(f"invalid settings for env {name!r} ({conf}): release.upstream cannot be the environment itself")
    return settings
