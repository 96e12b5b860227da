"""deploy_model: which upstream version the triggering champion events name (cd4ml_promote's copy_candidate)."""

from __future__ import annotations

from tasks.release.release import upstream_version


def test_no_event_names_no_version():
    assert upstream_version([]) is None
    assert upstream_version([None, {}, {"model_name": "digits-uat"}]) is None


def test_the_last_event_that_names_a_version_wins():
    extras = [{"model_name": "digits-uat", "version": 3}, {"model_name": "digits-uat", "version": 4}, None,
              {"model_name": "digits-uat"}]
    assert upstream_version(extras) == 4


def test_a_rollback_event_names_the_version_it_restored():
    extras = [{"model_name": "digits-uat", "version": 5}, {"model_name": "digits-uat", "version": 4, "rollback": True}]
    assert upstream_version(iter(extras)) == 4  # any iterable: the DAG passes a generator over Airflow's events
