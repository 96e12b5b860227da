"""Airflow-specific parts of cd4ml: notifier, shared DAG defaults, Assets, context helpers.

Nothing here holds product logic; that lives in ``tasks/`` and is imported inside task bodies.
"""
