"""`cd4ml up` without starting Airflow: sizing, env files, secrets, plans, and the supervisor on real processes."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tasks.ops import stack as st
from tests.stack.harness import drop_databases


def test_sizing_never_starts_the_stock_32_workers():
    gib = 2**30
    assert st.size_for(2, 24 * gib, "embedded", 2) == st.Sizing(2, 2, 0, 0)
    assert st.size_for(2, 24 * gib, "scaleout") == st.Sizing(2, 2, 1, 2)
    assert st.size_for(16, 24 * gib, "scaleout") == st.Sizing(8, 8, 1, 8)  # memory-bound: 24 GiB / 3
    assert st.size_for(16, 24 * gib, "scaleout", 3) == st.Sizing(8, 3, 1, 3)  # --workers 3
    assert st.size_for(64, 512 * gib, "embedded", 2).parallelism == 64
    assert st.size_for(1, 2 * gib, "embedded", 2).parallelism == 2  # a floor: one task may wait on another


def test_env_file_expands_defaults_nested_and_names_what_is_missing(tmp_path):
    path = tmp_path / "x.env"
    path.write_text("# comment\nA=${HOME_DIR}/a\nB=${UNSET:-${HOME_DIR}/b}\nC=${A}:${B}\nD=${EMPTY:-fallback}\n")
    values = st.read_env_file(path, {"HOME_DIR": "/h", "EMPTY": ""})
    assert values == {"A": "/h/a", "B": "/h/b", "C": "/h/a:/h/b", "D": "fallback"}
    path.write_text("A=ok\nB=${NOPE}\n")
    with pytest.raises(st.StackError, match=r"x.env:2: \$\{NOPE\} is not set"):
        st.read_env_file(path, {})
    path.write_text("not a line\n")
    with pytest.raises(st.StackError, match="not KEY=value"):
        st.read_env_file(path, {})


def test_secrets_are_generated_once_private_and_the_environment_wins(tmp_path):
    first = st.stack_secrets(tmp_path, {})
    assert set(first) == set(st.SECRET_NAMES) and all(len(v) >= 24 for v in first.values())
    assert stat.S_IMODE((tmp_path / "secrets.env").stat().st_mode) == 0o600
    assert st.stack_secrets(tmp_path, {}) == first  # reused, not regenerated
    assert st.stack_secrets(tmp_path, {"CD4ML_ADMIN_PASSWORD": "from-env"})["CD4ML_ADMIN_PASSWORD"] == "from-env"
    from cryptography.fernet import Fernet

    Fernet(first["AIRFLOW__CORE__FERNET_KEY"])  # a valid key, or Airflow refuses to start


def test_plans_for_both_modes_carry_no_secret_from_the_repository(tmp_path):
    base = {"PATH": os.environ["PATH"], "AIRFLOW__CORE__PARALLELISM": "7"}
    embedded = st.plan("embedded", home=str(tmp_path), port=8111, base_env=base)
    assert set(embedded.commands) == {"api-server", "scheduler", "dag-processor", "triggerer", "mlflow-ui"}
    assert embedded.env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert embedded.env["AIRFLOW__CORE__PARALLELISM"] == "7"  # an operator's AIRFLOW__* wins over the file
    assert embedded.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path}/airflow/airflow.db"

    scale = st.plan("scaleout", home=str(tmp_path), port=8112, mlflow_port=5111, workers=3,
                    base_env={"PATH": os.environ["PATH"], "CD4ML_PG_PREFIX": "p1"})
    assert [n for n in scale.commands if n.startswith("worker-")] == ["worker-1", "worker-2", "worker-3"]
    assert scale.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert scale.env["AIRFLOW__CORE__AUTH_MANAGER"] == "cd4ml_airflow.auth.Cd4mlFabAuthManager"
    assert scale.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("/p1_airflow")
    assert scale.env["CD4ML_OPTUNA_STORAGE"].endswith("/p1_optuna")
    assert scale.databases == ("p1_airflow", "p1_mlflow", "p1_mlflow_auth", "p1_optuna")
    assert "--app-name" in scale.commands["mlflow"] and "basic-auth" in scale.commands["mlflow"]
    secrets = st.stack_secrets(tmp_path / "stack", {})
    # scoring and serving sign in as the read-only account; its password is a generated secret like the others
    assert scale.env["CD4ML_MLFLOW_READER_USERNAME"] == "cd4ml-reader" != scale.env["MLFLOW_TRACKING_USERNAME"]
    assert scale.env["CD4ML_MLFLOW_READER_PASSWORD"] == secrets["CD4ML_MLFLOW_READER_PASSWORD"]
    assert "CD4ML_MLFLOW_READER_PASSWORD" not in embedded.env
    for path in (st.STACK_DIR / "embedded.env", st.STACK_DIR / "scaleout.env"):
        text = path.read_text()
        assert not any(value in text for value in secrets.values())
        for line in (raw for raw in text.splitlines() if raw and not raw.startswith("#")):
            key = line.split("=", 1)[0]
            if any(w in key for w in ("PASSWORD", "SECRET", "FERNET", "TOKEN")) and not key.endswith("_FILE"):
                pytest.fail(f"{path.name} sets {key}: secrets come from the environment or secrets.env")
    with pytest.raises(st.StackError, match="one of embedded, scaleout"):
        st.plan("cluster", home=str(tmp_path))


def _stack(tmp_path: Path, commands: dict[str, list[str]]) -> st.Stack:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return st.Stack("embedded", tmp_path, 0, 0, st.Sizing(2, 2, 0, 0), dict(os.environ), commands, state,
                    state / "logs")


def test_supervisor_restarts_what_dies_gives_up_when_it_keeps_dying_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(st.time, "sleep", lambda s: None)  # no back-off waits in the test
    sup = st.Supervisor(_stack(tmp_path, {
        "steady": ["sh", "-c", "sleep 300 & sleep 300"],  # a child in the group, as Airflow's workers are
        "crashy": ["sh", "-c", "exit 3"],
    }))
    said: list[str] = []
    for name in sup.stack.commands:
        sup.start(name)
    steady_group = sup.procs["steady"].pid
    deadline = time.monotonic() + 5
    while len(st.group_pids(steady_group)) < 2 and time.monotonic() < deadline:
        pass
    assert len(st.group_pids(steady_group)) >= 2
    with pytest.raises(st.StackError, match=r"crashy exited 3 6 times in 10 min"):
        for _ in range(20):
            sup.procs["crashy"].wait(timeout=5)
            sup.check(said.append)
    assert said[0] == "crashy exited with 3; restarting it (1/5)" and len(said) == st.MAX_RESTARTS
    assert sup.procs["steady"].poll() is None  # the healthy one was left alone
    sup.stop()
    assert st.group_pids(steady_group) == []
    assert not (sup.stack.state_dir / "stack.json").exists()


def test_down_stops_a_stack_whose_supervisor_is_gone(tmp_path):
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    state = tmp_path / "stack" / "embedded"
    state.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "stack.json").write_text(f'{{"supervisor": {dead.pid}, "groups": {{"scheduler": {proc.pid}}}}}')
    assert st.down(home=str(tmp_path), mode="embedded") == ["scheduler"]
    proc.wait(timeout=10)
    assert st.group_pids(proc.pid) == []


def test_fab_bootstrap_reads_what_exists_from_the_tables_runs_only_what_is_missing_and_names_a_failure(tmp_path):
    """Users and roles are checked in the FAB tables (never in a command's message): present, nothing runs;
    missing and the command fails, the failure is named with the bootstrap log (real PostgreSQL, real CLI)."""
    psycopg2 = pytest.importorskip("psycopg2")
    prefix = f"fab{os.getpid()}"
    try:
        psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=3).close()
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is unreachable ({str(exc).strip()})")
    stack = st.plan("scaleout", home=str(tmp_path), port=8113, mlflow_port=5113,
                    base_env={"PATH": os.environ["PATH"], "CD4ML_PG_PREFIX": prefix})
    st.create_databases(stack)
    user = ("SELECT 1 FROM ab_user WHERE username = %s", ("admin",))
    try:
        assert not st._fab_has(stack, *user)  # no FAB table yet: nobody
        conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=f"{prefix}_airflow")
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE ab_user (id serial PRIMARY KEY, username text UNIQUE)")
            cur.execute("INSERT INTO ab_user (username) VALUES ('admin')")
        conn.close()
        assert st._fab_has(stack, *user) and not st._fab_has(stack, user[0], ("approver",))
        st._ensure(stack, ["no-such-command"], "airflow users create admin", *user)  # there: the command never runs
        assert not (stack.log_dir / "bootstrap.log").exists()
        with pytest.raises(st.StackError, match=r"airflow users create approver failed \(1 tries, last exit 2\).*bootstrap"):
            st._ensure(stack, ["no-such-command"], "airflow users create approver", user[0], ("approver",),
                       attempts=1)
    finally:
        drop_databases(prefix)


def test_a_generated_password_that_starts_with_a_dash_reaches_airflow_users_create():
    """secrets.token_urlsafe gives a leading "-" one time in 64; standing alone after --password, argparse took it for
    an option and `cd4ml up` failed to create its users (seen in a topology test). Parsed here by the FAB provider's
    own definition of the command."""
    import argparse

    from airflow.providers.fab.cli.definition import USERS_COMMANDS

    from tasks.ops.stack import user_create_args

    parser = argparse.ArgumentParser()
    for arg in next(c for c in USERS_COMMANDS if c.name == "create").args:
        arg.add_to_parser(parser)
    parsed = parser.parse_args(user_create_args("approver", "User", "-x9_abc-")[2:])
    assert (parsed.username, parsed.role, parsed.password) == ("approver", "User", "-x9_abc-")
    assert user_create_args("approver", "User", "p")[:2] == ["users", "create"]
