"""What ``tasks/__init__.py`` sets for every process that runs a step: here, Arrow's memory pool.

Each case is a fresh interpreter: the pool is chosen once, when pyarrow is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POOL = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"


def _lines(code: str, **env: str) -> list[str]:
    """What ``code`` prints in a fresh interpreter, with no pool chosen in its environment but ``env``'s."""
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    clean["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'plugins'}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**clean, **env}, check=True)
    return done.stdout.strip().splitlines()


def _pool(code: str, **env: str) -> str:
    return _lines(code, **env)[-1]


def test_a_step_process_uses_the_system_allocator_for_arrow():
    assert _pool(POOL) != "system"  # Arrow's own default, without the product
    assert _pool(f"import tasks; {POOL}") == "system"


def test_a_dag_file_leaves_the_choice_to_the_step():
    """Parsing a DAG file imports no pyarrow, so the task's first ``tasks`` import still picks the pool."""
    code = ("import runpy, sys; runpy.run_path('dags/cd4ml_curate.py'); print('pyarrow' in sys.modules); "
            f"import tasks.curation.curate; {POOL}")
    assert _lines(code)[-2:] == ["False", "system"]


@pytest.mark.parametrize("chosen", ["mimalloc", "jemalloc"])
def test_an_explicit_choice_wins(chosen):
    import pyarrow as pa

    available = {"mimalloc": pa.mimalloc_memory_pool, "jemalloc": pa.jemalloc_memory_pool}[chosen]
    try:
        available()
    except NotImplementedError:
        pytest.skip(f"this pyarrow build has no {chosen}")
    assert _pool(f"import tasks; {POOL}", ARROW_DEFAULT_MEMORY_POOL=chosen) == chosen
