"""Who may answer a HITL approval under the FAB auth manager: assigned names, or holders of a ``role:`` entry."""

from __future__ import annotations

from types import SimpleNamespace

from cd4ml_airflow.auth import Cd4mlFabAuthManager, may_answer


def test_names_and_roles_decide_nothing_else_does():
    assigned = {"role:Approver", "alice"}
    assert may_answer(assigned, "7", "alice", ["User"])  # by name (FAB ids are row numbers)
    assert may_answer(assigned, "8", "bob", ["User", "approver"])  # by role, case-insensitive
    assert not may_answer(assigned, "9", "carol", ["Admin", "User"])  # Admin is not Approver
    assert not may_answer({"role:Approver"}, "Approver", "approver", [])  # a user named like the role is not it
    assert may_answer({"7"}, 7, "x", [])  # the stock rule (the id) still holds


def test_the_auth_manager_reads_the_users_fab_roles():
    user = SimpleNamespace(roles=[SimpleNamespace(name="User"), SimpleNamespace(name="Approver")],
                           get_id=lambda: "3", get_name=lambda: "dana")
    manager = Cd4mlFabAuthManager.__new__(Cd4mlFabAuthManager)  # the check needs no app
    assert manager.is_authorized_hitl_task(assigned_users={"role:Approver"}, user=user)
    user.roles = [SimpleNamespace(name="Viewer")]
    assert not manager.is_authorized_hitl_task(assigned_users={"role:Approver"}, user=user)
