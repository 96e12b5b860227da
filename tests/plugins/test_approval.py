"""The approval's responder as the ledger names it: the user name Airflow recorded with the answer."""

from __future__ import annotations

from cd4ml_airflow.approval import responder


def test_the_responder_is_named_by_user_name_not_by_row_number():
    assert responder({"responded_by_user": {"id": "2", "name": "approver"}}) == "approver"  # FAB ids are row numbers
    assert responder({"responded_by_user": None}) is None  # a timeout has no responder
    assert responder({}) is None
