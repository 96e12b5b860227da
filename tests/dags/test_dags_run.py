"""Whole DAGs under `airflow dags test` in a temporary AIRFLOW_HOME, on real digit images.

(Tuning and the colour photos: test_dags_run_variants.py, a file of its own so `make test`'s two processes share
the longest DAG runs.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.dags.conftest import alert_lines
from tests.dags.runs import cd4ml as _cd4ml
from tests.dags.runs import dag_test as _dag_test
from tests.dags.runs import status as _status

pytestmark = pytest.mark.airflow


def test_pipeline_end_to_end_and_idempotent(private_env):
    env = private_env
    _cd4ml(["sample-data", "--with-bad-files"], env)
    _dag_test("cd4ml_ingest", env, conf={"dataset_version_name": "digits-1"})
    out = _dag_test("cd4ml_curate", env)
    page = re.search(r"curation page: (\S+index\.html)", out)  # the task log links the curation's own page
    assert page and Path(page.group(1)).is_file(), out[-2000:]
    out = _dag_test("cd4ml_train", env)
    assert "drift: skipped" in out  # first run: no champion to compare against

    first = _status(env)
    tables = first["tables"]
    assert tables["raw_images"]["rows"] == 1797 and tables["rejects"]["rows"] == 2
    assert tables["raw_images"]["names"] == {"digits-1": tables["raw_images"]["version"]}
    assert 0.99 * 1797 <= tables["curated_images"]["rows"] <= 1797  # distinct digits are kept, not deduplicated away
    champions = [m for m in first["model_versions"] if "champion" in m["aliases"]]
    assert len(champions) == 1
    assert str(champions[0]["curated_version"]) == str(tables["curated_images"]["version"])

    # The whole chain again: no new rows, no new table versions, no duplicate model version.
    # This time training picks its data by the name the first ingest gave the raw version.
    _dag_test("cd4ml_ingest", env)
    _dag_test("cd4ml_curate", env)
    out = _dag_test("cd4ml_train", env, conf={"dataset_version": "digits-1"})
    assert "drift: skipped (0 new image(s) since the champion's training data" in out  # same data: nothing to test
    second = _status(env)
    for name, table in second["tables"].items():
        assert (table["version"], table["rows"]) == (tables[name]["version"], tables[name]["rows"]), name
    assert len(second["model_versions"]) == len(first["model_versions"])

    summary = _cd4ml(["summary"], env)
    assert "holds alias 'champion'" in summary

    # A manual run with a version that does not exist and a misspelt override stops in its first task,
    # naming both, before the drift check, tuning or training run.
    out = _dag_test("cd4ml_train", env, conf={"curated_version": 99, "training_overrides": {"epoch": 3}},
                    expect_rc=1)
    last = tables["curated_images"]["version"]
    assert f"curated_version=99: curated_images has versions 0..{last}" in out
    assert "training_overrides: invalid training overrides {'epoch': 3}" in out
    assert "drift:" not in out and "MLflow run:" not in out
    assert "up_for_retry" not in out  # nothing downstream fails in turn and waits out its retries


def test_an_empty_landing_fails_the_run_at_once_with_a_message_and_no_version(private_env, tmp_path):
    env = private_env
    (tmp_path / "empty").mkdir()
    out = _dag_test("cd4ml_ingest", env, conf={"source_uri": str(tmp_path / "empty")}, expect_rc=1)
    assert "holds no files: nothing to ingest, no new version" in out
    assert "up_for_retry" not in out  # a data error: a retry cannot help
    assert _status(env)["tables"]["raw_images"]["version"] is None


def test_a_failed_run_pages_once_in_prod_only_logs_in_sit_and_a_success_resolves(private_env, tmp_path, peers):
    """Validation fails on purpose (30 images a class): prod gets exactly one PagerDuty trigger, one
    Slack post and one email (the validate task's alert; the task- and DAG-level failure callbacks of
    the same run are de-duplicated), sit only the log line. A later good run resolves the incident."""
    from tests.peers import SECRETS, connection_env

    slack, pd, smtp = peers
    conns = connection_env(slack, pd, smtp.port)
    small = tmp_path / "small"
    _cd4ml(["sample-data", "--landing", str(small), "--limit", "30", "--with-bad-files"], private_env)
    outputs = []
    for env_name in ("sit", "prod"):
        env = {**private_env, **conns, "CD4ML_ENV": env_name, "CD4ML_HOME": str(tmp_path / env_name)}
        out = _dag_test("cd4ml_ingest", env, conf={"source_uri": str(small)}, expect_rc=1)
        outputs.append(out)
        assert "min_images_per_class(label=" in out  # one line per failed expectation
        [alert] = alert_lines(out)  # one alert line: the callbacks found the run's incident open
        assert (alert["kind"], alert["severity"], alert["env"]) == ("validation_failed", "critical", env_name)
        assert alert["task_id"] == "validate" and alert["error"].startswith("ValidationFailedError")
        assert alert["versions"]["raw_version"] == 0 and alert["details"]["report"].endswith(".json")
        assert out.count("already delivered and not resolved") == 2, out[-4000:]
        assert "Callback failed" not in out
        if env_name == "sit":
            assert (slack.posts, pd.posts, smtp.messages) == ([], [], [])  # sit: the log line only

    [trigger] = pd.pd_events()
    assert trigger.body["event_action"] == "trigger" and trigger.body["payload"]["class"] == "validation_failed"
    assert trigger.body["dedup_key"].startswith("prod:cd4ml_ingest:")
    [post] = slack.slack_posts()
    assert "validation_failed" in post.body["text"] and "/dags/cd4ml_ingest/runs/" in post.body["text"]
    [mail] = smtp.messages
    assert "validation_failed" in mail["Subject"]

    # The data owner fixes the delivery; the next run of the same DAG in prod succeeds and resolves.
    good = tmp_path / "good"
    _cd4ml(["sample-data", "--landing", str(good)], private_env)
    env = {**private_env, **conns, "CD4ML_ENV": "prod", "CD4ML_HOME": str(tmp_path / "prod")}
    outputs.append(_dag_test("cd4ml_ingest", env, conf={"source_uri": str(good)}))
    assert [e.body["event_action"] for e in pd.pd_events()] == ["trigger", "resolve"]
    assert pd.pd_events()[1].body["dedup_key"] == trigger.body["dedup_key"]
    assert len(slack.slack_posts()) == 2 and slack.slack_posts()[1].body["text"].startswith("*RESOLVED [prod]")
    assert len(smtp.messages) == 1

    # No planted secret in anything the runs printed or wrote (task logs, reports, tables, ledger).
    written = [p.read_bytes() for root in (tmp_path / "sit", tmp_path / "prod", Path(private_env["AIRFLOW_HOME"]))
               for p in root.rglob("*") if p.is_file()]
    for secret in SECRETS:
        assert not any(secret in out for out in outputs), secret
        assert not any(secret.encode() in blob for blob in written), secret
