"""Where approval is required, release commands go through an Airflow API server as the signed-in user.

The server here is a real HTTP server on 127.0.0.1 that answers the two calls the command makes
(``/auth/token``, then the DAG run trigger) the way Airflow's API server does, and records them;
tests/dags/test_release_dags.py runs the same command against Airflow's own API server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

USERS = {"approver": "approver-pw"}


class _AirflowApi(BaseHTTPRequestHandler):
    calls: list[dict] = []

    def log_message(self, *args) -> None:  # quiet test output
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.calls.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.path == "/auth/token":
            if USERS.get(body.get("username")) != body.get("password"):
                return self._answer(401, {"detail": "Invalid credentials"})
            return self._answer(201, {"access_token": f"token-of-{body['username']}"})
        user = (self.headers.get("Authorization") or "").removeprefix("Bearer token-of-")
        if user not in USERS:
            return self._answer(401, {"detail": "Not authenticated"})
        dag_id = self.path.split("/")[4]
        self._answer(200, {"dag_run_id": f"manual__{dag_id}", "state": "queued", "triggering_user_name": user,
                           "conf": body["conf"]})


@pytest.fixture
def airflow_api(cd4ml_home, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AirflowApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _AirflowApi.calls = []
    monkeypatch.setenv("CD4ML_AIRFLOW_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("CD4ML_ACTOR", raising=False)
    monkeypatch.delenv("CD4ML_AIRFLOW_USERNAME", raising=False)
    monkeypatch.delenv("CD4ML_AIRFLOW_PASSWORD", raising=False)
    yield _AirflowApi.calls
    server.shutdown()
    server.server_close()


def test_prod_rollback_triggers_the_dag_as_the_signed_in_user_and_refuses_a_typed_one(airflow_api, monkeypatch,
                                                                                        capsys) -> None:
    from tasks.cli import main

    monkeypatch.setenv("CD4ML_AIRFLOW_USERNAME", "approver")
    monkeypatch.setenv("CD4ML_AIRFLOW_PASSWORD", "approver-pw")
    assert main(["rollback", "--env", "prod", "--reason", "canary", "--by", "ceo@example.com"]) == 1
    monkeypatch.setenv("CD4ML_ACTOR", "ceo@example.com")
    assert main(["rollback", "--env", "prod", "--reason", "canary"]) == 1
    assert airflow_api == []  # refused before anything was asked of Airflow
    monkeypatch.delenv("CD4ML_ACTOR")
    capsys.readouterr()

    assert main(["rollback", "--env", "prod", "--reason", "canary", "--to", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["route"], out["dag_id"], out["triggered_by"]) == ("airflow", "cd4ml_rollback", "approver")
    token, run = airflow_api
    assert token["path"] == "/auth/token" and token["auth"] is None
    assert run["path"] == "/api/v2/dags/cd4ml_rollback/dagRuns" and run["auth"] == "Bearer token-of-approver"
    assert run["body"]["conf"] == {"reason": "canary", "to_version": 3}
    assert main(["promote", "--env", "prod", "--version", "4"]) == 0
    assert airflow_api[-1]["path"] == "/api/v2/dags/cd4ml_promote/dagRuns"
    assert airflow_api[-1]["body"]["conf"] == {"version": 4}


def test_prod_release_commands_need_a_sign_in_that_airflow_accepts(airflow_api, monkeypatch) -> None:
    from tasks.release import actors
    from tasks.settings import load_settings

    prod = load_settings("prod")
    assert actors.route(prod) == actors.AIRFLOW and actors.route(load_settings("sit")) == actors.DIRECT
    with pytest.raises(actors.AirflowApiError):  # no credentials and no terminal to ask on
        actors.trigger(prod, "cd4ml_rollback", {"reason": "x"})
    monkeypatch.setenv("CD4ML_AIRFLOW_USERNAME", "approver")
    monkeypatch.setenv("CD4ML_AIRFLOW_PASSWORD", "wrong")
    with pytest.raises(actors.AirflowApiError):  # Airflow says no: nothing is triggered
        actors.trigger(prod, "cd4ml_rollback", {"reason": "x"})
    assert [c["path"] for c in airflow_api] == ["/auth/token"]
    with pytest.raises(actors.TypedActorError):
        actors.refuse_typed_actor(prod, "ceo@example.com")


def test_prod_class_acceptance_triggers_the_dag_as_the_signed_in_user(airflow_api, monkeypatch, capsys) -> None:
    """Before: refused outright in prod (no route); now the accept_class DAG, triggered as the signed-in user."""
    from tasks.cli import main

    monkeypatch.setenv("CD4ML_DATASET", "photos")  # allowed_labels: discover
    monkeypatch.setenv("CD4ML_ENV", "prod")
    monkeypatch.setenv("CD4ML_AIRFLOW_USERNAME", "approver")
    monkeypatch.setenv("CD4ML_AIRFLOW_PASSWORD", "approver-pw")
    monkeypatch.setenv("CD4ML_ACTOR", "ceo@example.com")
    assert main(["classes", "--accept", "zebra"]) == 1
    monkeypatch.delenv("CD4ML_ACTOR")
    assert main(["classes", "--accept", "zebra", "--accept", "evil\x1b[2J\nlabel"]) == 1
    err = capsys.readouterr().err
    assert "label 2: " in err and "evil" not in err  # the rule is named, the label never echoed
    assert airflow_api == []  # refused before anything was asked of Airflow

    assert main(["classes", "--accept", "zebra", "--accept", "okapi"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["route"], out["dag_id"], out["triggered_by"]) == ("airflow", "cd4ml_accept_class", "approver")
    token, run = airflow_api
    assert token["path"] == "/auth/token"
    assert run["path"] == "/api/v2/dags/cd4ml_accept_class/dagRuns" and run["auth"] == "Bearer token-of-approver"
    assert run["body"]["conf"] == {"labels": ["zebra", "okapi"]}
    from tasks.data import classes
    from tasks.settings import load_settings

    assert classes.known(load_settings()) is None  # nothing written by the command itself: the DAG run writes


def test_sit_class_acceptance_acts_directly_as_the_account(cd4ml_home, monkeypatch, capsys) -> None:
    from tasks.cli import main
    from tasks.data import classes, lake
    from tasks.release.actors import cli_actor
    from tasks.settings import load_settings

    monkeypatch.setenv("CD4ML_DATASET", "photos")
    monkeypatch.delenv("CD4ML_ACTOR", raising=False)
    assert main(["classes", "--accept", "zebra"]) == 0
    assert json.loads(capsys.readouterr().out)["classes"] == ["zebra"]
    uri = load_settings().table_uri(classes.CLASSES_TABLE)
    assert lake.read(uri, lake.current_version(uri)).to_pylist()[0]["actor"] == cli_actor()
