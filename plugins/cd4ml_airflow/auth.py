"""The production-like auth manager: Airflow's FAB auth manager, with approvals that can name a role.

Airflow answers a Human-in-the-loop task only for its ``assigned_users`` (when it has any) and
compares them with ``user.get_id()``. Under the FAB auth manager that id is the row number of the
``ab_user`` table ("2"), which nobody can put in a settings file, and Airflow has no assigned roles.
``release.approvers`` therefore names people by user name and roles as ``role:<Role>``:

    release:
      approvers: ["role:Approver"]      # anyone holding the FAB role Approver, and nobody else

Select it with ``AIRFLOW__CORE__AUTH_MANAGER=cd4ml_airflow.auth.Cd4mlFabAuthManager`` (the
scale-out mode does). Everything else is the stock FAB auth manager: its roles and permissions
decide who may open, trigger or clear what.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager

ROLE_PREFIX = "role:"


def may_answer(assigned: Iterable[str], user_id: str, user_name: str, roles: Iterable[str]) -> bool:
    """True when the user is assigned by id or name, or holds an assigned ``role:<Role>`` (case-insensitive)."""
    assigned = set(assigned)
    if {str(user_id), user_name} & assigned:
        return True
    wanted = {a[len(ROLE_PREFIX):].lower() for a in assigned if a.startswith(ROLE_PREFIX)}
    return bool(wanted & {r.lower() for r in roles})


class Cd4mlFabAuthManager(FabAuthManager):
    """FAB auth manager whose HITL check accepts user names and ``role:<Role>`` entries (module doc)."""

    def is_authorized_hitl_task(self, *, assigned_users: set[str], user) -> bool:
        roles = [role.name for role in getattr(user, "roles", None) or []]
        return may_answer(assigned_users, user.get_id(), user.get_name(), roles)
