"""Airflow-specific parts of cd4ml: task bodies (``steps/``), notifier, alert channels, shared DAG defaults, Assets.

Nothing here holds product logic; that lives in ``tasks/`` and is imported inside task bodies.
Importing this package installs Airflow's provider notifiers as this process's alert channels
(``channels.install``): every DAG file, every task and the ``cd4ml`` command import it, so an
alert raised anywhere in ``tasks/`` reaches Slack, PagerDuty or email as settings route it.
"""

from cd4ml_airflow import channels as _channels

_channels.install()
