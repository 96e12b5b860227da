"""The task bodies of the cd4ml DAGs, one module per DAG (``steps/train.py`` for ``dags/cd4ml_train.py``).

Each body is a small Airflow task around one ``tasks/`` function, written in the shape of
``steps.shape``; the DAG files import them and only wire. Heavy libraries are imported inside the
bodies, never here, so a DAG file parses fast.
"""
