"""cd4ml_accept_class's task: the row names who Airflow says triggered the run, never a Param; labels checked first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from cd4ml_airflow.steps.classes import accept_class


def _run(labels, user: str | None, **params):
    return accept_class.function(dag=SimpleNamespace(dag_id="cd4ml_accept_class"), run_id="manual__1",
                                 dag_run=SimpleNamespace(triggering_user_name=user),
                                 params={"labels": labels, **params})


@pytest.fixture
def photos(settings, monkeypatch):
    monkeypatch.setenv("CD4ML_DATASET", "photos")  # allowed_labels: discover
    from tasks.settings import load_settings

    return load_settings()


def test_the_row_names_the_user_airflow_recorded(photos, capsys):
    from tasks.data import classes, lake

    result = _run(["zebra"], "alice", actor="ceo@example.com")  # a Param that claims an actor is ignored
    assert result == {"env": "sit", "new": 1, "actor": "alice", "classes": ["zebra"]}
    assert "accepted 1 new class(es) as alice" in capsys.readouterr().out
    uri = photos.table_uri(classes.CLASSES_TABLE)
    assert lake.read(uri, lake.current_version(uri)).to_pylist()[0]["actor"] == "alice"
    assert _run(["zebra"], None)["new"] == 0  # the same class again changes nothing


def test_a_hostile_label_fails_the_run_at_once_and_writes_nothing(photos):
    from tasks.data import classes

    with pytest.raises(AirflowFailException, match="label 1: a label must not hold control") as failure:
        _run(["zebra\n<script>"], "alice")
    assert "script" not in str(failure.value)
    assert classes.known(photos) is None


def test_an_environment_that_lists_its_classes_refuses(settings):
    with pytest.raises(AirflowFailException, match="ingest.allowed_labels is a list"):
        _run(["zebra"], "alice")
