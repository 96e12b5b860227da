"""Which worker ran a task: ``[core] hostname_callable = cd4ml_airflow.hosts.worker_hostname``.

Several Celery workers on one machine share its host name, so the task instance's ``hostname``
(shown in the UI, used by tests and on-call to find the right log) would not say which one ran
it. ``cd4ml up`` gives each worker a ``CD4ML_WORKER_NAME``; elsewhere this is Airflow's default.
"""

from __future__ import annotations

import os

from airflow.utils.net import getfqdn


def worker_hostname() -> str:
    name = os.environ.get("CD4ML_WORKER_NAME")
    return f"{name}@{getfqdn()}" if name else getfqdn()
