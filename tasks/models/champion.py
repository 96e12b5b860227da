"""Who is champion in an environment: the one lookup of the champion alias, and what follows from it.

* ``champion_version`` is the ModelVersion the alias points at (None without one): every other
  answer here, the gate's comparison and the release path start from it.
* ``champion_info`` adds the data it was trained on (from the version's lineage tags).
* ``serving_model`` pins it for one run. A scoring run, the REST server and the monitor resolve ``models:/<name>@champion`` once, at the
start, to ``models:/<name>/<version>``: the alias can move while a long batch runs, and every
prediction must name the version that made it. No champion is a ``NoChampionError`` (a
``DataError``: retrying cannot help) raised before any work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.errors import DataError
from tasks.models.registry import NOT_FOUND, mlflow_client, version_lineage
from tasks.settings import Settings


class NoChampionError(DataError, RuntimeError):
    """The environment has no champion (to serve, to compare with, or to roll back from)."""


@dataclass(frozen=True)
class ChampionInfo:
    version: int
    run_id: str
    curated_table: str | None
    curated_version: int | None
    raw_version: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def champion_version(settings: Settings, client: MlflowClient) -> ModelVersion | None:
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


def champion_info(settings: Settings) -> ChampionInfo | None:
    """The model version holding the champion alias, with its data lineage; None if none."""
    client = mlflow_client(settings)
    version = champion_version(settings, client)
    if version is None:
        return None
    return ChampionInfo(version=int(version.version), run_id=version.run_id, **version_lineage(version, client))




@dataclass(frozen=True)
class ServingModel:
    name: str
    version: int
    run_id: str
    alias: str

    @property
    def uri(self) -> str:
        """The pinned model URI (the version, not the alias)."""
        return f"models:/{self.name}/{self.version}"

    @property
    def alias_uri(self) -> str:
        return f"models:/{self.name}@{self.alias}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "uri": self.uri}


def serving_model(settings: Settings) -> ServingModel:
    """The environment's champion, pinned; ``NoChampionError`` naming the model and how to get one."""
    missing = settings.missing_tracking_store()
    if missing is not None:  # a fresh or mistyped CD4ML_HOME: say so, create nothing
        raise NoChampionError(
            f"{settings.env} has no champion: there is no MLflow store at {missing} (CD4ML_HOME {settings.home}). "
            "Nothing was scored or served; train and promote one first (the cd4ml_train DAG; `make demo` does it "
            "on the sample)."
        )
    client = mlflow_client(settings)
    version = champion_version(settings, client)
    name, alias = settings.registry.model_name, settings.registry.champion_alias
    if version is None:
        raise NoChampionError(
            f"{settings.env} has no champion: {name}@{alias} does not exist in {settings.tracking_uri}. "
            "Nothing was scored or served; train and promote one first (the cd4ml_train DAG; `make demo` does it on the sample)."
        )
    return ServingModel(name=name, version=int(version.version), run_id=str(version.run_id or ""), alias=alias)
