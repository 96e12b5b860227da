"""The MLflow model registry: one registered model per environment, a champion alias.

* ``register_and_promote`` registers a training run's model (once: a second call for the same
  run reuses its version), copies the lineage (curated table and version, raw version,
  environment, gate outcome) onto the model version as tags, and moves the champion alias
  only when the gate passed.
* ``champion`` answers "which model serves, trained on which data" from those tags.
* ``mlflow_client`` / ``ensure_experiment`` are the one place the tracking and registry URIs
  are set from the settings (also used by ``tasks.train`` and ``tasks.evaluate``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.errors import DataError
from tasks.settings import Settings

log = logging.getLogger(__name__)

# Tag keys shared by runs (set by tasks.train) and model versions (set here).
TAG_ENV = "cd4ml.env"
TAG_CURATED_TABLE = "cd4ml.curated_table"
TAG_CURATED_VERSION = "cd4ml.curated_version"
TAG_RAW_VERSION = "cd4ml.raw_version"
TAG_CONFIG_HASH = "cd4ml.config_hash"
TAG_LOGICAL_DATE = "cd4ml.logical_date"
TAG_AIRFLOW_RUN_ID = "cd4ml.airflow_run_id"
TAG_MODEL_URI = "cd4ml.model_uri"
TAG_GIT_COMMIT = "git_commit"
LINEAGE_RUN_TAGS = (
    TAG_ENV,
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    TAG_RAW_VERSION,
    TAG_CONFIG_HASH,
    TAG_LOGICAL_DATE,
    TAG_AIRFLOW_RUN_ID,
    TAG_GIT_COMMIT,
)

NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


class StaleGateError(DataError, RuntimeError):
    """The champion moved after the gate compared against it: evaluate again before promoting."""


def mlflow_client(settings: Settings) -> MlflowClient:
    """Point MLflow (fluent API and a client) at this environment's tracking and registry store."""
    return client_for(settings.tracking_uri)


def client_for(uri: str) -> MlflowClient:
    """Point MLflow (fluent API and a client) at one store for tracking and registry alike."""
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(settings: Settings, client: MlflowClient | None = None) -> str:
    """The experiment's id, created with ``settings.tracking.artifact_root`` when missing."""
    client = client or mlflow_client(settings)
    name = settings.tracking.experiment
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=settings.tracking.artifact_root)
        except MlflowException:
            experiment = client.get_experiment_by_name(name)  # created concurrently
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "", "None") else None
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class ChampionInfo:
    version: int
    run_id: str
    curated_table: str | None
    curated_version: int | None
    raw_version: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RegistrationResult:
    model_name: str
    version: int
    alias_set: bool
    previous_champion_version: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def champion_model_version(settings: Settings, client: MlflowClient) -> ModelVersion | None:
    """The ModelVersion the champion alias points at; None without a registered model or alias."""
    name = settings.registry.model_name
    try:
        registered = client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == NOT_FOUND:
            return None
        raise
    version = (registered.aliases or {}).get(settings.registry.champion_alias)
    if version is None:
        return None
    return client.get_model_version(name, str(version))


def _lineage(version: ModelVersion, client: MlflowClient) -> dict[str, Any]:
    """Lineage from the model version's tags, falling back to its run's tags."""
    tags = dict(version.tags or {})
    if version.run_id and not all(k in tags for k in (TAG_CURATED_TABLE, TAG_CURATED_VERSION)):
        try:
            tags = {**client.get_run(version.run_id).data.tags, **tags}
        except MlflowException as exc:
            if exc.error_code != NOT_FOUND:
                raise
    return {
        "curated_table": tags.get(TAG_CURATED_TABLE),
        "curated_version": _int_or_none(tags.get(TAG_CURATED_VERSION)),
        "raw_version": _int_or_none(tags.get(TAG_RAW_VERSION)),
    }


def champion(settings: Settings) -> ChampionInfo | None:
    """The model version holding the champion alias, with its data lineage; None if none."""
    client = mlflow_client(settings)
    version = champion_model_version(settings, client)
    if version is None:
        return None
    return ChampionInfo(version=int(version.version), run_id=version.run_id, **_lineage(version, client))


def _gate_dict(gate: Any) -> dict[str, Any]:
    if hasattr(gate, "to_dict"):
        gate = gate.to_dict()
    if not isinstance(gate, Mapping):
        raise TypeError(f"gate must be a GateResult or a dict, got {type(gate).__name__}")
    missing = {"passed", "metric", "candidate_value", "threshold", "champion_version"} - set(gate)
    if missing:
        raise ValueError(f"gate result lacks {sorted(missing)}")
    return dict(gate)


def _model_uri_for_run(client: MlflowClient, run_id: str) -> str:
    run = client.get_run(run_id)
    if run.info.status != "FINISHED":
        raise ValueError(f"run {run_id} is {run.info.status}, not FINISHED: nothing to register")
    uri = run.data.tags.get(TAG_MODEL_URI)
    if uri:
        return uri
    logged = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run_id}'",
        output_format="list",
    )
    if not logged:
        raise ValueError(f"run {run_id} has no logged model to register")
    return logged[0].model_uri


def _versions_of_run(client: MlflowClient, name: str, run_id: str) -> list[ModelVersion]:
    return sorted(
        client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"),
        key=lambda v: int(v.version),
    )


def register_and_promote(settings: Settings, candidate_run_id: str, gate: Any) -> RegistrationResult:
    """Register the candidate run's model (idempotent), tag its lineage, promote if it passed.

    ``gate`` is a ``tasks.evaluate.GateResult`` or its ``to_dict()`` (e.g. from XCom). When the
    gate passed but the champion has moved since the gate compared against it, the alias is left
    alone and ``StaleGateError`` is raised: evaluate again against the new champion.
    """
    client = mlflow_client(settings)
    name = settings.registry.model_name
    alias = settings.registry.champion_alias
    gate_info = _gate_dict(gate)
    run = client.get_run(candidate_run_id)

    existing = _versions_of_run(client, name, candidate_run_id)
    if existing:
        version = existing[0]
        log.info("run %s is already registered as %s version %s: reusing it", candidate_run_id, name, version.version)
    else:
        model_uri = _model_uri_for_run(client, candidate_run_id)
        version = mlflow.register_model(model_uri, name, await_registration_for=60)
        if str(version.run_id or "") != candidate_run_id:  # an older store that does not record it
            raise RuntimeError(f"registered version {version.version} does not name run {candidate_run_id}")
        log.info("registered run %s as %s version %s", candidate_run_id, name, version.version)
    number = str(version.version)

    run_tags = run.data.tags
    tags = {k: run_tags[k] for k in LINEAGE_RUN_TAGS if run_tags.get(k) not in (None, "")}
    tags[TAG_ENV] = settings.env
    tags.update(
        {
            "cd4ml.gate.passed": str(bool(gate_info["passed"])).lower(),
            "cd4ml.gate.metric": str(gate_info["metric"]),
            "cd4ml.gate.candidate_value": repr(float(gate_info["candidate_value"])),
            "cd4ml.gate.threshold": repr(float(gate_info["threshold"])),
            "cd4ml.gate.champion_version": str(gate_info.get("champion_version")),
            "cd4ml.gate.report": str(gate_info.get("report_path") or ""),
        }
    )
    current_tags = dict(version.tags or {})
    for key, value in tags.items():
        if current_tags.get(key) != value:
            client.set_model_version_tag(name, number, key, value)

    previous = champion_model_version(settings, client)
    previous_number = int(previous.version) if previous is not None else None
    alias_set = False
    if gate_info["passed"]:
        compared = _int_or_none(gate_info.get("champion_version"))
        if previous_number not in (compared, int(number)):
            raise StaleGateError(
                f"the gate compared run {candidate_run_id} with champion version {compared}, but "
                f"{name}@{alias} is now version {previous_number}: evaluate again before promoting"
            )
        if previous_number != int(number):
            client.set_registered_model_alias(name, alias, number)
            log.info("%s@%s: version %s -> %s", name, alias, previous_number, number)
        alias_set = True
    else:
        log.warning("gate failed for run %s: version %s registered, %s@%s unchanged", candidate_run_id, number, name, alias)
    return RegistrationResult(
        model_name=name, version=int(number), alias_set=alias_set, previous_champion_version=previous_number
    )


def model_versions(settings: Settings) -> list[dict[str, Any]]:
    """Every version of this environment's registered model, newest first, for a status view."""
    client = mlflow_client(settings)
    name = settings.registry.model_name
    try:
        aliases_by_version: dict[str, list[str]] = {}
        for alias_name, v in (client.get_registered_model(name).aliases or {}).items():
            aliases_by_version.setdefault(str(v), []).append(alias_name)
    except MlflowException as exc:
        if exc.error_code == NOT_FOUND:
            return []
        raise
    rows = []
    for version in client.search_model_versions(f"name = '{name}'"):
        tags = version.tags or {}
        rows.append(
            {
                "version": int(version.version),
                "aliases": sorted(aliases_by_version.get(str(version.version), [])),
                "run_id": version.run_id,
                **_lineage(version, client),
                "gate_passed": {"true": True, "false": False}.get(tags.get("cd4ml.gate.passed", "")),
                "created": datetime.fromtimestamp(version.creation_timestamp / 1000, tz=UTC).isoformat(),
            }
        )
    return sorted(rows, key=lambda r: r["version"], reverse=True)


__all__ = [
    "ChampionInfo",
    "RegistrationResult",
    "StaleGateError",
    "champion",
    "champion_model_version",
    "ensure_experiment",
    "mlflow_client",
    "model_versions",
    "register_and_promote",
]
