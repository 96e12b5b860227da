"""A training task killed after epoch k resumes from its checkpoint and ends where an unbroken run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.factories.digits import write_curated_digits
from tests.factories.training import fast, private_home, runs_in_experiment

REPO = Path(__file__).resolve().parents[3]
KILL_AFTER_EPOCH = 2

CHILD = """
import json, logging, sys
from tasks.settings import Settings
from tasks.training.train import train
logging.basicConfig(level=logging.INFO)
args = json.loads(sys.argv[1])
settings = Settings.model_validate(args["settings"])
train(settings, args["table"], args["version"], args["run_id"], "2026-11-21", force=True)
"""


def test_a_run_killed_after_epoch_k_resumes_in_the_same_mlflow_run_and_ends_like_an_unbroken_one(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tasks.models.registry import mlflow_client
    from tasks.training.train import checkpoint_dir_for, train, training_config_hash

    with private_home(tmp_path_factory, "resume-home") as base:
        # Smaller batches make an epoch long enough (~0.3 s) to kill between two checkpoints;
        # early stopping (patience 3) must still end the run at the same epoch after a resume.
        settings = fast(base, epochs=14, patience=3, min_delta=0.005, batch_size=32, lr_scaling="none")
        version = write_curated_digits(settings.curated_table, raw_version=1)
        table = settings.curated_table

        unbroken = train(settings, table, version, "unbroken", "2026-11-21")
        assert unbroken.epochs_run >= KILL_AFTER_EPOCH + 2, "the run must outlast the kill to test a resume"

        run_id = "scheduled__2026-11-21T00:00:00+00:00"
        folder = checkpoint_dir_for(settings, table, version, training_config_hash(settings), run_id)
        args = {"settings": settings.model_dump(mode="json"), "table": table, "version": version, "run_id": run_id}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(args)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        state_file = folder / "state.json"
        deadline = time.monotonic() + 180
        killed_at = None
        while time.monotonic() < deadline and child.poll() is None:
            try:
                state = json.loads(state_file.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                state = {"epoch": 0}
            if state["epoch"] >= KILL_AFTER_EPOCH:
                os.kill(child.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        _, stderr = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, stderr[-3000:]
        state = json.loads(state_file.read_text())
        killed_at, killed_run = state["epoch"], state["mlflow_run_id"]
        assert KILL_AFTER_EPOCH <= killed_at < unbroken.epochs_run and not state["stop"]

        client = mlflow_client(settings)
        assert client.get_run(killed_run).info.status == "RUNNING"  # SIGKILL left no chance to close it

        # The Airflow retry: same task, same run id, same settings.
        resumed = train(settings, table, version, run_id, "2026-11-21", force=True)
        assert resumed.mlflow_run_id == killed_run
        assert resumed.resumed_from_epoch == killed_at
        assert resumed.epochs_run == unbroken.epochs_run
        assert resumed.best_epoch == unbroken.best_epoch
        assert resumed.metrics["best_val_accuracy"] == pytest.approx(unbroken.metrics["best_val_accuracy"], abs=1e-12)
        assert resumed.metrics["best_val_loss"] == pytest.approx(unbroken.metrics["best_val_loss"], rel=1e-6)

        run = client.get_run(killed_run)
        assert run.info.status == "FINISHED" and run.data.tags["cd4ml.model_uri"] == resumed.model_uri
        assert run.data.tags["cd4ml.resumed_from_epoch"] == str(killed_at)
        for metric in ("val_accuracy", "train_loss"):
            steps = [m.step for m in client.get_metric_history(killed_run, metric)]
            assert sorted(steps) == list(range(1, unbroken.epochs_run + 1)), metric  # each epoch once
        unbroken_history = [m.value for m in client.get_metric_history(unbroken.mlflow_run_id, "val_accuracy")]
        resumed_history = [m.value for m in sorted(client.get_metric_history(killed_run, "val_accuracy"), key=lambda m: m.step)]
        assert resumed_history == pytest.approx(unbroken_history, abs=1e-12)
        assert not folder.exists()  # removed after success (keep_checkpoints is false)
        assert len([r for r in runs_in_experiment(settings) if r.data.tags.get("cd4ml.airflow_run_id") == run_id]) == 1


def test_the_checkpoint_folder_is_deterministic_per_table_version_config_and_run(settings) -> None:
    from tasks.training.train import checkpoint_dir_for, training_config_hash, with_training

    table = settings.curated_table
    h = training_config_hash(settings)
    a = checkpoint_dir_for(settings, table, 3, h, "manual__2026-11-21T00:00:00+00:00")
    assert a == checkpoint_dir_for(settings, table, 3, h, "manual__2026-11-21T00:00:00+00:00")
    assert a.is_relative_to(settings.training.checkpoint_dir)
    assert ":" not in a.name and "+" not in a.name
    assert a != checkpoint_dir_for(settings, table, 4, h, "manual__2026-11-21T00:00:00+00:00")
    assert a != checkpoint_dir_for(settings, table, 3, h, "manual__2026-11-22T00:00:00+00:00")
    # How the work runs does not change what is learned; what is learned changes the hash.
    assert training_config_hash(with_training(settings, {"launcher": "torchrun", "num_threads": 2})) == h
    assert training_config_hash(with_training(settings, {"learning_rate": 0.01})) != h
    assert training_config_hash(settings, "models:/m/3") != h


# The keys of a format-1 checkpoint, as written before the loop kept its state in TrainState:
# a retry after an upgrade must still read what the killed attempt wrote.
FORMAT_1_KEYS = {
    "format", "epoch", "model", "optimizer", "scheduler", "early_stopping", "best_state", "history", "rng", "seconds",
    "loop_seconds", "images", "stop", "stopped_by_callback", "mlflow_run_id", "world_size",
}


def test_the_train_state_round_trips_through_a_checkpoint_random_generators_included(tmp_path: Path) -> None:
    import random

    import numpy as np
    import torch

    from tasks.training.checkpoint import Checkpoints
    from tasks.training.device import device_plan
    from tasks.training.loop import EarlyStopping, TrainState

    plan = device_plan("cpu", amp=False, channels_last=False)

    def fresh(seed: int) -> TrainState:
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
        return TrainState(model, optimizer, scheduler, EarlyStopping(patience=2, min_delta=0.01))

    state = fresh(0)
    state.model(torch.randn(4, 3)).sum().backward()
    state.optimizer.step()
    state.scheduler.step()
    state.stopper.update(1, 0.5, 0.9)
    state.best_weights = {k: v.clone() for k, v in state.model.state_dict().items()}
    state.record(1, {"val_accuracy": 0.5}, seconds=2.0, loop_seconds=1.5, images=64)
    state.mlflow_run_id = "run-1"
    saved = state.to_checkpoint(plan, world_size=1)
    assert set(saved) == FORMAT_1_KEYS and saved["format"] == 1
    checkpoints = Checkpoints(str(tmp_path))
    checkpoints.save(saved)
    expected_draws = (torch.rand(3), np.random.rand(), random.random())

    resumed = fresh(1)  # other weights, other generator states
    resumed.restore(checkpoints.load(plan.device), plan)
    assert (torch.rand(3).tolist(), np.random.rand(), random.random()) == (expected_draws[0].tolist(), *expected_draws[1:])
    assert resumed.epoch == 1 and resumed.history == state.history and resumed.mlflow_run_id == "run-1"
    assert (resumed.seconds, resumed.loop_seconds, resumed.images, resumed.stop) == (2.0, 1.5, 64, False)
    assert resumed.stopper == state.stopper
    assert all(torch.equal(resumed.model.state_dict()[k], v) for k, v in state.model.state_dict().items())
    assert resumed.scheduler.state_dict()["last_epoch"] == 1
    assert resumed.optimizer.state_dict()["state"][0]["step"] == state.optimizer.state_dict()["state"][0]["step"]
    assert json.loads((tmp_path / "state.json").read_text()) == {"epoch": 1, "mlflow_run_id": "run-1", "stop": False}
