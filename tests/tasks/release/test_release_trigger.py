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


def test_a_message_queue_event_names_its_version_in_the_message_and_a_bad_message_names_none():
    def message(data):
        return {"from_trigger": True, "payload": {"type": "message", "channel": "cd4ml-sit-champion", "data": data}}

    assert upstream_version([message('{"model_name": "digits-classifier-sit", "version": 6}')]) == 6
    assert upstream_version([{"version": 2}, message('{"version": "7"}')]) == 7
    bad = [message("not json"), message('["version", 8]'), message('{"version": -1}'), message('{"version": true}'),
           message('{"version": 9, "pad": "' + "x" * 5000 + '"}'), message(None), {"from_trigger": True, "payload": "x"}]
    assert upstream_version([{"version": 3}, *bad]) == 3  # ignored: the earlier event still names its version
    assert upstream_version(bad) is None
