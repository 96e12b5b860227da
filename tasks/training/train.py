"""Train the classifier on one explicit version of the curated table and log it to MLflow.

``train(settings, curated_table, curated_version, run_id, logical_date, force)`` is what the DAG
calls. The processes are started by ``tasks.training.launch``, the epoch loop is
``tasks.training.loop``, the decoded data ``tasks.training.data_cache`` (read through
``loader``, ``augment`` and ``device``).

* Input: ``curated_table`` at ``curated_version`` (time travel), never "latest". Train and val
  are decoded once into a local cache (``training.cache_dir``), in sha256 order, so row order in
  the Delta files does not change the result and later epochs and retries do not decode again.
* Where it runs is a setting (``training.launcher``): ``in_process`` (this process), ``torchrun``
  (a ``torchrun --nproc_per_node N`` subprocess: DDP, gloo on CPU, NCCL on GPU) or
  ``kubernetes`` (the trainer image in a pod, built by ``trainer_pod_spec`` and run by the DAG's
  KubernetesPodOperator; inside the pod ``cd4ml train`` calls this function again with
  ``in_process`` or ``torchrun``).
* Resumable: every epoch is checkpointed under a folder named by the curated table and version,
  the training config hash and the Airflow run id, so an Airflow retry of a killed task resumes
  from its last finished epoch in the same MLflow run. The folder is removed after success
  unless ``training.keep_checkpoints``.
* Idempotent: unless ``force``, a FINISHED run in this environment's experiment with the same
  curated table, curated version and training config hash is returned (``reused=True``) and
  nothing is trained. The hash leaves out how the work is executed (launcher, paths, threads,
  loader workers) and includes the exact model version fine-tuning starts from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from tasks.data import lake
from tasks.models.registry import (
    TAG_AIRFLOW_RUN_ID,
    TAG_CONFIG_HASH,
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    TAG_ENV,
    TAG_GIT_COMMIT,
    TAG_LOGICAL_DATE,
    TAG_MODEL_URI,
    TAG_RAW_VERSION,
    TAG_REQUIREMENTS_HASH,
    ensure_experiment,
    mlflow_client,
)
from tasks.settings import REPO_ROOT, Settings, SettingsError, TrainingSettings
from tasks.training.data_cache import (
    CachedSplits,
    NoTrainingDataError,
    class_order,
    ensure_cache,
    load_cache,
    load_split_rows,
)
from tasks.training.launch import launch
from tasks.training.loop import scaled_learning_rate
from tasks.training.request import WorkerOutcome, WorkerRequest
from tasks.training.tracking import TAG_BEST_EPOCH, TAG_EPOCHS_RUN

log = logging.getLogger(__name__)

TAG_LAUNCHER = "cd4ml.launcher"
TAG_WORLD_SIZE = "cd4ml.world_size"
TAG_RESUMED_FROM = "cd4ml.resumed_from_epoch"
TAG_FINETUNED_FROM = "cd4ml.finetuned_from"
# The final metrics a TrainResult carries (logged once, at the end of a run).
FINAL_METRICS = ("best_val_accuracy", "best_val_loss", "final_train_loss", "train_seconds", "train_images_per_second")
# Where KubernetesPodOperator(do_xcom_push=True) reads a pod's return value.
XCOM_RETURN_FILE = "/airflow/xcom/return.json"
# How the work is executed, not what is learned: left out of the config hash.
EXECUTION_FIELDS = ("launcher", "num_workers", "num_threads", "checkpoint_dir", "cache_dir", "keep_checkpoints", "kubernetes")

__all__ = [
    "FINAL_METRICS",
    "XCOM_RETURN_FILE",
    "LauncherError",
    "NoTrainingDataError",
    "TrainResult",
    "TrainerPod",
    "checkpoint_dir_for",
    "class_order",
    "load_split_rows",
    "raw_version_of",
    "train",
    "trainer_pod_spec",
    "training_config_hash",
    "with_training",
]


@dataclass(frozen=True)
class TrainResult:
    mlflow_run_id: str
    curated_table: str
    curated_version: int
    raw_version: int | None
    metrics: dict[str, float]
    epochs_run: int
    best_epoch: int
    model_uri: str
    reused: bool
    resumed_from_epoch: int = 0  # > 0: a checkpoint of a killed attempt was continued
    world_size: int = 1
    launcher: str = "in_process"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LauncherError(RuntimeError):
    """The configured launcher cannot run in this process (e.g. ``kubernetes`` outside a pod)."""


def git_commit(timeout_s: float = 5.0) -> str | None:
    """The repository's HEAD commit, best effort; in an image without .git, ``CD4ML_GIT_COMMIT`` (a build arg)."""
    baked = os.environ.get("CD4ML_GIT_COMMIT") or None
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return baked
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else baked


def requirements_hash() -> str:
    """sha256 (12 hex) of the pinned requirements and constraints this process was installed from."""
    digest = hashlib.sha256()
    for name in ("requirements.txt", "constraints.txt"):
        path = REPO_ROOT / name
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()[:12]


def raw_version_of(curated_table: str, curated_version: int) -> int | None:
    """The raw table version a curated version was built from (its commit's ``raw_version``)."""
    for commit in lake.history(curated_table):
        if commit.version == curated_version:
            value = commit.metadata.get("raw_version")
            try:
                return int(value) if value not in (None, "", "None") else None
            except ValueError:
                return None
    return None


def with_training(settings: Settings, overrides: Mapping[str, Any] | None) -> Settings:
    """Settings with some training fields replaced (Airflow Params, the best tuning trial), validated."""
    if not overrides:
        return settings
    merged = {**settings.training.model_dump(mode="json"), **dict(overrides)}
    try:
        training = TrainingSettings.model_validate(merged)
    except ValueError as exc:
        raise SettingsError(f"invalid training overrides {dict(overrides)}: {exc}") from exc
    return settings.model_copy(update={"training": training})


def training_config_hash(settings: Settings, finetune_uri: str | None = None) -> str:
    """Names what is learned: the training section minus execution fields, plus the start weights."""
    payload = {k: v for k, v in settings.training.model_dump(mode="json").items() if k not in EXECUTION_FIELDS}
    if finetune_uri:
        payload["finetune_from"] = finetune_uri
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _safe(text: str, limit: int = 60) -> str:
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:limit]
    return f"{clean}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def checkpoint_dir_for(settings: Settings, curated_table: str, curated_version: int, config_hash: str, run_id: str) -> Path:
    """One folder per (table, version, config, Airflow run): a retry of the same task finds it again."""
    table = _safe(Path(curated_table.rstrip("/")).name + "@" + curated_table, 40)
    return Path(settings.training.checkpoint_dir) / table / f"v{int(curated_version)}" / config_hash / _safe(str(run_id))


def resolve_model_uri(client: MlflowClient, uri: str) -> str:
    """``models:/name@alias`` -> ``models:/name/N``: lineage and the hash name one fixed version."""
    match = re.fullmatch(r"models:/([^/@]+)@(.+)", uri)
    if not match:
        return uri
    version = client.get_model_version_by_alias(match.group(1), match.group(2))
    return f"models:/{match.group(1)}/{version.version}"


def _find_reusable_run(
    client: MlflowClient, experiment_id: str, curated_table: str, curated_version: int, config_hash: str
) -> Any | None:
    runs = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.`{TAG_CURATED_TABLE}` = '{curated_table}' and "
            f"tags.`{TAG_CURATED_VERSION}` = '{curated_version}' and "
            f"tags.`{TAG_CONFIG_HASH}` = '{config_hash}' and "
            "attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time ASC"],
        max_results=20,
    )
    for run in runs:
        if run.data.tags.get(TAG_MODEL_URI):
            return run
    return None


def _result_from_run(run: Any, raw_version: int | None, reused: bool) -> TrainResult:
    tags, metrics = run.data.tags, run.data.metrics
    return TrainResult(
        mlflow_run_id=run.info.run_id,
        curated_table=tags[TAG_CURATED_TABLE],
        curated_version=int(tags[TAG_CURATED_VERSION]),
        raw_version=raw_version,
        metrics={k: float(metrics[k]) for k in FINAL_METRICS if k in metrics},
        epochs_run=int(tags[TAG_EPOCHS_RUN]),
        best_epoch=int(tags[TAG_BEST_EPOCH]),
        model_uri=tags[TAG_MODEL_URI],
        reused=reused,
        resumed_from_epoch=int(tags.get(TAG_RESUMED_FROM, "0")),
        world_size=int(tags.get(TAG_WORLD_SIZE, "1")),
        launcher=tags.get(TAG_LAUNCHER, "in_process"),
    )


def lineage_tags(
    settings: Settings, curated_table: str, curated_version: int, raw_version: int | None, config_hash: str, run_id: str, logical_date: str
) -> dict[str, str]:
    """Tags every training or tuning run carries: environment, data versions, config, Airflow run, commit."""
    tags = {
        TAG_ENV: settings.env,
        TAG_CURATED_TABLE: curated_table,
        TAG_CURATED_VERSION: str(int(curated_version)),
        TAG_RAW_VERSION: "" if raw_version is None else str(raw_version),
        TAG_CONFIG_HASH: config_hash,
        TAG_LOGICAL_DATE: str(logical_date),
        TAG_AIRFLOW_RUN_ID: str(run_id),
    }
    tags[TAG_REQUIREMENTS_HASH] = requirements_hash()
    commit = git_commit()
    if commit:
        tags[TAG_GIT_COMMIT] = commit
        tags["mlflow.source.git.commit"] = commit
    return tags


@dataclass(frozen=True)
class _Job:
    """What one ``train`` call is about: the data version, the config that names it, where it is tracked."""

    settings: Settings
    client: MlflowClient
    experiment_id: str
    curated_table: str
    curated_version: int
    raw_version: int | None
    finetune_uri: str | None  # the exact model version fine-tuning starts from
    config_hash: str
    run_id: str  # the Airflow run's
    logical_date: str


def _identify(settings: Settings, curated_table: str, curated_version: int, run_id: str, logical_date: str) -> _Job:
    """The experiment, the raw version behind the data and the config hash of this training."""
    cfg = settings.training
    client = mlflow_client(settings)
    experiment_id = ensure_experiment(settings, client)
    raw_version = raw_version_of(curated_table, curated_version)
    finetune_uri = resolve_model_uri(client, cfg.finetune_from) if cfg.finetune_from else None
    config_hash = training_config_hash(settings, finetune_uri)
    return _Job(
        settings, client, experiment_id, curated_table, curated_version, raw_version, finetune_uri, config_hash, run_id,
        logical_date,
    )


def _run_params(settings: Settings, cached: CachedSplits, world: int) -> dict[str, str]:
    """MLflow params beyond the training section: the data as decoded and the global batch."""
    cfg = settings.training
    return {
        "registered_model_name": settings.registry.model_name,
        "classes": ",".join(cached.classes),
        "preprocess": json.dumps(cached.spec.to_dict()),
        "n_train": str(len(cached.y_train)),
        "n_val": str(len(cached.y_val)),
        "world_size": str(world),
        "global_batch_size": str(cfg.batch_size * world),
        "effective_learning_rate": repr(scaled_learning_rate(cfg, world)),
    }


def _worker_request(job: _Job, tags: Mapping[str, str] | None) -> WorkerRequest:
    """Decode the version once (cached) and write down everything the training processes need."""
    settings, cfg = job.settings, job.settings.training
    cache_path = ensure_cache(cfg.cache_dir, job.curated_table, job.curated_version, cfg.image_size, cfg.channels, cfg.fit)
    world = cfg.nproc_per_node if cfg.launcher == "torchrun" else 1
    checkpoint_dir = checkpoint_dir_for(settings, job.curated_table, job.curated_version, job.config_hash, job.run_id)
    cached = load_cache(cache_path)
    run_tags = {
        **lineage_tags(
            settings, job.curated_table, job.curated_version, job.raw_version, job.config_hash, job.run_id, job.logical_date
        ),
        TAG_LAUNCHER: cfg.launcher,
        **({TAG_FINETUNED_FROM: job.finetune_uri} if job.finetune_uri else {}),
        **dict(tags or {}),
    }
    return WorkerRequest(
        settings=settings.model_dump(mode="json"),
        curated_table=job.curated_table,
        curated_version=job.curated_version,
        cache_path=cache_path,
        tracking_uri=settings.tracking_uri,
        experiment_id=job.experiment_id,
        run_name=f"train-{job.logical_date}",
        tags=run_tags,
        params=_run_params(settings, cached, world),
        checkpoint_dir=str(checkpoint_dir),
        finetune_uri=job.finetune_uri,
    )


def _settle(job: _Job, request: WorkerRequest, outcome: WorkerOutcome | None) -> TrainResult:
    """Check the outcome, tag a resumed run, drop the checkpoints (unless kept) and report."""
    cfg, where = job.settings.training, f"{job.curated_table}@v{job.curated_version}"
    if outcome is None or not outcome.model_uri:
        raise RuntimeError(f"training of {where} returned no model")
    if outcome.resumed_from_epoch:
        job.client.set_tag(outcome.mlflow_run_id, TAG_RESUMED_FROM, str(outcome.resumed_from_epoch))
    if not cfg.keep_checkpoints and request.checkpoint_dir:
        shutil.rmtree(request.checkpoint_dir, ignore_errors=True)
    log.info(
        "trained run %s on %s@v%d: best val_accuracy %.4f at epoch %d/%d (%s, %d process(es), %s)",
        outcome.mlflow_run_id, job.curated_table, job.curated_version, outcome.metrics["best_val_accuracy"],
        outcome.best_epoch, outcome.epochs_run, cfg.launcher, outcome.world_size, outcome.device,
    )
    return TrainResult(
        mlflow_run_id=outcome.mlflow_run_id,
        curated_table=job.curated_table,
        curated_version=job.curated_version,
        raw_version=job.raw_version,
        metrics=outcome.metrics,
        epochs_run=outcome.epochs_run,
        best_epoch=outcome.best_epoch,
        model_uri=outcome.model_uri,
        reused=False,
        resumed_from_epoch=outcome.resumed_from_epoch,
        world_size=outcome.world_size,
        launcher=cfg.launcher,
    )


def train(
    settings: Settings,
    curated_table: str,
    curated_version: int,
    run_id: str,
    logical_date: str,
    force: bool = False,
    *,
    overrides: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
) -> TrainResult:
    """Train on ``curated_table`` at ``curated_version``; reuse an identical finished run unless ``force``.

    ``overrides`` replaces training fields (Airflow Params, the best tuning trial's parameters);
    ``tags`` are added to the MLflow run (e.g. the tuning study that chose the parameters).
    """
    settings = with_training(settings, overrides)
    job = _identify(settings, curated_table, int(curated_version), run_id, logical_date)
    if not force:
        existing = _find_reusable_run(job.client, job.experiment_id, curated_table, job.curated_version, job.config_hash)
        if existing is not None:
            log.info("reusing run %s (same curated version and training config)", existing.info.run_id)
            return _result_from_run(existing, job.raw_version, reused=True)
    if settings.training.launcher == "kubernetes":
        raise LauncherError(
            "training.launcher is 'kubernetes': run the trainer image with the spec from "
            "tasks.training.train.trainer_pod_spec() (KubernetesPodOperator); the pod runs `cd4ml train`"
        )
    request = _worker_request(job, tags)
    return _settle(job, request, launch(request, settings.training))


@dataclass(frozen=True)
class TrainerPod:
    """What a KubernetesPodOperator needs to run one training task in the trainer image (plain data).

    ``state_pvc`` is mounted at ``mount_path`` = CD4ML_HOME inside the pod, so the decode cache
    and the checkpoints of a killed pod are there when Airflow retries the task.
    """

    name: str
    namespace: str
    image: str
    cmds: list[str]
    arguments: list[str]
    env_vars: dict[str, str]
    secret_env: list[str]  # variables the deployment injects from a Secret (never in this spec)
    resources: dict[str, dict[str, str]]
    state_pvc: str
    mount_path: str
    service_account: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trainer_pod_spec(
    settings: Settings,
    curated_table: str,
    curated_version: int,
    run_id: str,
    logical_date: str,
    force: bool = False,
    mount_path: str = "/data/cd4ml",
    overrides: Mapping[str, Any] | None = None,
) -> TrainerPod:
    """The pod for ``training.launcher: kubernetes``: ``cd4ml train`` with torchrun over the pod's GPUs."""
    cfg, k8s = settings.training, settings.training.kubernetes
    nproc = max(cfg.nproc_per_node, k8s.gpus, 1)
    arguments = [
        "train",
        "--curated-table", curated_table.replace(settings.home, mount_path, 1),
        "--curated-version", str(int(curated_version)),
        "--run-id", str(run_id),
        "--logical-date", str(logical_date),
        "--launcher", "torchrun" if nproc > 1 else "in_process",
        "--nproc-per-node", str(nproc),
        "--result-file", XCOM_RETURN_FILE,
    ]
    if force:
        arguments.append("--force")
    for key, value in sorted((overrides or {}).items()):
        arguments += ["--set", f"{key}={value}"]
    resources: dict[str, dict[str, str]] = {
        "requests": {"cpu": k8s.cpu, "memory": k8s.memory},
        "limits": {"memory": k8s.memory},
    }
    if k8s.gpus:
        resources["requests"]["nvidia.com/gpu"] = resources["limits"]["nvidia.com/gpu"] = str(k8s.gpus)
    name = "cd4ml-train-" + hashlib.sha256(f"{run_id}|{curated_version}".encode()).hexdigest()[:10]
    return TrainerPod(
        name=name,
        namespace=k8s.namespace,
        image=k8s.image,
        cmds=["cd4ml"],
        arguments=arguments,
        env_vars={"CD4ML_ENV": settings.env, "CD4ML_HOME": mount_path, "PYTHONUNBUFFERED": "1"},
        secret_env=["MLFLOW_TRACKING_URI"],
        resources=resources,
        state_pvc=k8s.state_pvc,
        mount_path=mount_path,
        service_account=k8s.service_account,
        labels={"app": "cd4ml-trainer", "cd4ml-env": settings.env},
    )
