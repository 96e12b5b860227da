"""Airflow-specific parts of cd4ml: task bodies (``steps/``), notifier, shared DAG defaults, Assets, context helpers.

Nothing here holds product logic; that lives in ``tasks/`` and is imported inside task bodies.
"""
