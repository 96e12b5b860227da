"""Settings as the DAG files see them at parse time: read once per parse from YAML (cheap).

Only structure is decided here (Asset URIs, which operator runs training); every task loads
the settings again at run time, on its worker.
"""

from __future__ import annotations

from tasks.settings import load_settings

SETTINGS = load_settings()
