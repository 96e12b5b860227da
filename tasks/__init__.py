"""cd4ml's product logic: plain typed Python steps, no Airflow import.

Set here, once, before any step imports its libraries: the pipeline runs offline and must
not phone home or draw progress bars into task logs (explicit environment settings win).
"""

import os as _os

for _name, _value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "GIT_PYTHON_REFRESH": "quiet",
    "FASTDUP_PRODUCTION": "1",
    "SENTRY_OPT_OUT": "1",  # fastdup reports to Sentry unless this is set; FASTDUP_PRODUCTION does not stop it
    "GX_ANALYTICS_ENABLED": "false",
}.items():
    _os.environ.setdefault(_name, _value)
