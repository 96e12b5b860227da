"""The Airflow UI in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium).

`cd4ml up` on the embedded defaults (the walk-through of docs/operations.md), with sit set to need a person's
approval so the Required Actions page is part of the path:

1. an operator signs in, opens cd4ml_train, fills the trigger form (curated_version, a run id)
   and triggers it, unpausing the Dag from the form;
2. the run trains, gates and parks in ``approve``; the approver signs in, opens Required Actions,
   answers Approve with a reason;
3. the run succeeds, the champion moves, and the run page shows success.

Screenshots of every step land in the test's tmp dir (kept on failure).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dags.airflow_services import AirflowHandle, free_port, q, wait_for_run, wait_for_task_state
from tests.stack import harness
from tests.stack.harness import BIN

pytestmark = pytest.mark.browser

DATE = "2026-11-21"
CONF = """
ingest: {schedule: null}
training: {epochs: 3, patience: 2}
"""


def _chrome_or_skip() -> None:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.fail("chromium / chromedriver missing: `make test-stack` installs them (apt-get)")


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[dict]:
    _chrome_or_skip()
    from tasks.ops.stack import plan

    home = tmp_path_factory.mktemp("ui")
    conf = harness.write_conf(home / "conf", CONF, approvers="[approver]")
    port = free_port()
    env = harness.stack_env(home, "embedded", conf)
    stack_env = plan("embedded", home=env["CD4ML_HOME"], port=port, base_env=env).env

    # Data for the run the browser triggers: ingest and curate, as `make demo` does.
    def run(*args: str) -> None:
        proc = subprocess.run([*args], env=stack_env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    run(str(BIN / "cd4ml"), "sample-data")
    run(str(BIN / "airflow"), "db", "migrate")
    run(str(BIN / "airflow"), "dags", "test", "cd4ml_ingest", DATE)
    run(str(BIN / "airflow"), "dags", "test", "cd4ml_curate", DATE)

    up = harness.start(env, home / "up.log", port, free_port())
    try:
        passwords = json.loads(Path(stack_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).read_text())
        handle = AirflowHandle(home=str(home), base_url=f"http://localhost:{port}", env=stack_env,
                               users={u: ("", pw) for u, pw in passwords.items()})
        yield {"home": home, "handle": handle, "passwords": passwords, "shots": home / "screenshots"}
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=90)


class Browser:
    """One Chromium session; ``shot(name)`` saves a screenshot for the record."""

    def __init__(self, base_url: str, shots: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1000",
                    f"--user-data-dir={shots.parent / ('chrome-' + uuid.uuid4().hex[:6])}"):
            options.add_argument(arg)
        options.binary_location = shutil.which("chromium")
        self.driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        self.base_url = base_url
        self.shots = shots
        shots.mkdir(exist_ok=True)

    def wait(self, condition, timeout: float = 60):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.3).until(condition)

    def find(self, css: str, timeout: float = 60, text: str | None = None):
        from selenium.webdriver.common.by import By

        def found(driver):
            items = [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]
            if text is not None:
                items = [e for e in items if text in (e.text or "")]
            return items[0] if items else False

        return self.wait(found, timeout)

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.shots / f"{name}.png"))

    def sign_in(self, user: str, password: str) -> None:
        self.driver.get(self.base_url + "/")
        self.find("input[name=username]").send_keys(user)
        self.find("input[name=password]").send_keys(password)
        self.shot(f"sign-in-{user}")
        self.find("button[type=submit]").click()
        self.wait(lambda d: "/auth/login" not in d.current_url)

    def close(self) -> None:
        self.driver.quit()


def test_trigger_from_the_form_and_approve_on_required_actions(ui) -> None:
    h: AirflowHandle = ui["handle"]
    h.wait_for_dag("cd4ml_train", timeout=180)
    run_id = f"browser__{uuid.uuid4().hex[:8]}"

    operator = Browser(h.base_url, ui["shots"])
    try:
        operator.sign_in("admin", ui["passwords"]["admin"])
        operator.driver.get(f"{h.base_url}/dags/cd4ml_train")
        operator.find("button[aria-label='Trigger Dag']").click()
        dialog = operator.find("[role=dialog]")
        operator.find("input[name=element_curated_version]").send_keys("0")
        operator.find("button", text="Advanced Options").click()
        operator.find("input[name=dagRunId]").send_keys(run_id)
        unpause = [c for c in dialog.find_elements("css selector", "input[type=checkbox]")
                   if "Unpause" in c.find_element("xpath", "./ancestor::label").text]
        assert unpause and unpause[0].is_selected(), "the form unpauses the Dag on trigger"
        operator.shot("trigger-form")
        operator.find("[role=dialog] button", text="Trigger").click()
        operator.wait(lambda d: f"/runs/{run_id}" in d.current_url or not d.find_elements("css selector",
                                                                                         "[role=dialog]"))
        operator.shot("triggered")
    finally:
        operator.close()

    run = h.request("GET", f"/api/v2/dags/cd4ml_train/dagRuns/{q(run_id)}", user="admin")
    assert run["conf"]["curated_version"] == 0 and run["run_type"] == "manual", run
    wait_for_task_state(h, "cd4ml_train", run_id, "approve", {"awaiting_input"}, timeout=900)
    time.sleep(3)  # one scheduler loop, so the answer does not race the deferral (see airflow_services)

    approver = Browser(h.base_url, ui["shots"])
    try:
        approver.sign_in("approver", ui["passwords"]["approver"])
        approver.driver.get(f"{h.base_url}/required_actions")
        approver.shot("required-actions")
        approver.find("a", text="approve").click()
        approver.shot("approval-form")
        approver.find("textarea, input[name=element_reason]").send_keys("checked in the browser test")
        approver.find("button", text="Approve").click()
        approver.wait(lambda d: h.hitl_detail("cd4ml_train", run_id, "approve")["response_received"], timeout=60)
        approver.shot("approved")
    finally:
        approver.close()

    assert wait_for_run(h, "cd4ml_train", run_id, timeout=300) == "success"
    detail = h.hitl_detail("cd4ml_train", run_id, "approve")
    assert detail["chosen_options"] == ["Approve"] and detail["responded_by_user"]["name"] == "approver"

    viewer = Browser(h.base_url, ui["shots"])
    try:
        viewer.sign_in("admin", ui["passwords"]["admin"])
        viewer.driver.get(f"{h.base_url}/dags/cd4ml_train/runs/{run_id}")
        viewer.wait(lambda d: "success" in d.find_element("tag name", "body").text.lower(), timeout=60)
        viewer.shot("run-succeeded")
    finally:
        viewer.close()
