"""cd4ml's product logic: plain typed Python steps, no Airflow import.

Set here, once, before any step imports its libraries: the pipeline runs offline and must
not phone home or draw progress bars into task logs (explicit environment settings win).

Arrow's memory pool is the C library's allocator (``ARROW_DEFAULT_MEMORY_POOL=system``), read once when
pyarrow is imported: a step imports ``tasks`` before pyarrow (a DAG file imports neither). Arrow's own
default (mimalloc) keeps what a scan freed, also after ``release_unused``: one scan of the copy-score table's
key columns at 100,000 images left about 105 MB resident with 3 MB allocated (the system pool: about 28 MB), and
a 1% curation batch peaked at 677 MB against 523 with the system pool, in as many seconds (bench/README.md,
"Curation at scale", run 27).
"""

import os as _os

for _name, _value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "GIT_PYTHON_REFRESH": "quiet",
    "FASTDUP_PRODUCTION": "1",
    "SENTRY_OPT_OUT": "1",  # fastdup reports to Sentry unless this is set; FASTDUP_PRODUCTION does not stop it
    "GX_ANALYTICS_ENABLED": "false",
    "ARROW_DEFAULT_MEMORY_POOL": "system",  # what a scan frees goes back (the module doc)
}.items():
    _os.environ.setdefault(_name, _value)
