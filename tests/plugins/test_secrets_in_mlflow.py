"""Planted channel secrets reach no MLflow artifact, param, tag or metric name, under each failure kind.

The Slack webhook token, the PagerDuty routing key and the SMTP password are planted as Airflow
Connections (``AIRFLOW_CONN_*``, tests/peers.py) before anything is trained, so every step below
runs in a process that can read them. The steps are the ones that write to MLflow and whose
output could carry alert text or a settings dump: the training run (its params are the training
settings; its model files), the gate (its report is logged to the candidate's run), and the
monitor (a run with metrics, the dashboard and metrics.json, then a ``model_degraded`` alert;
run again, it logs into the same run). The monitor runs once under each failure kind of the
channels (refused connection, timeout, HTTP 500, untrusted TLS), after the previous incident was
resolved so that each run alerts again. Then every file under the artifact root and the tracking
database, and every experiment, run, param, tag, metric name and registry tag as MLflow reports
them, are searched for each secret, plain and percent-encoded.
"""

from __future__ import annotations

import urllib.parse
from contextlib import ExitStack
from pathlib import Path

import pytest

from cd4ml_airflow.channels import install
from tests.factories.digits import split_rows
from tests.peers import FAILURE_KINDS, SECRETS, connection_env, failing_connections

DAY = "2026-11-12"


def _forms(secret: str) -> set[str]:
    """A secret as it could be written: plain, percent-encoded (path or query style), form-encoded."""
    return {secret, urllib.parse.quote(secret), urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}


def _mlflow_texts(settings) -> list[tuple[str, str]]:
    """(where, text) of everything MLflow reports about every run and model version of the store."""
    from mlflow import MlflowClient

    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    texts: list[tuple[str, str]] = []
    for experiment in client.search_experiments():
        texts.append((f"experiment {experiment.name}", f"{experiment.name} {experiment.tags}"))
        for run in client.search_runs([experiment.experiment_id], max_results=1000):
            where = f"run {run.info.run_id}"
            texts += [(f"{where} param {k}", f"{k}={v}") for k, v in run.data.params.items()]
            texts += [(f"{where} tag {k}", f"{k}={v}") for k, v in run.data.tags.items()]
            texts += [(f"{where} metric {k}", k) for k in run.data.metrics]
            texts.append((f"{where} name", run.info.run_name or ""))
    for model in client.search_registered_models():
        texts.append((f"model {model.name}", f"{model.name} {model.tags} {model.description}"))
        for version in client.search_model_versions(f"name='{model.name}'"):
            texts.append((f"model {model.name} v{version.version}", f"{version.tags} {version.description}"))
    return texts


def leaks(settings, home: Path, secrets: tuple[str, ...]) -> list[str]:
    """Where any form of any secret appears: files under the home (artifact root, tracking database,
    reports) and what MLflow reports. Empty when nothing leaked."""
    found = []
    files = [p for p in home.rglob("*") if p.is_file()]
    for secret in secrets:
        forms = _forms(secret)
        found += [f"{p}" for p in files if any(f.encode() in p.read_bytes() for f in forms)]
        found += [where for where, text in _mlflow_texts(settings) if any(f in text for f in forms)]
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A champion trained, registered, gated and promoted with the secrets planted as Connections; a scored
    batch with half its digits upside down and their true labels, so that every monitor run breaches."""
    from tasks.serving.feedback import load_feedback
    from tasks.serving.score import score
    from tasks.settings import load_settings
    from tests.factories.champion import champion_home
    from tests.factories.monitoring import feedback_csv, write_batch

    install()
    root = tmp_path_factory.mktemp("secrets-mlflow")
    with pytest.MonkeyPatch.context() as mp, ExitStack() as stack:
        for key, value in failing_connections("connection refused", root / "tls", stack).items():
            mp.setenv(key, value)
        settings, model = champion_home(str(root / "home"))
        prod = load_settings("prod")
    retry = prod.alerts.retry.model_copy(update={"attempts": 2, "backoff_s": 0.05, "max_backoff_s": 0.1, "timeout_s": 1})
    settings = settings.model_copy(update={
        "alerts": prod.alerts.model_copy(update={"retry": retry}),  # critical: PagerDuty, Slack and email
        "storage": settings.storage.model_copy(update={"feedback_uri": str(root / "feedback")}),
        "monitoring": settings.monitoring.model_copy(update={
            "window_days": 1, "retrain_on_breach": False, "max_explanations": 2, "severity": "critical"}),
    })
    truth = write_batch(root / "scans", split_rows("test")[:150], flip_every=2)
    score(settings, str(root / "scans"), run_id="score-day", logical_date=DAY)
    load_feedback(settings, [str(feedback_csv(root / "feedback" / "day.csv", truth))], run_id="fb", logical_date=DAY)
    return settings, model, root


def test_a_leak_would_be_found(world, monkeypatch):
    """The search is not blind: a canary logged as a param, percent-encoded, is found."""
    from mlflow import MlflowClient

    settings, model, root = world
    canary = "canary/Secret!value"
    client = MlflowClient(settings.tracking_uri, settings.tracking_uri)
    run = client.create_run(client.get_experiment_by_name(settings.tracking.experiment).experiment_id)
    client.log_param(run.info.run_id, "webhook", urllib.parse.quote(canary, safe=""))
    assert any(run.info.run_id in where for where in leaks(settings, root / "home", (canary,)))
    client.delete_run(run.info.run_id)


@pytest.mark.parametrize("kind", FAILURE_KINDS)
def test_no_planted_secret_reaches_mlflow_under_each_failure_kind(world, monkeypatch, kind):
    from tasks.alerting import delivery, incidents
    from tasks.models.champion import champion_info
    from tasks.monitoring.monitor import monitor
    from tasks.release.evaluate import evaluate

    settings, model, root = world
    with ExitStack() as stack:
        for key, value in failing_connections(kind, root / f"tls-{kind}", stack).items():
            monkeypatch.setenv(key, value)
        for incident in incidents.open_incidents(settings, kinds=frozenset({"model_degraded"})):
            delivery.resolve_incident(settings, incident, "tests", "so that the next breach alerts again")
        result = monitor(settings, run_id=f"mon-{kind}", logical_date=DAY)
        if kind == FAILURE_KINDS[0]:  # the gate once: its report is logged to the candidate's run
            evaluate(settings, model.version, settings.curated_table, champion_info(settings).curated_version)
    assert result.breached and result.alerted, (result.breached, result.alerted)  # the alert was sent, and failed
    searched = {p.as_posix() for p in (root / "home").rglob("*") if p.is_file()}
    for logged in ("/monitoring/metrics.json", f"/gate/{settings.env}/", "/runtime/", "mlflow.db"):
        assert any(logged in path for path in searched), logged  # the search covers what was logged
    assert leaks(settings, root / "home", SECRETS) == []


def test_working_channels_leak_nothing_either(world, monkeypatch, tmp_path):
    """The same search after the channels delivered (the secrets were used, not only read)."""
    from tasks.alerting import delivery, incidents
    from tasks.monitoring.monitor import monitor
    from tests.peers import HttpRecorder, SmtpPeer

    settings, _, root = world
    slack, pd, smtp = HttpRecorder().start(), HttpRecorder(tls_dir=tmp_path / "tls").start(), SmtpPeer().start()
    try:
        for key, value in connection_env(slack, pd, smtp.port).items():
            monkeypatch.setenv(key, value)
        for incident in incidents.open_incidents(settings, kinds=frozenset({"model_degraded"})):
            delivery.resolve_incident(settings, incident, "tests", "so that the next breach alerts again")
        assert monitor(settings, run_id="mon-delivered", logical_date=DAY).alerted
        assert slack.slack_posts() and pd.pd_events() and smtp.messages
    finally:
        slack.stop(), pd.stop(), smtp.stop()
    assert leaks(settings, root / "home", SECRETS) == []
