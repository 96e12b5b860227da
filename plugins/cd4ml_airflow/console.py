"""The ``cd4ml`` command: ``tasks.cli`` in a process whose alerts reach this deployment's channels.

Importing ``cd4ml_airflow`` installs Airflow's Slack, PagerDuty and email notifiers as alert
channels (its ``__init__``), so a rollback or a monitor run from the command line pages as a DAG
run does. ``tasks.cli`` itself imports no Airflow and can run without it (alerts then go to the log).
"""

from __future__ import annotations

import cd4ml_airflow  # noqa: F401 - installs the alert channels
from tasks.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
