"""The Assets that chain the cd4ml DAGs. Their URIs are the real storage locations.

The environment is part of every name, so sit, uat and prod DAGs never trigger each other.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Asset

from cd4ml_airflow.config import SETTINGS as _settings


def _as_uri(location: str) -> str:
    return location if "://" in location else Path(location).resolve().as_uri()


RAW_IMAGES = Asset(name=f"cd4ml_{_settings.env}_raw_images", uri=_as_uri(_settings.raw_table))
"""A raw_images version that passed validation (extra: raw_table, raw_version)."""

CURATED_IMAGES = Asset(name=f"cd4ml_{_settings.env}_curated_images", uri=_as_uri(_settings.curated_table))
"""A curated, split dataset version (extra: curated_table, curated_version, raw_version)."""

def champion_asset(settings) -> Asset:
    """The champion alias of one environment's registered model as an Asset."""
    return Asset(
        name=f"cd4ml_{settings.env}_champion_model",
        uri=f"mlflow-models://{settings.registry.model_name}/{settings.registry.champion_alias}",
    )


CHAMPION_MODEL = champion_asset(_settings)
"""The registered model version holding the champion alias (extra: model_name, version)."""


def _upstream_champion() -> Asset | None:
    from cd4ml_airflow.champion_queue import upstream_event_asset

    watched = upstream_event_asset(_settings)
    if watched is not None or not _settings.release.upstream:
        return watched
    from tasks.settings import load_settings

    return champion_asset(load_settings(_settings.release.upstream))


UPSTREAM_CHAMPION = _upstream_champion()
"""deploy_model: the champion of the environment below this one (release.upstream), or None.

With ``release.upstream_event`` (separate deployments) it is the Asset watching the hop's queue:
the upstream announces each new champion there (cd4ml_airflow.champion_queue). Without it, the
upstream's champion Asset itself, which this deployment sees when it hosts both environments."""

PREDICTIONS = Asset(name=f"cd4ml_{_settings.env}_predictions", uri=_as_uri(_settings.predictions_table))
"""A scoring run's new predictions (extra: model_name, model_version, scored, quarantined, versions)."""

RETRAIN_REQUEST = Asset(
    name=f"cd4ml_{_settings.env}_retrain_request",
    uri=f"cd4ml-retrain://{_settings.env}/{_settings.registry.model_name}",
)
"""The monitor found the champion degraded and exported the labelled live images to the landing zone
(extra: model_version, breached, exported, dashboard): cd4ml_ingest runs on it, curate and train follow."""
