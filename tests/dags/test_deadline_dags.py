"""A deadline that passes fires its alert: real scheduler (checks deadlines), triggerer (runs the
callback), DAG processor and API server, with the DAG's deadline shortened in its settings."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.dags.airflow_services import start_airflow, wait_for_run
from tests.dags.conftest import DAGS, PLUGINS
from tests.peers import SLACK_TOKEN, HttpRecorder, SmtpPeer, connection_env

pytestmark = [pytest.mark.airflow, pytest.mark.stack]  # real scheduler + API server: make test-stack


def _conf(target, deadline_s: float):
    from tasks.settings import REPO_ROOT

    target.mkdir(parents=True)
    for name in ("base.yaml", "sit.yaml", "uat.yaml", "prod.yaml"):
        shutil.copy(REPO_ROOT / "conf" / name, target / name)
    # sit routes critical alerts to Slack too, and the ingest must finish within seconds of being queued
    (target / "sit.yaml").write_text((target / "sit.yaml").read_text() + f"""
alerts:
  routes:
    critical: [log, slack]
  deadlines:
    cd4ml_ingest: {{reference: queued_at, minutes: {deadline_s / 60}}}
""")
    return target


def test_a_passed_deadline_alerts_through_the_routing(tmp_path):
    slack, pd, smtp = HttpRecorder().start(), HttpRecorder(tls_dir=tmp_path / "tls").start(), SmtpPeer().start()
    (tmp_path / "cd4ml" / "landing").mkdir(parents=True)  # the environment's landing, empty today
    extra = {"CD4ML_HOME": str(tmp_path / "cd4ml"), "CD4ML_ENV": "sit",
             "CD4ML_CONF_DIR": str(_conf(tmp_path / "conf", deadline_s=1.0)),
             "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS), "AIRFLOW__CORE__PARALLELISM": "2",
             **connection_env(slack, pd, smtp.port)}
    handle = start_airflow(str(tmp_path / "airflow"), str(DAGS), env_extra=extra,
                           components=("api-server", "scheduler", "dag-processor", "triggerer"))
    try:
        handle.wait_for_dag("cd4ml_ingest")
        handle.unpause("cd4ml_ingest")  # the scheduler queues today's @daily run
        # Nothing has landed: ingest fails at once (an empty source is a data error, no retries), but
        # only after its 1 s deadline (starting a task process alone takes longer), so the deadline
        # is missed while the run is still going. Its failure alert is another post, left out below.
        waited = time.monotonic() + 120
        runs = []
        while not runs and time.monotonic() < waited:
            runs = handle.request("GET", "/api/v2/dags/cd4ml_ingest/dagRuns")["dag_runs"]
            time.sleep(1)
        [run] = runs
        run_id = run["dag_run_id"]
        assert wait_for_run(handle, "cd4ml_ingest", run_id, timeout=180) == "failed"
        waited = time.monotonic() + 90
        while not slack.slack_posts() and time.monotonic() < waited:
            time.sleep(1)
        posts = [p.body["text"] for p in slack.slack_posts()]
        missed = [t for t in posts if "deadline_missed" in t and not t.startswith("*RESOLVED")]
        assert len(missed) == 1, (posts, (tmp_path / "airflow" / "proc_logs" / "triggerer.log").read_text()[-4000:])
        assert f"cd4ml_ingest run {run_id} not finished 1 s after its queued at" in missed[0]
        assert "docs/runbooks/deadline_missed.md" in missed[0] and "/dags/cd4ml_ingest/runs/" in missed[0]
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "airflow").rglob("*.log"))
        assert SLACK_TOKEN not in logs
    finally:
        handle.stop()
        slack.stop(), pd.stop(), smtp.stop()
