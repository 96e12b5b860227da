"""A real champion for the serving tests: trained on the real digits, gated and promoted once per session.

``champion_home()`` returns (settings, ServingModel) of a private CD4ML_HOME whose registered
model has a champion; the environment variables are set only while it is built, so tests pass
the settings explicitly (or set CD4ML_HOME themselves for a subprocess).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.cache
def champion_home(root: str, **training: Any) -> tuple[Any, Any]:
    """(settings, ServingModel) of a champion built in ``root``; ``training`` overrides (model, image_size)."""
    import pytest

    from tasks.models.champion import serving_model
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import mark_challenger, promote
    from tasks.settings import load_settings
    from tasks.training.train import train
    from tests.factories.digits import write_curated_digits
    from tests.factories.training import fast

    home = Path(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CD4ML_HOME", str(home))
        mp.setenv("CD4ML_ENV", "sit")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        s = fast(load_settings(), **{"epochs": 4, **training})
        s = s.model_copy(update={"gate": s.gate.model_copy(update={"smoke_test": False})})
        curated = write_curated_digits(s.curated_table, raw_version=1)
        trained = train(s, s.curated_table, curated, "manual__champion", "2026-11-21")
        version = register_candidate(s, trained.mlflow_run_id)
        gate = evaluate(s, version, s.curated_table, curated)
        assert gate.passed, gate.reasons
        mark_challenger(s, version, gate, run_id="champion")
        promote(s, version, gate, run_id="champion", actor="tests")
        return s, serving_model(s)
