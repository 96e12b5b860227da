"""Which model serves in an environment: the champion alias, pinned to its version for one run.

A scoring run, the REST server and the monitor resolve ``models:/<name>@champion`` once, at the
start, to ``models:/<name>/<version>``: the alias can move while a long batch runs, and every
prediction must name the version that made it. No champion is a ``NoChampionError`` (a
``DataError``: retrying cannot help) raised before any work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tasks.release.release import NoChampionError
from tasks.settings import Settings


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
    from tasks.release.registry import champion_model_version, mlflow_client

    missing = settings.missing_tracking_store()
    if missing is not None:  # a fresh or mistyped CD4ML_HOME: say so, create nothing
        raise NoChampionError(
            f"{settings.env} has no champion: there is no MLflow store at {missing} (CD4ML_HOME {settings.home}). "
            "Nothing was scored or served; train and promote one first (the cd4ml_train DAG; `make demo` does it "
            "on the sample)."
        )
    client = mlflow_client(settings)
    version = champion_model_version(settings, client)
    name, alias = settings.registry.model_name, settings.registry.champion_alias
    if version is None:
        raise NoChampionError(
            f"{settings.env} has no champion: {name}@{alias} does not exist in {settings.tracking_uri}. "
            "Nothing was scored or served; train and promote one first (the cd4ml_train DAG; `make demo` does it on the sample)."
        )
    return ServingModel(name=name, version=int(version.version), run_id=str(version.run_id or ""), alias=alias)
