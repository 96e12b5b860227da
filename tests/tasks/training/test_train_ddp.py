"""DDP on CPU: two gloo processes under torchrun learn as well as one, and only rank 0 logs."""

from __future__ import annotations

import pytest

from tests.factories.digits import split_rows, write_curated_digits
from tests.factories.training import fast, private_home, runs_in_experiment


def test_two_gloo_processes_reach_the_accuracy_of_one_and_log_a_single_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import mlflow
    import pandas as pd

    from tasks.models.registry import mlflow_client
    from tasks.training.train import train, with_training

    with private_home(tmp_path_factory, "ddp-home") as base:
        single = fast(base, epochs=3)
        version = write_curated_digits(single.curated_table, raw_version=2)
        table = single.curated_table
        one = train(single, table, version, "ddp-1", "2026-11-21")

        # Same global batch (2 x 32 = 64), so linear LR scaling leaves the learning rate unchanged.
        double = with_training(single, {"launcher": "torchrun", "nproc_per_node": 2, "batch_size": 32})
        two = train(double, table, version, "ddp-2", "2026-11-21")

        assert (one.world_size, two.world_size) == (1, 2)
        assert two.launcher == "torchrun" and not two.reused
        assert one.metrics["best_val_accuracy"] > 0.85 and two.metrics["best_val_accuracy"] > 0.85
        assert abs(one.metrics["best_val_accuracy"] - two.metrics["best_val_accuracy"]) <= 0.05

        client = mlflow_client(single)
        runs = [r for r in runs_in_experiment(single) if r.data.tags.get("cd4ml.airflow_run_id") == "ddp-2"]
        assert len(runs) == 1  # rank 1 never opened a run
        run = runs[0]
        assert run.info.run_id == two.mlflow_run_id and run.info.status == "FINISHED"
        assert run.data.params["world_size"] == "2" and run.data.params["global_batch_size"] == "64"
        assert float(run.data.params["effective_learning_rate"]) == pytest.approx(single.training.learning_rate)
        assert run.data.tags["cd4ml.launcher"] == "torchrun" and "gloo" in run.data.tags["cd4ml.device"]
        steps = [m.step for m in client.get_metric_history(two.mlflow_run_id, "val_accuracy")]
        assert sorted(steps) == list(range(1, two.epochs_run + 1))  # one writer: each epoch once

        # The DDP-trained model (unwrapped before logging) serves like any other.
        model = mlflow.pyfunc.load_model(two.model_uri)
        val = split_rows("val")
        predicted = model.predict(pd.DataFrame({"image": [r["image"] for r in val]}))["label"].tolist()
        accuracy = sum(p == r["label"] for p, r in zip(predicted, val)) / len(val)
        assert accuracy == pytest.approx(two.metrics["best_val_accuracy"], abs=1e-6)
