"""The Slack, PagerDuty and SMTP channels through Airflow's provider notifiers, against real local peers.

No channel is mocked: the providers' own clients (slack_sdk, the pagerduty package over HTTPS,
smtplib) open sockets to an HTTP recorder, an HTTPS recorder and an aiosmtpd server with AUTH,
reached through ``AIRFLOW_CONN_*`` connections that point at them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from cd4ml_airflow.channels import install
from tasks.alerting.alert import Alert
from tasks.alerting.delivery import resolve, send
from tests.peers import (
    FAILURE_KINDS,
    PD_ROUTING_KEY,
    SECRETS,
    SLACK_TOKEN,
    SMTP_PASSWORD,
    SMTP_USER,
    HttpRecorder,
    SmtpPeer,
    body_text,
    connection_env,
    failing_connections,
)


@pytest.fixture(autouse=True)
def _channels_installed():
    """The plugin package installs its channels when imported; this module must not depend on
    another test module having imported it first."""
    install()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    @property
    def text(self) -> str:
        return "\n".join(r.getMessage() for r in self.records)


@pytest.fixture
def alert_log():
    """What the cd4ml.alerts logger said, captured on the logger itself (Airflow's first import
    reconfigures the root logger's handlers, which would lose records for caplog)."""
    handler, logger = _Records(), logging.getLogger("cd4ml.alerts")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture
def peers(tmp_path, monkeypatch):
    slack, pd, smtp = HttpRecorder().start(), HttpRecorder(tls_dir=tmp_path / "tls").start(), SmtpPeer().start()
    for key, value in connection_env(slack, pd, smtp.port).items():
        monkeypatch.setenv(key, value)
    yield slack, pd, smtp
    slack.stop(), pd.stop(), smtp.stop()


def _fast(settings):
    """The environment's routing with quick retries (the back-off itself is what is tested)."""
    from tasks.settings import AlertRetrySettings

    retry = AlertRetrySettings(attempts=3, backoff_s=0.05, max_backoff_s=0.2, timeout_s=1)
    return settings.model_copy(update={"alerts": settings.alerts.model_copy(update={"retry": retry})})


def _settings(env: str):
    from tasks.settings import load_settings

    return _fast(load_settings(env))


def _alert(env="prod", severity="critical", run_id="manual__2026-11-21", kind="task_failed"):
    return Alert(summary="cd4ml_train failed in task train", severity=severity, source="dag:cd4ml_train/task:train",
                 env=env, dedup_key=f"{env}:cd4ml_train:{run_id}", kind=kind, dag_id="cd4ml_train", task_id="train",
                 run_id=run_id, log_url=f"http://airflow.example:8080/dags/cd4ml_train/runs/{run_id}/tasks/train",
                 error="RuntimeError: CUDA out of memory", versions={"curated_version": 7, "model_version": 3})


def _by_channel(deliveries) -> dict:
    return {d.channel: d for d in deliveries}


def test_prod_critical_reaches_pagerduty_slack_and_email_with_its_content(cd4ml_home, peers):
    slack, pd, smtp = peers
    delivered = _by_channel(send(_alert(), _settings("prod")))
    assert all(d.ok and d.attempts == 1 for d in delivered.values()) and set(delivered) == {
        "log", "pagerduty", "slack", "email"}

    [event] = pd.pd_events()
    assert event.body["routing_key"] == PD_ROUTING_KEY and event.body["event_action"] == "trigger"
    assert event.body["dedup_key"] == "prod:cd4ml_train:manual__2026-11-21"
    payload = event.body["payload"]
    assert payload["severity"] == "critical" and payload["class"] == "task_failed"
    assert payload["summary"].startswith("[prod] CRITICAL task_failed: cd4ml_train failed in task train")
    assert payload["custom_details"]["Task"] == "train" and payload["custom_details"]["Run"] == "manual__2026-11-21"
    assert payload["custom_details"]["Error"] == "RuntimeError: CUDA out of memory"
    assert payload["custom_details"]["Versions"] == "curated_version=7, model_version=3"
    assert {"href": "http://airflow.example:8080/dags/cd4ml_train/runs/manual__2026-11-21/tasks/train",
            "text": "Task log"} in event.body["links"]

    [post] = slack.slack_posts()
    text = post.body["text"]
    for needle in ("*[prod] CRITICAL task_failed", "*DAG:* cd4ml_train", "*Task:* train", "*Run:* manual__2026-11-21",
                   "*Error:* RuntimeError: CUDA out of memory", "|Task log>", "docs/runbooks/task_failed.md|Runbook"):
        assert needle in text, needle

    [mail] = smtp.messages
    assert smtp.logins == [SMTP_USER]  # authenticated with the connection's password
    assert mail["To"] == "ml-oncall@example.com" and mail["Subject"].startswith("[prod] CRITICAL task_failed")
    body = body_text(mail)
    assert "RuntimeError: CUDA out of memory" in body and "docs/runbooks/task_failed.md" in body


@pytest.mark.parametrize("env,severity,expect", [
    ("sit", "critical", set()),
    ("uat", "warning", {"slack"}),
    ("uat", "critical", {"slack"}),
    ("prod", "info", set()),
    ("prod", "warning", {"slack", "email"}),
    ("prod", "critical", {"pagerduty", "slack", "email"}),
])
def test_routing_per_environment_and_severity_reaches_exactly_those_peers(cd4ml_home, peers, env, severity, expect):
    slack, pd, smtp = peers
    send(_alert(env=env, severity=severity), _settings(env))
    reached = {name for name, hits in (("slack", slack.slack_posts()), ("pagerduty", pd.pd_events()),
                                       ("email", smtp.messages)) if hits}
    assert reached == expect


def test_one_incident_per_failing_run_and_a_later_success_resolves_it(cd4ml_home, peers):
    slack, pd, smtp = peers
    settings = _settings("prod")
    send(_alert(), settings)  # the task's failure callback
    send(_alert(), settings)  # the DAG run's failure callback: same run, same key
    send(_alert(run_id="scheduled__2026-11-22"), settings)  # the next day's run failed too: a second incident
    assert [e.body["event_action"] for e in pd.pd_events()] == ["trigger", "trigger"]
    assert len(slack.slack_posts()) == 2 and len(smtp.messages) == 2

    resolve(settings, "cd4ml_train", "scheduled__2026-11-23")
    resolve(settings, "cd4ml_train", "scheduled__2026-11-24")  # nothing open any more: nothing sent
    resolves = [e.body for e in pd.pd_events() if e.body["event_action"] == "resolve"]
    assert sorted(r["dedup_key"] for r in resolves) == ["prod:cd4ml_train:manual__2026-11-21",
                                                        "prod:cd4ml_train:scheduled__2026-11-22"]
    resolved_posts = [p.body["text"] for p in slack.slack_posts()[2:]]
    assert len(resolved_posts) == 2 and all(t.startswith("*RESOLVED [prod]") for t in resolved_posts)
    assert all("run scheduled__2026-11-23 of cd4ml_train succeeded" in t for t in resolved_posts)
    assert len(smtp.messages) == 2  # no email for a resolve


def _failure_case(peers, case: str, monkeypatch) -> str:
    """Break one peer the way it breaks in production; return the channel that must fail."""
    slack, pd, smtp = peers
    if case == "slack answers 500":
        slack.fail["/slack"] = 500
        return "slack"
    if case == "slack times out":
        slack.fail["/slack"] = "hang"
        return "slack"
    if case == "pagerduty is down":
        pd.stop()  # connection refused
        return "pagerduty"
    if case == "smtp rejects the password":
        for key, value in connection_env(slack, pd, smtp.port, password="wrong-password-0000").items():
            monkeypatch.setenv(key, value)
        return "email"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["slack answers 500", "slack times out", "pagerduty is down",
                                  "smtp rejects the password"])
def test_a_failing_channel_never_raises_and_the_others_still_fire(cd4ml_home, peers, monkeypatch, alert_log, case):
    slack, pd, smtp = peers
    broken = _failure_case(peers, case, monkeypatch)
    delivered = _by_channel(send(_alert(), _settings("prod")))
    assert not delivered[broken].ok and delivered[broken].attempts == 3  # retried with back-off
    assert all(d.ok for name, d in delivered.items() if name != broken)
    hits = {"slack": slack.slack_posts(), "pagerduty": pd.pd_events(), "email": smtp.messages}
    assert {name for name, got in hits.items() if got} == {"slack", "pagerduty", "email"} - {broken}
    assert f"NOT delivered to {broken} after 3 attempts" in alert_log.text
    assert "retrying in 0.1 s" in alert_log.text  # back-off doubles: 0.05, 0.1
    assert not any(secret in alert_log.text for secret in SECRETS)


def test_a_channel_that_recovers_delivers_once(cd4ml_home, peers):
    slack, _, _ = peers
    slack.fail["/slack"] = (500, 2)  # two failures, then the peer is back
    delivered = _by_channel(send(_alert(), _settings("prod")))
    assert delivered["slack"].ok and delivered["slack"].attempts == 3
    assert len(slack.slack_posts()) == 1


def test_a_missing_connection_is_reported_not_retried(cd4ml_home, peers, monkeypatch, alert_log):
    slack, pd, smtp = peers
    monkeypatch.delenv("AIRFLOW_CONN_CD4ML_PAGERDUTY")
    delivered = _by_channel(send(_alert(), _settings("prod")))
    assert not delivered["pagerduty"].ok and delivered["pagerduty"].attempts == 1
    assert "Airflow connection 'cd4ml_pagerduty' is not defined" in alert_log.text
    assert delivered["slack"].ok and delivered["email"].ok


def test_planted_secrets_never_reach_a_log_or_a_report(cd4ml_home, peers, monkeypatch, capfd, caplog, alert_log):
    slack, pd, smtp = peers
    settings = _settings("prod")
    root = _Records()
    logging.getLogger().addHandler(root)  # every logger that propagates, the providers' included
    try:
        with caplog.at_level(logging.DEBUG):
            send(_alert(), settings)  # every channel delivers
            slack.fail["/slack"] = 500  # every channel fails, each its own way
            pd.stop()
            for key, value in connection_env(slack, pd, smtp.port, password="another-wrong-secret").items():
                monkeypatch.setenv(key, value)
            send(_alert(run_id="r2"), settings)
            resolve(settings, "cd4ml_train", "r3")
    finally:
        logging.getLogger().removeHandler(root)
    assert "NOT delivered to email" in alert_log.text and "NOT delivered to slack" in alert_log.text
    written = [p.read_bytes() for p in Path(cd4ml_home).rglob("*") if p.is_file()]
    assert written  # the alert ledger is there to be searched
    out, err = capfd.readouterr()
    for secret in (*SECRETS, "another-wrong-secret"):
        assert secret not in caplog.text and secret not in out + err, secret
        assert secret not in alert_log.text and secret not in root.text, secret
        assert not any(secret.encode() in blob for blob in written), secret


@contextmanager
def _every_record() -> Iterator[list[logging.LogRecord]]:
    """Every log record any logger creates, all loggers at DEBUG (their own levels, propagation and
    handlers do not matter: the records are taken where they are made)."""
    records: list[logging.LogRecord] = []
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        records.append(record)
        return record

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    saved = [(lg, lg.level, lg.disabled) for lg in loggers]
    disabled = logging.root.manager.disable
    logging.setLogRecordFactory(factory)
    logging.disable(logging.NOTSET)
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        lg.disabled = False
    try:
        yield records
    finally:
        logging.setLogRecordFactory(previous)
        logging.disable(disabled)
        for lg, level, was_disabled in saved:
            lg.setLevel(level)
            lg.disabled = was_disabled


def _record_text(records: list[logging.LogRecord]) -> str:
    """What any handler could print: message, traceback and stack of every record."""
    formatter = logging.Formatter("%(name)s %(message)s")
    return "\n".join(formatter.format(r) + " " + (r.stack_info or "") for r in records)


@pytest.mark.parametrize("kind", FAILURE_KINDS)
def test_planted_secrets_appear_in_no_record_output_or_file_under_each_failure_kind(
        cd4ml_home, tmp_path, monkeypatch, capfd, kind):
    """The issue's finding: slack_sdk logged the whole webhook URL (token included) on a refused port."""
    settings = _settings("prod")
    with ExitStack() as stack:
        for key, value in failing_connections(kind, tmp_path / "tls", stack).items():
            monkeypatch.setenv(key, value)
        with _every_record() as records:
            delivered = _by_channel(send(_alert(), settings))
            resolve(settings, "cd4ml_train", "r2")
    assert not any(delivered[name].ok for name in ("slack", "pagerduty", "email")), delivered
    assert all(delivered[name].attempts == 3 for name in ("slack", "pagerduty", "email"))
    logged = _record_text(records)
    assert "NOT delivered to slack" in logged  # the capture saw the delivery's own lines
    out, err = capfd.readouterr()
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    for secret in SECRETS:
        assert secret not in logged, (secret, [r.name for r in records if secret in _record_text([r])])
        assert secret not in out + err, secret
        assert not any(secret.encode() in blob for blob in written), secret
        assert secret not in " ".join(d.error for d in delivered.values()), secret


def test_the_secrets_a_channel_reads_are_registered_with_airflows_masker(cd4ml_home, peers):
    """Task logs go through Airflow's secrets masker: each secret is known to it once it was read."""
    from airflow.sdk._shared.secrets_masker import redact as airflow_redact

    send(_alert(), _settings("prod"))
    for secret in SECRETS:
        assert airflow_redact(f"url: https://hooks.example/{secret}/x") == "url: https://hooks.example/***/x", secret


def test_a_read_secret_is_cut_from_any_standard_logger_even_one_made_later(cd4ml_home, peers):
    """urllib3, httpx and the pagerduty package log through standard loggers of their own; the
    secrets a channel read are cut from every record, whatever logger, level or handler."""
    send(_alert(), _settings("prod"))  # reads the three connections
    with _every_record() as records:
        logging.getLogger("urllib3.connectionpool").debug("https://127.0.0.1:1 \"POST /slack/%s HTTP/1.1\"", SLACK_TOKEN)
        logging.getLogger("pagerduty.api_client.made_after").warning("body: {'routing_key': '%s'}", PD_ROUTING_KEY)
        try:
            raise ConnectionError(f"AUTH {SMTP_USER} {SMTP_PASSWORD} refused")
        except ConnectionError:
            logging.getLogger("smtplib").exception("login failed")
    text = _record_text(records)
    assert "POST /slack/*** HTTP/1.1" in text and "'routing_key': '***'" in text and "login failed" in text
    assert not any(secret in text for secret in SECRETS)
