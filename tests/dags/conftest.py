"""Airflow-facing tests get a private AIRFLOW_HOME and CD4ML_HOME, set before Airflow is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"
_home = Path(tempfile.mkdtemp(prefix="cd4ml-airflow-tests-"))

AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(_home / "airflow"),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "CD4ML_HOME": str(_home / "cd4ml"),
    "CD4ML_ENV": "sit",
    "FASTDUP_PRODUCTION": "1",
    "GIT_PYTHON_REFRESH": "quiet",
}
os.environ.update(AIRFLOW_ENV)
os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session")
def airflow_env() -> dict[str, str]:
    return dict(os.environ)


def run_airflow(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    airflow = Path(sys.executable).parent / "airflow"
    return subprocess.run([str(airflow), *args], env=env, capture_output=True, text=True, timeout=timeout)
