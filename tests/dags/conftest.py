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


def _merged(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def edited_conf(target: Path, everywhere: dict, per_file: dict[str, dict] | None = None) -> Path:
    """A copy of the repo's conf/ in ``target`` with overrides merged in (all files, then per file name).

    Overrides are nested mappings merged key by key into each file's own overrides: the defaults live
    in code (tasks/settings.py), so a key need not be in a file to be changed.
    """
    import yaml

    from tasks.settings import REPO_ROOT

    target.mkdir(parents=True)
    for name in ("base.yaml", "sit.yaml", "uat.yaml", "prod.yaml"):
        data = yaml.safe_load((REPO_ROOT / "conf" / name).read_text()) or {}
        data = _merged(_merged(data, everywhere), (per_file or {}).get(name, {}))
        (target / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return target
