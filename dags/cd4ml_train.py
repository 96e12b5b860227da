"""
### cd4ml_train: curated version -> drift check -> (tuning) -> training -> gate -> registry

Triggered by the `curated_images` Asset, or by hand with an explicit `curated_version` or a
`dataset_version` (a version number, a name such as `release-3`, or a timestamp).

1. **drift_check**: the images added since the champion's training data against that data, on
   the champion's own softmax (KS) and embedding (MMD) plus a label chi-square (tasks/monitoring/drift.py);
   a detected drift is harmful when it costs the champion more than `drift.harmful_accuracy_drop` of
   accuracy on the new labelled images. `drift.policy` `warn` alerts and trains, `block` (prod)
   stops here with one alert on harmful drift (a harmless one warns and trains), `retrain`
   trains only on drifted data (**retrain_gate** skips the rest otherwise). First run:
   no champion, skipped and said so.
2. **tuning** (Param `tune`), after the gate: an Optuna study (SQLite locally, PostgreSQL in production)
   whose trials run as mapped tasks, on as many workers as are free; each trial is a nested
   MLflow run and bad trials are pruned early. The best trial's parameters train the candidate.
3. **train**: torch on that exact curated version, tracked in MLflow with the Delta table and
   version it read; a checkpoint every epoch, so a retried task resumes where it was killed.
   Where it runs is a setting (`training.launcher`): this worker, a torchrun subprocess
   (DDP), or a pod of the trainer image (KubernetesPodOperator). The same version with the
   same training settings reuses the finished run unless `force_retrain` is set.
4. **register**: the candidate becomes a version of this environment's registered model, with
   its lineage (data versions, drift status, git commit, requirements hash) as tags.
5. **evaluate_gate -> mark_challenger -> [approval_request -> approve] -> promote -> finish**:
   the shared release tail (`cd4ml_airflow.release`): a paired, per-class, smoke-tested gate
   against the champion; a pass makes it `challenger`; `champion` moves at once where
   `release.approval` is `none` (sit, uat) and after a person approves in the Required Actions
   page where it is `required` (prod). A reject or timeout is recorded and alerted.

In an environment with `training_data.sample_fraction` below 1 (sit), training, drift and the gate
use a deterministic, named sample of the curated version (tasks/data/sampling.py).

Task bodies: `plugins/cd4ml_airflow/steps/train.py`; the release tail: `plugins/cd4ml_airflow/release.py`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from cd4ml_airflow.assets import CURATED_IMAGES
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.release import release_flow
from cd4ml_airflow.steps.train import (
    ON_KUBERNETES,
    drift_check,
    register,
    resolve_input,
    retrain_gate,
    training,
    tuning,
)


@dag(
    schedule=[CURATED_IMAGES],
    params={
        "curated_version": Param(
            None, type=["null", "integer"], minimum=0,
            description="curated_images version to train on; empty = the one the triggering event names "
            "(or, for a manual run, the one curated for this logical date).",
        ),
        "dataset_version": Param(
            None, type=["null", "string"],
            description="Train on a named dataset version instead: a curated version number, a name given to a "
            "curated or raw version (e.g. release-3), or an ISO timestamp (time travel).",
        ),
        "model": Param(None, type=["null", "string"], enum=[None, "small_cnn", "resnet18", "resnet50"],
                       description="Architecture; empty = the environment's setting."),
        "training_overrides": Param(
            {}, type="object",
            description='Training settings for this run only, e.g. {"epochs": 30, "finetune_from": '
            '"models:/digits-classifier-sit@champion"}. Validated like the settings file.',
        ),
        "tune": Param(SETTINGS.tuning.on_by_default, type="boolean",
                      description="Run an Optuna study first and train with its best trial."),
        "force_retrain": Param(False, type="boolean", description="Train again even if a finished run exists."),
    },
    render_template_as_native_obj=ON_KUBERNETES,  # the pod's arguments render as a list
    **dag_kwargs("cd4ml_train", ["training", "drift", "tuning", "gate", "registry", "release"], __doc__),
)
def cd4ml_train():
    data = resolve_input()
    drift = drift_check(data)
    gate = retrain_gate(drift)  # training and everything after it are skipped when the gate says no
    trained = training(gate, data, drift, tuning(gate, data))
    release_flow(register(trained, drift), data)


cd4ml_train()
