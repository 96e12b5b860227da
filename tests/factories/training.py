"""Training settings fit for a test on 2 cores, and a private CD4ML_HOME per test module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest


def fast(settings: Any, **training: Any) -> Any:
    """Settings with a few epochs on one thread (tests must be quick on a 2-core machine)."""
    updates = {"epochs": 4, "num_threads": 1, **training}
    return settings.model_copy(update={"training": settings.training.model_copy(update=updates)})


def with_model_name(settings: Any, suffix: str) -> Any:
    """A private registered model per test, so aliases set by one test never reach another."""
    registry = settings.registry.model_copy(update={"model_name": f"{settings.registry.model_name}-{suffix}"})
    return settings.model_copy(update={"registry": registry})


@contextlib.contextmanager
def private_home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Any]:
    """A CD4ML_HOME shared by one test module (one MLflow database to create, not one per test)."""
    from tasks.settings import load_settings

    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp(name)
        mp.setenv("CD4ML_HOME", str(home))
        mp.setenv("CD4ML_ENV", "sit")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield load_settings()


def runs_in_experiment(settings: Any) -> list[Any]:
    from tasks.models.registry import ensure_experiment, mlflow_client

    client = mlflow_client(settings)
    return client.search_runs([ensure_experiment(settings, client)], max_results=1000)
