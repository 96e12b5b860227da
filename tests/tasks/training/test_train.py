"""Training on real digits: learns, reads the exact curated version, reuses, stops early, serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.factories.digits import curated_rows, encode, split_rows, write_curated_digits
from tests.factories.training import fast, private_home, runs_in_experiment, with_model_name


@dataclass(frozen=True)
class Trained:
    settings: Any
    version: int
    newer_version: int
    result: Any


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    from tasks.training.train import train

    with private_home(tmp_path_factory, "train-home") as base:
        settings = fast(base)
        version = write_curated_digits(settings.curated_table, raw_version=3)
        # A newer, much smaller version: training must read the version it was given.
        newer = write_curated_digits(settings.curated_table, raw_version=4, limit=200)
        result = train(settings, settings.curated_table, version, "manual__2026-11-21", "2026-11-21")
        yield Trained(settings, version, newer, result)


def test_trains_on_the_exact_curated_version_and_logs_lineage(trained: Trained) -> None:
    from tasks.models.registry import mlflow_client
    from tasks.training.train import training_config_hash

    s, r = trained.settings, trained.result
    assert trained.newer_version > trained.version
    assert not r.reused
    assert r.curated_table == s.curated_table and r.curated_version == trained.version
    assert r.raw_version == 3  # from the curated commit's metadata, not the newer commit's 4
    assert r.metrics["best_val_accuracy"] > 0.8
    assert 1 <= r.best_epoch <= r.epochs_run <= s.training.epochs
    assert r.model_uri.startswith("models:/")
    assert json.loads(json.dumps(r.to_dict()))["mlflow_run_id"] == r.mlflow_run_id

    client = mlflow_client(s)
    run = client.get_run(r.mlflow_run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["cd4ml.env"] == "sit"
    assert tags["cd4ml.curated_table"] == s.curated_table
    assert tags["cd4ml.curated_version"] == str(trained.version)
    assert tags["cd4ml.raw_version"] == "3"
    assert tags["cd4ml.config_hash"] == training_config_hash(s)
    assert tags["cd4ml.logical_date"] == "2026-11-21"
    assert tags["cd4ml.airflow_run_id"] == "manual__2026-11-21"
    params = run.data.params
    assert params["n_train"] == str(len(split_rows("train")))  # the full version, not the newer 200 rows
    assert params["n_val"] == str(len(split_rows("val")))
    assert params["learning_rate"] == str(s.training.learning_rate)
    assert params["registered_model_name"] == s.registry.model_name
    assert params["classes"] == ",".join(str(d) for d in range(10))
    history = client.get_metric_history(r.mlflow_run_id, "val_accuracy")
    assert [m.step for m in history] == list(range(1, r.epochs_run + 1))
    assert max(m.value for m in history) == pytest.approx(r.metrics["best_val_accuracy"])
    assert len(client.get_metric_history(r.mlflow_run_id, "train_loss")) == r.epochs_run

    inputs = run.inputs.dataset_inputs
    assert len(inputs) == 1
    dataset = inputs[0].dataset
    assert dataset.source_type == "delta_table"
    assert json.loads(dataset.source)["path"] == s.curated_table
    input_tags = {t.key: t.value for t in inputs[0].tags}
    assert input_tags["delta_table_version"] == str(trained.version)
    assert input_tags["mlflow.data.context"] == "training"


def test_same_curated_version_and_config_is_reused_unless_forced(trained: Trained) -> None:
    from tasks.training.train import train

    s, first = trained.settings, trained.result
    before = {run.info.run_id for run in runs_in_experiment(s)}
    again = train(s, s.curated_table, trained.version, "scheduled__retry", "2026-11-21")
    assert again.reused
    assert again.mlflow_run_id == first.mlflow_run_id
    assert again.model_uri == first.model_uri
    assert (again.epochs_run, again.best_epoch, again.metrics) == (first.epochs_run, first.best_epoch, first.metrics)
    assert {run.info.run_id for run in runs_in_experiment(s)} == before

    # Another training config is another model: it trains (and is deterministic given the seed).
    other = train(fast(s, epochs=1), s.curated_table, trained.version, "manual__other", "2026-11-21")
    assert not other.reused and other.mlflow_run_id != first.mlflow_run_id
    forced = train(fast(s, epochs=1), s.curated_table, trained.version, "manual__force", "2026-11-21", force=True)
    assert not forced.reused and forced.mlflow_run_id not in (first.mlflow_run_id, other.mlflow_run_id)
    assert forced.metrics["best_val_accuracy"] == other.metrics["best_val_accuracy"]


def test_early_stopping_stops_and_keeps_the_best_weights(trained: Trained) -> None:
    import mlflow
    import pandas as pd

    from tasks.models.registry import mlflow_client
    from tasks.training.train import train

    # Val accuracy climbs past 0.9 in two or three epochs and then creeps up by less than
    # min_delta per epoch: with patience 2 the run must stop long before 40 epochs.
    s = fast(trained.settings, epochs=40, patience=2, min_delta=0.02)
    result = train(s, s.curated_table, trained.version, "manual__early", "2026-11-21")
    assert not result.reused
    assert result.epochs_run < s.training.epochs
    assert result.epochs_run - result.best_epoch == s.training.patience

    history = [m.value for m in mlflow_client(s).get_metric_history(result.mlflow_run_id, "val_accuracy")]
    assert len(history) == result.epochs_run
    best = history[result.best_epoch - 1]
    assert best == pytest.approx(result.metrics["best_val_accuracy"])
    assert all(value <= best + s.training.min_delta for value in history[result.best_epoch :])

    # The logged model carries the best epoch's weights: it scores exactly the best val accuracy.
    model = mlflow.pyfunc.load_model(result.model_uri)
    val = sorted(split_rows("val"), key=lambda r: r["sha256"])
    predicted = model.predict(pd.DataFrame({"image": [r["image"] for r in val]}))["label"].tolist()
    accuracy = sum(p == r["label"] for p, r in zip(predicted, val)) / len(val)
    assert accuracy == pytest.approx(result.metrics["best_val_accuracy"], abs=1e-6)


FRESH_PROCESS = """
import json, sys
import mlflow
import pandas as pd
uri, model_uri, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
mlflow.set_tracking_uri(uri)
path_before = list(sys.path)
model = mlflow.pyfunc.load_model(model_uri)
out = model.predict(pd.DataFrame({"image": [open(p, "rb").read() for p in paths]}))
project = sorted(m for m in sys.modules if m.split(".")[0] in ("tasks", "cd4ml_runtime", "cd4ml_airflow"))
print(json.dumps({"labels": out["label"].tolist(), "confidence": out["confidence"].tolist(),
                  "columns": list(out.columns), "project": project, "path_changed": sys.path != path_before}))
"""


def test_logged_pyfunc_loads_in_a_fresh_process_and_classifies_png_and_jpeg(trained: Trained, tmp_path: Path) -> None:
    from tasks.data.sample_data import digits_arrays

    images, labels = digits_arrays()
    paths, expected = [], []
    for i in range(20):
        fmt = "PNG" if i % 2 == 0 else "JPEG"
        path = tmp_path / f"digit_{i}.{fmt.lower()}"
        path.write_bytes(encode(images[i], fmt))
        paths.append(str(path))
        expected.append(str(int(labels[i])))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, trained.settings.tracking_uri, trained.result.model_uri, *paths],
        cwd=tmp_path,  # not the repository: the model must run from what it carries
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["columns"] == ["label", "confidence"]
    assert out["project"] == [] and not out["path_changed"]  # the model ran its own runtime copy, imported no project code
    correct = sum(p == e for p, e in zip(out["labels"], expected))
    assert correct >= 16, (out["labels"], expected)
    assert all(0.0 < c <= 1.0 for c in out["confidence"])


def test_raw_version_is_none_when_the_curated_commit_does_not_name_it(tmp_path: Path) -> None:
    from tasks.training.train import raw_version_of

    uri = str(tmp_path / "curated")
    v0 = write_curated_digits(uri, raw_version=None, limit=50)
    v1 = write_curated_digits(uri, raw_version=9, limit=50)
    assert raw_version_of(uri, v0) is None
    assert raw_version_of(uri, v1) == 9


def test_a_version_without_val_rows_is_refused_with_a_clear_error(trained: Trained, tmp_path: Path) -> None:
    from tasks.training.train import NoTrainingDataError, train

    uri = str(tmp_path / "curated")
    version = write_curated_digits(uri, splits=("train", "test"))
    with pytest.raises(NoTrainingDataError, match="0 val rows"):
        train(trained.settings, uri, version, "manual__noval", "2026-11-21")


def _with_train_images_moved_to_test(uri: str, count: int) -> tuple[int, set[str]]:
    """The digits with the first ``count`` train images in the test split: (version, their sha256)."""
    import pyarrow as pa

    from tasks.curation.curate import CURATED_SCHEMA
    from tasks.data import lake

    moved = {r["sha256"] for r in split_rows("train")[:count]}
    rows = [{**r, "split": "test"} if r["sha256"] in moved else r for r in curated_rows()]
    return lake.overwrite(uri, pa.Table.from_pylist(rows, schema=CURATED_SCHEMA), metadata={"raw_version": 3}), moved


def test_fine_tuning_starts_from_a_registered_version_and_names_it(trained: Trained, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.models.registry import get_model_version, mlflow_client, register_candidate
    from tasks.models.seen_images import seen_by_model
    from tasks.training.train import train, training_config_hash

    s = with_model_name(trained.settings, "finetune")
    client: MlflowClient = mlflow_client(s)
    # registered as the pipeline does (with its file manifest: a version without one is not loaded)
    version = get_model_version(client, s.registry.model_name, register_candidate(s, trained.result.mlflow_run_id))
    client.set_registered_model_alias(s.registry.model_name, "champion", version.version)

    tuned = fast(s, epochs=1, finetune_from=f"models:/{s.registry.model_name}@champion", freeze_backbone=True)
    curated, moved = _with_train_images_moved_to_test(str(tmp_path / "curated"), 30)
    result = train(tuned, str(tmp_path / "curated"), curated, "manual__finetune", "2026-11-21")
    pinned = f"models:/{s.registry.model_name}/{version.version}"
    run = client.get_run(result.mlflow_run_id)
    assert run.data.tags["cd4ml.finetuned_from"] == pinned  # the alias, resolved: lineage names one version
    assert run.data.tags["cd4ml.config_hash"] == training_config_hash(tuned, pinned)
    # One epoch on a frozen, already trained backbone is as good as the source model.
    assert result.metrics["best_val_accuracy"] >= trained.result.metrics["best_val_accuracy"] - 0.02
    # It saw its own train and val images and its source's: the 30 now in test were learned from too.
    source_seen = seen_by_model(s, pinned)
    assert moved <= source_seen and seen_by_model(s, result.model_uri) == source_seen


def test_cli_train_prints_the_result_and_reuses_the_finished_run(
    trained: Trained, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tasks.cli import main

    result_file = tmp_path / "xcom" / "return.json"
    code = main(
        ["train", "--curated-version", str(trained.version), "--run-id", "cli__retry", "--logical-date", "2026-11-21",
         "--set", "epochs=4", "--launcher", "in_process", "--result-file", str(result_file)]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reused"] is True and out["mlflow_run_id"] == trained.result.mlflow_run_id
    assert json.loads(result_file.read_text()) == out


def test_the_kubernetes_launcher_builds_a_trainer_pod_that_runs_the_cli(trained: Trained) -> None:
    from tasks.cli import build_parser
    from tasks.training.train import LauncherError, train, trainer_pod_spec, with_training

    s = with_training(trained.settings, {"launcher": "kubernetes", "kubernetes": {"gpus": 4, "image": "reg/cd4ml-trainer:1"}})
    pod = trainer_pod_spec(s, s.curated_table, trained.version, "scheduled__2026-11-21", "2026-11-21")
    assert pod.image == "reg/cd4ml-trainer:1" and pod.cmds == ["cd4ml"]
    assert pod.resources["limits"]["nvidia.com/gpu"] == "4"
    assert pod.env_vars["CD4ML_ENV"] == "sit" and pod.env_vars["CD4ML_HOME"] == pod.mount_path
    assert "MLFLOW_TRACKING_URI" in pod.secret_env and "MLFLOW_TRACKING_URI" not in pod.env_vars
    args = build_parser().parse_args(pod.arguments)  # the pod's command line is one the CLI accepts
    assert (args.command, args.curated_version, args.launcher, args.nproc_per_node) == ("train", trained.version, "torchrun", 4)
    assert args.curated_table.startswith(pod.mount_path) and args.run_id == "scheduled__2026-11-21"
    assert args.result_file == "/airflow/xcom/return.json"  # the TrainResult reaches XCom
    assert pod == trainer_pod_spec(s, s.curated_table, trained.version, "scheduled__2026-11-21", "2026-11-21")
    with pytest.raises(LauncherError, match="trainer_pod_spec"):
        train(s, s.curated_table, trained.version, "manual__k8s", "2026-11-21", force=True)
