"""The MLflow model registry: one registered model per environment, a champion alias.

* ``register_candidate`` registers a training run's model (once: a second call for the same
  run reuses its version) and copies the lineage (curated table and version, raw version,
  environment, drift status, requirements hash) onto the model version as tags. Aliases move
  only in ``tasks.release.release`` (challenger after the gate, champion through promotion).
* Which version is champion is ``tasks.models.champion``.
* ``mlflow_client`` / ``ensure_experiment`` are the one place the tracking and registry URIs
  are set from the settings (also used by ``tasks.training.train`` and ``tasks.release.evaluate``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.errors import DataError
from tasks.models.integrity import record_manifest, set_version_tag
from tasks.settings import Settings

log = logging.getLogger(__name__)

# Tag keys shared by runs (set by tasks.training.train) and model versions (set here).
TAG_ENV = "cd4ml.env"
TAG_CURATED_TABLE = "cd4ml.curated_table"
TAG_CURATED_VERSION = "cd4ml.curated_version"
TAG_RAW_VERSION = "cd4ml.raw_version"
TAG_CONFIG_HASH = "cd4ml.config_hash"
TAG_LOGICAL_DATE = "cd4ml.logical_date"
TAG_AIRFLOW_RUN_ID = "cd4ml.airflow_run_id"
TAG_MODEL_URI = "cd4ml.model_uri"
TAG_GIT_COMMIT = "git_commit"
TAG_REQUIREMENTS_HASH = "cd4ml.requirements_hash"
TAG_DRIFT_STATUS = "cd4ml.drift.status"
TAG_DRIFT_REPORT = "cd4ml.drift.report"
TAG_SAMPLE = "cd4ml.sample"  # the named sample version trained on (sit), e.g. sample-50pct-of-curated-v3
TAG_SOURCE = "cd4ml.source"  # runs:/<id> (trained here) or models:/<name>/<version> (copied from upstream)
TAG_COPIED_FROM = "cd4ml.copied_from"
TAG_ROLLED_BACK = "cd4ml.rolled_back"  # reason; such a version is never promoted automatically again
# Provenance of a version imported from another environment's registry (tasks/release/model_import.py).
TAG_IMPORT_REGISTRY = "cd4ml.import.source_registry"  # its tracking URI, without credentials
TAG_IMPORT_ENV = "cd4ml.import.source_env"
TAG_IMPORT_MODEL = "cd4ml.import.source_model"
TAG_IMPORT_VERSION = "cd4ml.import.source_version"
TAG_IMPORT_RUN = "cd4ml.import.source_run_id"
TAG_IMPORT_GATE = "cd4ml.import.source_gate"  # JSON: the source's cd4ml.gate.* tags (decision, report, test, ...)
TAG_IMPORT_RELEASE = "cd4ml.import.source_release"  # the source's last release-ledger row (JSON), as tagged upstream
TAG_IMPORT_MANIFEST = "cd4ml.import.source_manifest_sha256"
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
EXTRA_LINEAGE_TAGS = (TAG_REQUIREMENTS_HASH, TAG_DRIFT_STATUS, TAG_DRIFT_REPORT, TAG_SAMPLE)

NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


class StaleGateError(DataError, RuntimeError):
    """The champion moved after the gate compared against it: evaluate again before promoting."""


class LineageError(DataError, ValueError):
    """A model version lacks the lineage tags the gate needs (which data it was trained on)."""


class UnknownModelVersionError(DataError, LookupError):
    """The model version asked for does not exist; the message lists what does."""


_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def mlflow_client(settings: Settings) -> MlflowClient:
    """Point MLflow (fluent API and a client) at this environment's tracking and registry store."""
    return client_for(settings.tracking_uri)


def client_for(uri: str) -> MlflowClient:
    """Point MLflow (fluent API and a client) at one store for tracking and registry alike.

    MLflow's setters also export the URI as ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI``, which
    settings read as an operator's override: left there, the first environment a process touched
    would capture every later one (a second environment's settings would read the first's store).
    The process's own values are put back; the fluent API keeps the URI set here.
    """
    saved = {name: os.environ.get(name) for name in _URI_VARIABLES}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _artifact_location(settings: Settings) -> str | None:
    """``tracking.artifact_root``, except that a tracking server keeps a local-path root to itself.

    A local path means "this machine" to a local store; next to an ``http(s)://`` tracking server the
    server's ``--artifacts-destination`` decides (artifacts go through it), else every client
    would write to its own disk. A URI root (``s3://``, ``mlflow-artifacts:/``) is used as given.
    """
    root = settings.tracking.artifact_root
    if settings.tracking_uri.startswith(("http://", "https://")) and "://" not in root and ":/" not in root:
        return None
    return root


def ensure_experiment(settings: Settings, client: MlflowClient | None = None) -> str:
    """The experiment's id, created with ``settings.tracking.artifact_root`` when missing."""
    client = client or mlflow_client(settings)
    name = settings.tracking.experiment
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=_artifact_location(settings))
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


def version_lineage(version: ModelVersion, client: MlflowClient) -> dict[str, Any]:
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


def get_model_version(client: MlflowClient, name: str, version: int | str) -> ModelVersion:
    """One model version, or ``UnknownModelVersionError`` naming what exists."""
    try:
        return client.get_model_version(name, str(int(version)))
    except (TypeError, ValueError) as exc:
        raise UnknownModelVersionError(f"{version!r} is not a model version number") from exc
    except MlflowException as exc:
        if exc.error_code != NOT_FOUND:
            raise
        existing = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
        raise UnknownModelVersionError(
            f"{name} has no version {version}" + (f" (versions: {existing})" if existing else " (no versions at all)")
        ) from exc


def trained_on(version: ModelVersion) -> tuple[str, int]:
    """(curated table, version) a model version was trained on, from the version's own tags; else LineageError.

    ``register_candidate`` and ``import_model`` always write them; a version registered by
    hand (MLflow UI, another tool) has none and is refused rather than guessed from a run.
    """
    tags = dict(version.tags or {})
    table, number = tags.get(TAG_CURATED_TABLE), tags.get(TAG_CURATED_VERSION)
    if not table or number in (None, "", "None"):
        raise LineageError(
            f"{version.name} version {version.version} has no {TAG_CURATED_TABLE}/{TAG_CURATED_VERSION} lineage tags: "
            "nobody can tell which images it saw, so it cannot be gated or promoted"
        )
    return table, int(number)


def alias_version(client: MlflowClient, name: str, alias: str) -> int | None:
    """The version number an alias points at, None when the model or the alias does not exist."""
    try:
        aliases = client.get_registered_model(name).aliases or {}
    except MlflowException as exc:
        if exc.error_code == NOT_FOUND:
            return None
        raise
    return int(aliases[alias]) if alias in aliases else None


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


def set_version_tags(client: MlflowClient, version: ModelVersion, tags: Mapping[str, str]) -> None:
    """Set only the tags whose value differs (a retry writes nothing)."""
    current = dict(version.tags or {})
    for key, value in tags.items():
        if current.get(key) != value:
            set_version_tag(client, version.name, str(version.version), key, value)


def register_candidate(settings: Settings, candidate_run_id: str) -> int:
    """Register a finished training run's model in this environment's registered model, with its lineage.

    The sha256 of every file of the version is stored on it (``tasks.models.integrity``).
    Idempotent: a second call for the same run reuses its version. No alias moves here: the gate
    decides about ``challenger``, promotion about ``champion`` (tasks/release/release.py).
    """
    client = mlflow_client(settings)
    name = settings.registry.model_name
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
        version = client.get_model_version(name, str(version.version))
    run_tags = run.data.tags
    tags = {k: run_tags[k] for k in (*LINEAGE_RUN_TAGS, *EXTRA_LINEAGE_TAGS) if run_tags.get(k) not in (None, "")}
    tags[TAG_ENV] = settings.env
    tags[TAG_SOURCE] = f"runs:/{candidate_run_id}"
    set_version_tags(client, version, tags)
    record_manifest(settings, client, version)  # the files as trained: every later load is checked against them
    return int(version.version)


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
                **version_lineage(version, client),
                "gate_passed": {"true": True, "false": False}.get(tags.get("cd4ml.gate.passed", "")),
                "gate_decision": tags.get("cd4ml.gate.decision"),
                "copied_from": tags.get(TAG_COPIED_FROM),
                "rolled_back": tags.get(TAG_ROLLED_BACK),
                "created": datetime.fromtimestamp(version.creation_timestamp / 1000, tz=UTC).isoformat(),
            }
        )
    return sorted(rows, key=lambda r: r["version"], reverse=True)


__all__ = [
    "LineageError",
    "StaleGateError",
    "UnknownModelVersionError",
    "alias_version",
    "version_lineage",
    "ensure_experiment",
    "get_model_version",
    "mlflow_client",
    "model_versions",
    "register_candidate",
    "set_version_tags",
    "trained_on",
]
