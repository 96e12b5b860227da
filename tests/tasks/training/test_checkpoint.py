"""Checkpoints load weights-only: a ``last.pt`` that names code to run is refused, and that code never runs."""

from __future__ import annotations

from pathlib import Path

import pytest


class _Planted:
    """What a hostile checkpoint pickles: unpickling it would call ``Path.write_text`` on a marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_checkpoint_that_names_code_is_refused_and_the_code_never_runs(tmp_path: Path) -> None:
    import torch

    from tasks.errors import DataError
    from tasks.training.checkpoint import LAST_CHECKPOINT, CheckpointError, Checkpoints

    marker = tmp_path / "the-pickled-call-ran"
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"epoch": 1, "model": {"w": torch.zeros(2)}, "extra": _Planted(marker)}, folder / LAST_CHECKPOINT)
    with pytest.raises(CheckpointError) as caught:
        Checkpoints(str(folder)).load(torch.device("cpu"))
    assert isinstance(caught.value, DataError) and LAST_CHECKPOINT in str(caught.value)
    assert "write_text" not in str(caught.value)  # the file is named, never what it holds
    assert not marker.exists()


def test_numpy_generator_state_still_loads_weights_only(tmp_path: Path) -> None:
    import random

    import numpy as np
    import torch

    from tasks.training.checkpoint import Checkpoints, rng_state, set_rng_state
    from tasks.training.device import device_plan

    plan = device_plan("cpu", amp=False, channels_last=False)
    checkpoints = Checkpoints(str(tmp_path))
    checkpoints.save({"epoch": 2, "mlflow_run_id": "r", "stop": False, "rng": rng_state(plan)})
    expected = (np.random.rand(), random.random(), torch.rand(1).item())
    np.random.seed(9), random.seed(9), torch.manual_seed(9)
    set_rng_state(checkpoints.load(torch.device("cpu"))["rng"], plan)
    assert (np.random.rand(), random.random(), torch.rand(1).item()) == expected
