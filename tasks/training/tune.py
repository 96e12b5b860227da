"""Hyperparameter tuning with Optuna: one study, many workers, one trial per Airflow mapped task.

* The study lives in a relational store: SQLite under CD4ML_HOME locally
  (``tuning.storage``), PostgreSQL in production (``CD4ML_OPTUNA_STORAGE``, so the password
  never sits in conf/). Workers share it through the ask/tell API, so trials can run as
  mapped tasks on several Celery workers at once.
* ``create_study`` makes the study (idempotent) and the parent MLflow run that every trial
  nests under; ``run_trial`` asks for one trial, trains it with the real training loop
  (``tasks.training.launch.run_worker``, in this process, no checkpoints, no logged model),
  reports val accuracy each epoch and stops when the pruner (median, successive halving or
  Hyperband, ``tuning.pruner``) says so; ``best_params`` closes the parent run and returns the
  best trial's parameters, which ``tasks.training.train.train(..., overrides=params)`` turns into the
  candidate.
* Retries: a mapped task that runs again for a trial index already COMPLETE or PRUNED returns
  that trial; one whose earlier attempt died mid-trial marks the orphan FAIL and asks anew.
* The search space is data (``tuning.search_space``): training field -> float/int range or
  choices. Each worker seeds its sampler with ``tuning.seed + trial_index``, so concurrent
  workers do not propose identical random start points.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tasks.models.registry import LINEAGE_RUN_TAGS, TAG_CONFIG_HASH, ensure_experiment, mlflow_client
from tasks.settings import SearchParam, Settings, TuningSettings
from tasks.training.data_cache import ensure_cache, load_cache
from tasks.training.launch import run_worker
from tasks.training.request import WorkerRequest
from tasks.training.train import lineage_tags, raw_version_of, training_config_hash, with_training

log = logging.getLogger(__name__)

STORAGE_ENV = "CD4ML_OPTUNA_STORAGE"
TAG_STUDY = "cd4ml.optuna_study"
TAG_TRIAL = "cd4ml.optuna_trial"
TAG_TRIAL_STATE = "cd4ml.trial_state"
ATTR_PARENT_RUN = "mlflow_parent_run_id"
ATTR_TRIAL_INDEX = "trial_index"
ATTR_RUN = "mlflow_run_id"


class NoFinishedTrialError(RuntimeError):
    """``best_params`` was asked before any trial completed."""


@dataclass(frozen=True)
class TuningStudy:
    study_name: str
    parent_run_id: str
    n_trials: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrialResult:
    study_name: str
    trial_index: int
    trial_number: int
    state: str  # COMPLETE | PRUNED
    params: dict[str, Any]
    value: float | None
    epochs_run: int
    mlflow_run_id: str | None
    reused: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_storage_uri(settings: Settings) -> str:
    """The study store: ``CD4ML_OPTUNA_STORAGE`` (e.g. postgresql://...) or ``tuning.storage``."""
    return os.environ.get(STORAGE_ENV) or settings.tuning.storage


def _storage(uri: str) -> optuna.storages.RDBStorage:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}}  # several local workers share one file
    else:
        engine_kwargs = {"pool_pre_ping": True}
    return optuna.storages.RDBStorage(uri, engine_kwargs=engine_kwargs)


def make_pruner(tuning: TuningSettings) -> optuna.pruners.BasePruner:
    """The pruner named by ``tuning.pruner``; the resource is the epoch."""
    if tuning.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=tuning.n_startup_trials, n_warmup_steps=tuning.n_warmup_steps)
    if tuning.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=tuning.min_resource, reduction_factor=tuning.reduction_factor
        )
    if tuning.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=tuning.min_resource, max_resource=tuning.epochs_per_trial, reduction_factor=tuning.reduction_factor
        )
    return optuna.pruners.NopPruner()


def make_sampler(tuning: TuningSettings, trial_index: int = 0) -> optuna.samplers.BaseSampler:
    seed = tuning.seed + trial_index
    if tuning.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def suggest(trial: Trial, space: dict[str, SearchParam]) -> dict[str, Any]:
    """Draw one value per search-space entry (enqueued trials get their fixed values back)."""
    params: dict[str, Any] = {}
    for name, spec in space.items():
        if spec.type == "float":
            params[name] = trial.suggest_float(name, float(spec.low), float(spec.high), log=spec.log)  # type: ignore[arg-type]
        elif spec.type == "int":
            params[name] = trial.suggest_int(name, int(spec.low), int(spec.high), log=spec.log)  # type: ignore[arg-type]
        else:
            params[name] = trial.suggest_categorical(name, list(spec.choices or ()))
    return params


def _load(settings: Settings, study_name: str, uri: str | None, trial_index: int = 0) -> optuna.Study:
    tuning = settings.tuning
    return optuna.load_study(
        study_name=study_name,
        storage=_storage(uri or resolve_storage_uri(settings)),
        sampler=make_sampler(tuning, trial_index),
        pruner=make_pruner(tuning),
    )


def create_study(
    settings: Settings,
    study_name: str,
    storage_uri: str | None = None,
    *,
    curated_table: str | None = None,
    curated_version: int | None = None,
    run_id: str = "",
    logical_date: str = "",
) -> TuningStudy:
    """Create (or find) the study and its parent MLflow run; safe to call again on a retry."""
    tuning = settings.tuning
    uri = storage_uri or resolve_storage_uri(settings)
    study = optuna.create_study(
        study_name=study_name, storage=_storage(uri), direction="maximize", load_if_exists=True,
        sampler=make_sampler(tuning), pruner=make_pruner(tuning),
    )
    client = mlflow_client(settings)
    parent = study.user_attrs.get(ATTR_PARENT_RUN)
    if parent is None:
        tags = {TAG_STUDY: study_name, "cd4ml.tuning": "parent"}
        if curated_table is not None and curated_version is not None:
            raw_version = raw_version_of(curated_table, int(curated_version))
            tags |= lineage_tags(
                settings, curated_table, int(curated_version), raw_version, training_config_hash(settings), run_id, logical_date
            )
        run = client.create_run(ensure_experiment(settings, client), run_name=f"tune-{study_name}", tags=tags)
        parent = run.info.run_id
        for key, value in {
            "pruner": tuning.pruner,
            "sampler": tuning.sampler,
            "n_trials": tuning.n_trials,
            "epochs_per_trial": tuning.epochs_per_trial,
            "search_space": json.dumps({k: v.model_dump(exclude_none=True) for k, v in tuning.search_space.items()}),
        }.items():
            client.log_param(parent, key, str(value))
        study.set_user_attr(ATTR_PARENT_RUN, parent)
    return TuningStudy(study_name=study_name, parent_run_id=parent, n_trials=tuning.n_trials)


def _result(study_name: str, trial: FrozenTrial, reused: bool) -> TrialResult:
    return TrialResult(
        study_name=study_name,
        trial_index=int(trial.user_attrs.get(ATTR_TRIAL_INDEX, -1)),
        trial_number=trial.number,
        state=trial.state.name,
        params=dict(trial.params),
        value=trial.value if trial.state == TrialState.COMPLETE else None,
        epochs_run=len(trial.intermediate_values),
        mlflow_run_id=trial.user_attrs.get(ATTR_RUN),
        reused=reused,
    )


def run_trial(
    settings: Settings,
    study_name: str,
    trial_index: int,
    curated_table: str,
    curated_version: int,
    parent_run_id: str,
    storage_uri: str | None = None,
) -> TrialResult:
    """Ask the shared study for one trial, train it (pruned early if the pruner says so), tell the result."""
    tuning = settings.tuning
    study = _load(settings, study_name, storage_uri, trial_index)
    for earlier in study.get_trials(deepcopy=False):
        if earlier.user_attrs.get(ATTR_TRIAL_INDEX) != trial_index:
            continue
        if earlier.state in (TrialState.COMPLETE, TrialState.PRUNED):
            log.info("trial index %d already ran as trial %d (%s)", trial_index, earlier.number, earlier.state.name)
            return _result(study_name, earlier, reused=True)
        if earlier.state == TrialState.RUNNING:  # the attempt that ran it died
            study.tell(earlier.number, state=TrialState.FAIL)

    trial = study.ask()
    trial.set_user_attr(ATTR_TRIAL_INDEX, trial_index)
    try:
        params = suggest(trial, tuning.search_space)
        trial_settings = with_training(
            settings, {**params, "epochs": tuning.epochs_per_trial, "launcher": "in_process", "nproc_per_node": 1}
        )
        cfg = trial_settings.training
        client = mlflow_client(trial_settings)
        cache_path = ensure_cache(cfg.cache_dir, curated_table, int(curated_version), cfg.image_size, cfg.channels, cfg.fit)
        cached = load_cache(cache_path)
        parent_tags = client.get_run(parent_run_id).data.tags
        tags = {k: parent_tags[k] for k in LINEAGE_RUN_TAGS if parent_tags.get(k)}
        tags |= {TAG_CONFIG_HASH: training_config_hash(trial_settings), TAG_STUDY: study_name, TAG_TRIAL: str(trial.number)}
        request = WorkerRequest(
            settings=trial_settings.model_dump(mode="json"),
            curated_table=curated_table,
            curated_version=int(curated_version),
            cache_path=cache_path,
            tracking_uri=trial_settings.tracking_uri,
            experiment_id=ensure_experiment(trial_settings, client),
            run_name=f"{study_name}-trial-{trial.number}",
            tags=tags,
            params={"optuna_trial": str(trial.number), "n_train": str(len(cached.y_train)), "n_val": str(len(cached.y_val))},
            parent_run_id=parent_run_id,
            log_model=False,
        )

        def report(epoch: int, metrics: dict[str, float]) -> bool:
            trial.report(metrics["val_accuracy"], epoch)
            return trial.should_prune()

        outcome = run_worker(request, report)
        if outcome is None:
            raise RuntimeError("a tuning trial runs in one process: rank 0 must return an outcome")
        trial.set_user_attr(ATTR_RUN, outcome.mlflow_run_id)
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    if outcome.stopped_by_callback:
        client.set_tag(outcome.mlflow_run_id, TAG_TRIAL_STATE, "pruned")
        study.tell(trial, state=TrialState.PRUNED)
    else:
        client.set_tag(outcome.mlflow_run_id, TAG_TRIAL_STATE, "complete")
        study.tell(trial, outcome.metrics["best_val_accuracy"])
    finished = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
    log.info("trial %d (index %d): %s after %d epochs, params %s", trial.number, trial_index, finished.state.name,
             outcome.epochs_run, params)
    return _result(study_name, finished, reused=False)


def best_params(
    settings: Settings, study_name: str, storage_uri: str | None = None, parent_run_id: str | None = None
) -> dict[str, Any]:
    """The best completed trial's parameters (training overrides); closes the parent MLflow run."""
    study = _load(settings, study_name, storage_uri)
    try:
        best = study.best_trial
    except ValueError as exc:
        raise NoFinishedTrialError(f"study {study_name!r} has no completed trial yet") from exc
    params = dict(best.params)
    parent = parent_run_id or study.user_attrs.get(ATTR_PARENT_RUN)
    if parent:
        client = mlflow_client(settings)
        logged = client.get_run(parent).data.params
        for key, value in params.items():
            if f"best.{key}" not in logged:
                client.log_param(parent, f"best.{key}", str(value))
        client.log_metric(parent, "best_val_accuracy", float(best.value))
        counts = {state.name.lower(): 0 for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
        for trial in study.get_trials(deepcopy=False):
            if trial.state.name.lower() in counts:
                counts[trial.state.name.lower()] += 1
        for state, count in counts.items():
            client.log_metric(parent, f"trials_{state}", float(count))
        client.set_tag(parent, "cd4ml.best_trial", str(best.number))
        if best.user_attrs.get(ATTR_RUN):
            client.set_tag(parent, "cd4ml.best_trial_run_id", str(best.user_attrs[ATTR_RUN]))
        client.set_terminated(parent, "FINISHED")
    return params


def apply_params(settings: Settings, params: dict[str, Any]) -> Settings:
    """Settings whose training section carries the tuned parameters (what the candidate trains with)."""
    return with_training(settings, params)
