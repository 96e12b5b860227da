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
2. **tuning** (Param `tune`): an Optuna study (SQLite locally, PostgreSQL in production)
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
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import CURATED_IMAGES
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.context import check_run_params, fail_fast_on_data_errors, input_version, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs
from cd4ml_airflow.notifier import alert_from_context
from cd4ml_airflow.release import release_flow

ON_KUBERNETES = SETTINGS.training.launcher == "kubernetes"


def _run_tags(data: dict, drift: dict, best: dict) -> dict:
    """Lineage the training run carries beyond its data version: sample name, drift outcome, tuning study."""
    tags = {"cd4ml.drift.status": drift["status"], "cd4ml.drift.report": drift["report_path"]}
    if data.get("sample"):
        tags["cd4ml.sample"] = data["sample"]
    if best:
        tags["cd4ml.optuna_study"] = best["study_name"]
    return tags


def _overrides(params, best: dict) -> dict:
    """Training fields for this run: the UI's overrides, the model choice, then the best trial."""
    overrides = dict(params["training_overrides"] or {})
    if params["model"]:
        overrides["model"] = params["model"]
    return {**overrides, **(best or {})}


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
    @task
    def resolve_input(**context) -> dict:
        """Pin the curated version this run works on (and, in a sampling environment, its named sample)."""
        from tasks.data import lake
        from tasks.data.sampling import training_data
        from tasks.settings import load_settings

        settings = load_settings()
        params = context["params"]
        check_run_params(context, settings)  # every Param, before drift, tuning and training
        with fail_fast_on_data_errors():
            if params["curated_version"] is None and params["dataset_version"]:
                version = lake.resolve_dataset_version(settings.curated_table, params["dataset_version"],
                                                       settings.raw_table)
            else:
                version = input_version(
                    context, param="curated_version", asset=CURATED_IMAGES, extra_key="curated_version",
                    table_uri=settings.curated_table,
                )
            data = training_data(settings, settings.curated_table, version, context["run_id"])
        if data["sample"]:
            print(f"training on {data['sample']}: {data['table']} v{data['version']} (curated v{version})")
        return {"curated_table": data["table"], "curated_version": data["version"], "sample": data["sample"],
                "source_curated_version": version}

    @task
    def drift_check(data: dict, **context) -> dict:
        """New training data against the champion's training data."""
        from tasks.alerting.delivery import send
        from tasks.models.champion import champion_info
        from tasks.monitoring.drift import DriftReference, blocks, check_drift, enforce_policy
        from tasks.settings import load_settings

        settings = load_settings()
        current = champion_info(settings)
        reference = (
            DriftReference(current.curated_table, current.curated_version, current.version) if current else None
        )
        with fail_fast_on_data_errors():
            result = check_drift(settings, data["curated_table"], data["curated_version"], reference, context["run_id"])
        print(f"drift: {result.status} ({result.reason}); report: {result.report_path} {result.html_path or ''}")
        if result.status == "drift":
            block = blocks(settings, result)
            send(alert_from_context(
                context, settings, settings.env, kind="drift", severity="critical" if block else "warning",
                summary=("training blocked: " if block else "") + f"data drift against champion "
                        f"v{result.champion_version}: {result.reason}",
                error=result.reason, details={"report": result.report_path, "html": result.html_path,
                                              "tests": result.tests, "severity": result.severity},
                # block: the run's own incident, so the task's failure callback does not page again
                dedup_key=None if block else f"{settings.env}:drift:{data['curated_table']}:v{data['curated_version']}"
                                             f":champion-v{result.champion_version}"), settings)
            with fail_fast_on_data_errors():
                enforce_policy(settings, result)
        return result.to_dict()

    @task.short_circuit
    def retrain_gate(drift: dict, **context) -> bool:
        """Policy `retrain`: go on only when the new data drifted (or no champion, or force_retrain)."""
        from tasks.monitoring.drift import DriftResult, should_train
        from tasks.settings import load_settings

        go, why = should_train(load_settings(), DriftResult(**drift), bool(context["params"]["force_retrain"]))
        print(why)
        return go

    @task
    def create_study(data: dict, **context) -> dict:
        """Create (or reopen, on retry) the Optuna study and its parent MLflow run."""
        from tasks.settings import load_settings
        from tasks.training.tune import create_study as create

        if not context["params"]["tune"]:
            return {"enabled": False, "n_trials": 0}
        settings = load_settings()
        name = f"{settings.env}-v{data['curated_version']}-{context['run_id']}"
        with fail_fast_on_data_errors():
            study = create(settings, name, curated_table=data["curated_table"],
                           curated_version=data["curated_version"], run_id=context["run_id"],
                           logical_date=logical_date_of(context))
        return {"enabled": True, **study.to_dict()}

    @task
    def trial_indices(study: dict) -> list[int]:
        return list(range(study["n_trials"]))

    @task(max_active_tis_per_dagrun=4)
    def tune_trial(trial_index: int, study: dict, data: dict) -> dict:
        """One trial (a nested MLflow run); the pruner may stop it early. Retries are keyed by index."""
        from tasks.settings import load_settings
        from tasks.training.tune import run_trial

        with fail_fast_on_data_errors():
            result = run_trial(load_settings(), study["study_name"], trial_index, data["curated_table"],
                               data["curated_version"], study["parent_run_id"])
        print(f"trial {trial_index}: {result.state} value={result.value} params={result.params}")
        return result.to_dict()

    @task(trigger_rule="all_done")  # failed trials must not stop the study's best one from training
    def best_params(study: dict | None) -> dict:
        """The best completed trial's parameters ({} when tuning is off)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from tasks.settings import load_settings
        from tasks.training.tune import best_params as best

        if study is None:  # all_done also runs it when create_study failed: nothing to choose from, no retries
            raise AirflowSkipException("no tuning study: create_study did not finish")
        if not study["enabled"]:
            return {}
        with fail_fast_on_data_errors():
            params = best(load_settings(), study["study_name"], parent_run_id=study["parent_run_id"])
        print(f"best trial of {study['study_name']}: {params}")
        return {"study_name": study["study_name"], "params": params}

    data = resolve_input()
    drift = drift_check(data)
    gate = retrain_gate(drift)  # training and everything after it are skipped when the gate says no
    study = create_study(data)
    trials = tune_trial.partial(study=study, data=data).expand(trial_index=trial_indices(study))
    best = best_params(study)
    trials >> best

    if ON_KUBERNETES:
        from cd4ml_airflow.trainer_pod import trainer_operator

        @task
        def trainer_pod(data: dict, drift: dict, best: dict, **context) -> dict:
            """The per-run part of the trainer pod: its name and `cd4ml train` arguments."""
            from tasks.settings import load_settings
            from tasks.training.train import trainer_pod_spec

            return trainer_pod_spec(
                load_settings(), data["curated_table"], data["curated_version"], run_id=context["run_id"],
                logical_date=logical_date_of(context), force=bool(context["params"]["force_retrain"]),
                overrides=_overrides(context["params"], best.get("params")),
            ).to_dict()

        train_op = trainer_operator(SETTINGS)
        gate >> trainer_pod(data, drift, best) >> train_op
        trained = train_op.output
    else:

        @task
        def train(data: dict, drift: dict, best: dict, **context) -> dict:
            """Train on the pinned curated version; tracked in MLflow; resumes from its checkpoint on retry."""
            from tasks.settings import load_settings
            from tasks.training.train import train as run_training

            with fail_fast_on_data_errors():
                result = run_training(
                    load_settings(), data["curated_table"], data["curated_version"], run_id=context["run_id"],
                    logical_date=logical_date_of(context), force=bool(context["params"]["force_retrain"]),
                    overrides=_overrides(context["params"], best.get("params")),
                    tags=_run_tags(data, drift, best),
                )
            print(f"MLflow run: {result.mlflow_run_id} (reused={result.reused}, resumed from epoch "
                  f"{result.resumed_from_epoch})  metrics: {result.metrics}")
            return result.to_dict()

        trained = train(data, drift, best)
        gate >> trained

    @task
    def register(trained: dict, drift: dict) -> dict:
        """Register the candidate with its lineage (the drift report among its run's artifacts); no alias moves."""
        from tasks.models.registry import register_candidate
        from tasks.monitoring.drift import log_report
        from tasks.settings import load_settings

        settings = load_settings()
        log_report(settings, trained["mlflow_run_id"], drift)
        with fail_fast_on_data_errors():
            version = register_candidate(settings, trained["mlflow_run_id"])
        print(f"candidate: {SETTINGS.registry.model_name} v{version} (run {trained['mlflow_run_id']})")
        return {"version": version, "run_id": trained["mlflow_run_id"]}

    release_flow(register(trained, drift), data)


cd4ml_train()
