"""Shared fixtures: a private CD4ML_HOME per test, real digit images, an ingested raw table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("FASTDUP_PRODUCTION", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")


@pytest.fixture
def cd4ml_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cd4ml"
    monkeypatch.setenv("CD4ML_HOME", str(home))
    monkeypatch.setenv("CD4ML_ENV", "sit")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture
def settings(cd4ml_home: Path):
    from tasks.settings import load_settings

    return load_settings()


@pytest.fixture(scope="session")
def digits_landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All 1,797 real digits as PNGs, written once per test session (read-only for tests)."""
    from tasks.data.sample_data import write_digits

    landing = tmp_path_factory.mktemp("landing")
    write_digits(landing)
    return landing


@pytest.fixture
def raw_digits(settings, digits_landing: Path):
    """The digits ingested into this test's raw table; returns the IngestResult."""
    from tasks.data.ingest import ingest_landing

    return ingest_landing(settings, run_id="fixture-ingest", logical_date="2026-11-21", landing=digits_landing)


@pytest.fixture(scope="session")
def champion(tmp_path_factory: pytest.TempPathFactory):
    """(settings, ServingModel): a private home whose champion is a real model (tests/factories/champion.py)."""
    from tests.factories.champion import champion_home

    return champion_home(str(tmp_path_factory.mktemp("champion-home")))


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory):
    """moto's standalone server (SQS- and S3-compatible) as a real HTTP server process; yields its endpoint URL."""
    from tests.factories.moto_server import moto_server

    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint
