"""The alert channels this process can deliver to, by name: installed by whoever has them.

``log`` needs nothing and is always there (``tasks.alerting.delivery``). Slack, PagerDuty and
email go through Airflow's provider notifiers, which this package must not import: the Airflow
plugin package (``plugins/cd4ml_airflow``) installs them here when it is imported, and every DAG,
task and the ``cd4ml`` command import it. A test or a process without Airflow installs its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tasks.alerting.alert import Action, Alert
from tasks.settings import Settings

Channel = Callable[[Alert, Settings, Action], None]
_installed: dict[str, Channel] = {}


def use_channels(channels: Mapping[str, Channel]) -> None:
    """Install delivery functions by channel name (``slack``, ``pagerduty``, ``email``) for this process."""
    _installed.update(channels)


def installed() -> tuple[str, ...]:
    return tuple(sorted(_installed))


def channel(name: str) -> Channel | None:
    return _installed.get(name)
