"""cd4ml_promote's and cd4ml_reconcile's Airflow side: the upstream account from an Airflow Connection."""

from __future__ import annotations

import json

from cd4ml_airflow.steps.promote import upstream_credentials
from cd4ml_airflow.steps.reconcile import import_needed


def _cross_registry(settings, uri: str | None):
    registry = settings.release.upstream_registry.model_copy(update={"tracking_uri": uri})
    return settings.model_copy(update={"release": settings.release.model_copy(update={"upstream_registry": registry})})


def test_the_upstream_account_comes_from_the_named_connection_and_only_for_another_registry(settings, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY",
                       json.dumps({"conn_type": "http", "login": "cd4ml-reader", "password": "reader-secret"}))
    remote = _cross_registry(settings, "https://mlflow.sit.example")
    assert upstream_credentials(remote) == ("cd4ml-reader", "reader-secret")
    assert upstream_credentials(_cross_registry(settings, None)) is None  # the shared registry: the process's own
    monkeypatch.delenv("AIRFLOW_CONN_CD4ML_UPSTREAM_REGISTRY")
    assert upstream_credentials(remote) is None  # no Connection: no account sent (the registry answers 401 if it needs one)


def test_the_reconcile_goes_on_only_for_an_upstream_champion_without_a_gated_import(capsys):
    assert import_needed.function({"source_version": 4}) is True
    assert "v4 has no gated import here" in capsys.readouterr().out
    assert import_needed.function({"source_version": None}) is False
