"""MLflow tracking and registry, and an Optuna study, on the PostgreSQL server of this machine.

Production points MLFLOW_TRACKING_URI and CD4ML_OPTUNA_STORAGE at PostgreSQL; SQLite is only the
local default. Each test gets throwaway databases (created and dropped here); the module skips,
saying why, only when no server answers at 127.0.0.1:5432.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.factories.digits import write_curated_digits
from tests.factories.training import fast, private_home

HOST, PORT, USER = "127.0.0.1", 5432, "postgres"


def _connect(dbname: str = "postgres"):
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        conn = psycopg2.connect(host=HOST, port=PORT, user=USER, dbname=dbname, connect_timeout=3)
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL at {HOST}:{PORT} is unreachable ({str(exc).strip()}); start it to run these tests")
    conn.autocommit = True
    return conn


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    """Two fresh databases (MLflow and Optuna both keep an alembic_version table), dropped afterwards."""
    conn = _connect()
    suffix = uuid.uuid4().hex[:10]
    names = {"mlflow": f"mlflow_test_{suffix}", "optuna": f"optuna_test_{suffix}"}
    with conn.cursor() as cur:
        for name in names.values():
            cur.execute(f'CREATE DATABASE "{name}"')
    try:
        # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the pinned driver is psycopg2.
        yield {kind: f"postgresql+psycopg2://{USER}@{HOST}:{PORT}/{name}" for kind, name in names.items()}
    finally:
        with conn.cursor() as cur:
            for name in names.values():
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def test_train_evaluate_and_register_with_a_postgresql_tracking_store(
    databases: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    import mlflow
    import pandas as pd

    from tasks.models.champion import champion_info
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import promote
    from tasks.training.train import train
    from tests.factories.digits import split_rows

    with private_home(tmp_path_factory, "pg-home") as base, pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", databases["mlflow"])
        settings = fast(base, epochs=2)
        assert settings.tracking_uri.startswith("postgresql")
        version = write_curated_digits(settings.curated_table, raw_version=8)
        result = train(settings, settings.curated_table, version, "manual__pg", "2026-11-21")
        assert result.metrics["best_val_accuracy"] > 0.8
        again = train(settings, settings.curated_table, version, "manual__pg_retry", "2026-11-21")
        assert again.reused and again.mlflow_run_id == result.mlflow_run_id  # the reuse search runs in SQL too

        registered = register_candidate(settings, result.mlflow_run_id)
        assert registered == 1
        gate = evaluate(settings, registered, settings.curated_table, version)
        assert gate.passed, gate.reasons
        assert promote(settings, registered, gate, run_id="manual__pg", actor="tests").changed
        info = champion_info(settings)
        assert info is not None and info.run_id == result.mlflow_run_id and info.curated_version == version

        model = mlflow.pyfunc.load_model(f"models:/{settings.registry.model_name}@champion")
        test = split_rows("test")[:20]
        labels = model.predict(pd.DataFrame({"image": [r["image"] for r in test]}))["label"].tolist()
        assert sum(p == r["label"] for p, r in zip(labels, test)) >= 15

    conn = _connect(databases["mlflow"].rsplit("/", 1)[1])
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs WHERE run_uuid = %s AND status = 'FINISHED'", (result.mlflow_run_id,))
        assert cur.fetchone()[0] == 1
        cur.execute("SELECT count(*) FROM model_versions")
        assert cur.fetchone()[0] == 1
    conn.close()


def test_an_optuna_study_with_trials_lives_in_postgresql(
    databases: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    import optuna

    from tasks.training.tune import STORAGE_ENV, create_study, resolve_storage_uri, run_trial

    with private_home(tmp_path_factory, "pg-tune-home") as base, pytest.MonkeyPatch.context() as mp:
        mp.setenv(STORAGE_ENV, databases["optuna"])
        tuning = base.tuning.model_copy(update={"epochs_per_trial": 1, "pruner": "none"})
        settings = fast(base).model_copy(update={"tuning": tuning})
        assert resolve_storage_uri(settings) == databases["optuna"]
        version = write_curated_digits(settings.curated_table, raw_version=8, limit=300)
        study = create_study(settings, "pg-study", curated_table=settings.curated_table, curated_version=version)
        results = [run_trial(settings, "pg-study", i, settings.curated_table, version, study.parent_run_id) for i in range(2)]
        assert [r.state for r in results] == ["COMPLETE", "COMPLETE"]
        stored = optuna.load_study(study_name="pg-study", storage=databases["optuna"])
        assert [t.state.name for t in stored.trials] == ["COMPLETE", "COMPLETE"]
        assert stored.trials[0].params != stored.trials[1].params  # each worker samples with its own seed
