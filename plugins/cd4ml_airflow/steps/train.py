"""cd4ml_train's tasks: the input version, the drift check, tuning, training and registration.

``tuning(gate, data)`` and ``training(gate, data, drift, best)`` wire the parts with more than one task;
where training runs is a setting read at parse time (``training.launcher``): this worker (the
``train`` task) or a pod of the trainer image (``trainer_pod`` then a KubernetesPodOperator named
``train``).
"""

from __future__ import annotations

from airflow.sdk import task

from cd4ml_airflow.assets import CURATED_IMAGES
from cd4ml_airflow.config import SETTINGS
from cd4ml_airflow.context import fail_fast_on_data_errors, input_version, logical_date_of
from cd4ml_airflow.notifier import origin_of
from cd4ml_airflow.steps.shape import step

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


@task
@step(checks_params=True)  # every Param, before drift, tuning and training
def resolve_input(settings, context) -> dict:
    """Pin the curated version this run works on, the raw version it was curated from (and, in a sampling
    environment, its named sample)."""
    from tasks.data import lake
    from tasks.data.sampling import training_data
    from tasks.monitoring.drift import recorded_raw_version

    params = context["params"]
    if params["curated_version"] is None and params["dataset_version"]:
        version = lake.resolve_dataset_version(settings.curated_table, params["dataset_version"], settings.raw_table)
    else:
        version = input_version(context, param="curated_version", asset=CURATED_IMAGES, extra_key="curated_version",
                                table_uri=settings.curated_table)
    data = training_data(settings, settings.curated_table, version, context["run_id"])
    if data["sample"]:
        print(f"training on {data['sample']}: {data['table']} v{data['version']} (curated v{version})")
    return {"curated_table": data["table"], "curated_version": data["version"], "sample": data["sample"],
            "source_curated_version": version, "raw_version": recorded_raw_version(settings.curated_table, version)}


@task
@step(fail_fast=False)  # the champion lookup is left to retries, like any registry call
def drift_check(settings, context, data: dict):
    """New training data against the champion's training data."""
    from tasks.alerting import policy as alert_policy
    from tasks.alerting.delivery import send
    from tasks.models.champion import champion_info
    from tasks.monitoring.drift import DriftReference, blocks, check_drift, enforce_policy

    current = champion_info(settings)
    reference = (DriftReference(current.curated_table, current.curated_version, current.version, current.raw_version)
                 if current else None)
    with fail_fast_on_data_errors():  # the batch as ingested: the raw version this curated version was built from
        result = check_drift(settings, data["curated_table"], data["curated_version"], reference, context["run_id"],
                             raw_version=data.get("raw_version"))
    print(f"drift: {result.status} ({result.reason}); report: {result.report_path} {result.html_path or ''}")
    if result.status == "drift":
        send(alert_policy.drift(origin_of(context, settings, settings.env), result, table=data["curated_table"],
                                version=data["curated_version"], blocking=blocks(settings, result)), settings)
        with fail_fast_on_data_errors():
            enforce_policy(settings, result)
    return result


@task.short_circuit
@step(fail_fast=False)
def retrain_gate(settings, context, drift: dict) -> bool:
    """Policy `retrain`: go on only when the new data drifted (or no champion, or force_retrain)."""
    from tasks.monitoring.drift import DriftResult, should_train

    go, why = should_train(settings, DriftResult(**drift), bool(context["params"]["force_retrain"]))
    print(why)
    return go


@task
@step()
def create_study(settings, context, data: dict) -> dict:
    """Create (or reopen, on retry) the Optuna study and its parent MLflow run."""
    from tasks.training.tune import create_study as create

    if not context["params"]["tune"]:
        return {"enabled": False, "n_trials": 0}
    name = f"{settings.env}-v{data['curated_version']}-{context['run_id']}"
    study = create(settings, name, curated_table=data["curated_table"], curated_version=data["curated_version"],
                   run_id=context["run_id"], logical_date=logical_date_of(context))
    return {"enabled": True, **study.to_dict()}


@task
def trial_indices(study: dict) -> list[int]:
    return list(range(study["n_trials"]))


@task(max_active_tis_per_dagrun=4)
@step()
def tune_trial(settings, context, trial_index: int, study: dict, data: dict):
    """One trial (a nested MLflow run); the pruner may stop it early. Retries are keyed by index."""
    from tasks.training.tune import run_trial

    result = run_trial(settings, study["study_name"], trial_index, data["curated_table"], data["curated_version"],
                       study["parent_run_id"])
    print(f"trial {trial_index}: {result.state} value={result.value} params={result.params}")
    return result


@task(trigger_rule="all_done")  # failed trials must not stop the study's best one from training
@step()
def best_params(settings, context, study: dict | None) -> dict:
    """The best completed trial's parameters ({} when tuning is off)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tasks.training.tune import best_params as best

    if study is None:  # all_done also runs it when create_study failed: nothing to choose from, no retries
        raise AirflowSkipException("no tuning study: create_study did not finish")
    if not study["enabled"]:
        return {}
    params = best(settings, study["study_name"], parent_run_id=study["parent_run_id"])
    print(f"best trial of {study['study_name']}: {params}")
    return {"study_name": study["study_name"], "params": params}


def tuning(gate, data):
    """create_study -> one mapped tune_trial per trial -> best_params (the best trial's parameters, or {}).

    After the drift gate: a run the gate stops spends no trial, and the trials are the only tasks of the run
    left to start, so they start together on as many workers as are free (drift_check beside them held a
    slot, and the trials then queued one at a time)."""
    study = create_study(data)
    gate >> study
    trials = tune_trial.partial(study=study, data=data).expand(trial_index=trial_indices(study))
    best = best_params(study)
    trials >> best
    return best


@task
@step(fail_fast=False)
def trainer_pod(settings, context, data: dict, drift: dict, best: dict):
    """The per-run part of the trainer pod: its name and `cd4ml train` arguments."""
    from tasks.training.train import trainer_pod_spec

    return trainer_pod_spec(
        settings, data["curated_table"], data["curated_version"], run_id=context["run_id"],
        logical_date=logical_date_of(context), force=bool(context["params"]["force_retrain"]),
        overrides=_overrides(context["params"], best.get("params")),
    )


@task
@step(says=lambda r: (f"MLflow run: {r.mlflow_run_id} (reused={r.reused}, resumed from epoch "
                      f"{r.resumed_from_epoch})  metrics: {r.metrics}"))
def train(settings, context, data: dict, drift: dict, best: dict):
    """Train on the pinned curated version; tracked in MLflow; resumes from its checkpoint on retry."""
    from tasks.training.train import train as run_training

    return run_training(
        settings, data["curated_table"], data["curated_version"], run_id=context["run_id"],
        logical_date=logical_date_of(context), force=bool(context["params"]["force_retrain"]),
        overrides=_overrides(context["params"], best.get("params")), tags=_run_tags(data, drift, best),
    )


def training(gate, data, drift, best):
    """The `train` task after the drift gate, here or in a pod (module doc); returns its result (XCom)."""
    if not ON_KUBERNETES:
        trained = train(data, drift, best)
        gate >> trained
        return trained
    from cd4ml_airflow.trainer_pod import trainer_operator

    train_op = trainer_operator(SETTINGS)
    gate >> trainer_pod(data, drift, best) >> train_op
    return train_op.output


@task
@step()
def register(settings, context, trained: dict, drift: dict) -> dict:
    """Register the candidate with its lineage (the drift report among its run's artifacts); no alias moves."""
    from tasks.models.registry import register_candidate
    from tasks.monitoring.drift import log_report

    log_report(settings, trained["mlflow_run_id"], drift)
    version = register_candidate(settings, trained["mlflow_run_id"])
    print(f"candidate: {settings.registry.model_name} v{version} (run {trained['mlflow_run_id']})")
    return {"version": version, "run_id": trained["mlflow_run_id"]}
