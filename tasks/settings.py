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
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENVIRONMENTS: tuple[str, ...] = ("sit", "uat", "prod")
DEFAULT_ENV = "sit"
REPO_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(ValueError):
    """The settings cannot be loaded; the message says which key and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSettings(_Section):
    landing_uri: str
    lake_uri: str
    reports_dir: str


class TrackingSettings(_Section):
    uri: str
    artifact_root: str
    experiment: str


class RegistrySettings(_Section):
    model_name: str
    champion_alias: str = "champion"


class IngestSettings(_Section):
    image_extensions: tuple[str, ...]
    min_side: int = Field(gt=0)
    max_side: int = Field(gt=0)
    max_pixels: int = Field(gt=0)
    allowed_labels: tuple[str, ...]
    batch_size: int = Field(gt=0)

    @model_validator(mode="after")
    def _sides(self) -> "IngestSettings":
        if self.min_side > self.max_side:
            raise ValueError(f"min_side {self.min_side} > max_side {self.max_side}")
        return self


class ValidationSettings(_Section):
    allowed_modes: tuple[str, ...]
    min_images_per_class: int = Field(ge=0)
    max_class_imbalance: float = Field(ge=1.0)
    max_rejected_share: float = Field(ge=0.0, le=1.0)


class CurationSettings(_Section):
    near_duplicate_threshold: float = Field(gt=0.0, le=1.0)
    split_ratios: dict[Literal["train", "val", "test"], float]
    split_salt: str

    @field_validator("split_ratios")
    @classmethod
    def _ratios(cls, v: dict[str, float]) -> dict[str, float]:
        if set(v) != {"train", "val", "test"}:
            raise ValueError(f"split_ratios needs train, val and test, got {sorted(v)}")
        if any(r < 0 for r in v.values()) or abs(sum(v.values()) - 1.0) > 1e-6:
            raise ValueError(f"split_ratios must be >= 0 and sum to 1, got {v}")
        return v


class DriftSettings(_Section):
    p_value: float = Field(gt=0.0, lt=1.0)
    max_samples: int = Field(gt=1)
    image_size: int = Field(gt=0)
    n_permutations: int = Field(gt=0)


class TrainingSettings(_Section):
    model: Literal["small_cnn"]
    image_size: int = Field(gt=0)
    epochs: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    learning_rate: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    patience: int = Field(ge=0)
    min_delta: float = Field(ge=0)
    seed: int
    num_threads: int = Field(gt=0)


class GateSettings(_Section):
    metric: Literal["accuracy", "macro_f1"]
    min_value: float = Field(ge=0.0, le=1.0)
    max_regression: float = Field(ge=0.0, le=1.0)


class AlertSettings(_Section):
    channels: tuple[Literal["log"], ...]
    min_severity: Literal["info", "warning", "critical"]


class Settings(_Section):
    env: Literal["sit", "uat", "prod"]
    home: str
    project: str
    storage: StorageSettings
    tracking: TrackingSettings
    registry: RegistrySettings
    ingest: IngestSettings
    validation: ValidationSettings
    curation: CurationSettings
    drift: DriftSettings
    training: TrainingSettings
    gate: GateSettings
    alerts: AlertSettings

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
    def reports_path(self) -> Path:
        return Path(self.storage.reports_dir)

    @property
    def tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or self.tracking.uri

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
            f"CD4ML_ENV={name!r} is not a known environment; use one of {', '.join(ENVIRONMENTS)}"
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
    merged = _fill(merged, {"home": str(root), "env": name})
    try:
        return Settings(env=name, home=str(root), **merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"invalid settings for env {name!r} ({conf}): {problems}") from exc
