"""Check a manual run's Params before any work, all at once, with one message per problem.

The Airflow form checks types and ranges (JSON schema); what it cannot know is whether a version
exists, whether a name is free or whether ``training_overrides`` are valid training settings.
Without these checks a run with ``{"curated_version": 99}`` got through its first task and failed
later in ``drift_check``, and a typo in ``training_overrides`` failed only in ``train`` after the
drift check and the tuning trials had run. Each DAG's first task calls :func:`check_params`.

Every check reads metadata only (Delta logs, tag files, the model registry): no image is read.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

from tasks.errors import DataError
from tasks.settings import Settings, SettingsError

Params = Mapping[str, Any]


class ParamsError(DataError, ValueError):
    """One or more Params of a run are wrong; the message lists every problem, one per line."""

    def __init__(self, dag_id: str, problems: list[str]):
        self.dag_id = dag_id
        self.problems = problems
        super().__init__(f"{dag_id}: {len(problems)} bad Param(s), nothing was run:\n"
                         + "\n".join(f"  - {p}" for p in problems))


def _table_version_problem(uri: str, version: Any, param: str) -> str | None:
    """None when ``version`` of ``uri`` exists; else what exists."""
    from tasks.data import lake

    name = lake.table_name(uri)
    current = lake.current_version(uri)
    if current is None:
        return f"{param}={version}: {name} has no version yet (nothing was written to {uri})"
    if not 0 <= int(version) <= current:
        return f"{param}={version}: {name} has versions 0..{current}"
    try:
        lake.open_table(uri, int(version))
    except lake.VersionNotFoundError as exc:  # vacuumed or log-compacted away
        return f"{param}={version}: {exc}"
    return None


def _model_version_problem(settings: Settings, version: Any, param: str) -> str | None:
    from tasks.models.registry import UnknownModelVersionError, get_model_version, mlflow_client

    try:
        get_model_version(mlflow_client(settings), settings.registry.model_name, version)
    except UnknownModelVersionError as exc:
        return f"{param}={version}: {exc}"
    return None


def _train(settings: Settings, params: Params) -> list[str]:
    from tasks.data import lake
    from tasks.training.train import with_training

    problems: list[str] = []
    curated, dataset = params.get("curated_version"), params.get("dataset_version")
    if curated is not None and dataset:
        problems.append(f"curated_version={curated} and dataset_version={dataset!r}: give one of them, not both")
    elif curated is not None:
        problems.append(_table_version_problem(settings.curated_table, curated, "curated_version"))
    elif dataset:
        try:
            lake.resolve_dataset_version(settings.curated_table, dataset, settings.raw_table)
        except lake.VersionNotFoundError as exc:
            problems.append(f"dataset_version={dataset!r}: {exc}")
    overrides = dict(params.get("training_overrides") or {})
    if params.get("model"):
        overrides["model"] = params["model"]
    try:
        with_training(settings, overrides)
    except SettingsError as exc:
        problems.append(f"training_overrides: {exc}")
    return problems


def _curate(settings: Settings, params: Params) -> list[str]:
    from tasks.curation.fastdup_optional import embedding_problem

    version = params.get("raw_version")
    problems = [] if version is None else [_table_version_problem(settings.raw_table, version, "raw_version")]
    embedding = embedding_problem(settings.curation)
    return problems + ([embedding] if embedding else [])


def _ingest(settings: Settings, params: Params) -> list[str]:
    from tasks.data import lake

    problems: list[str] = []
    label_source = params.get("label_source") or settings.ingest.label_source
    if label_source in ("csv", "jsonl") and not (params.get("manifest_uri") or settings.ingest.manifest_uri):
        problems.append(f"label_source={label_source!r} needs manifest_uri (a {label_source} file of path,label)")
    if (params.get("engine") or settings.ingest.engine) == "spark" and importlib.util.find_spec("pyspark") is None:
        problems.append("engine='spark': pyspark is not installed on this worker (pip install -r requirements-spark.txt)")
    name = params.get("dataset_version_name")
    if name:
        taken = next((t for t in lake.tags(settings.raw_table) if t.name == name), None)
        if taken is not None:
            problems.append(f"dataset_version_name={name!r} already names raw_images v{taken.version}; "
                            "names are immutable, pick another")
    return problems


def _promote(settings: Settings, params: Params) -> list[str]:
    problems: list[str] = []
    if params.get("version") is not None:
        problems.append(_model_version_problem(settings, params["version"], "version"))
    if params.get("test_version") is not None:
        problems.append(_table_version_problem(settings.curated_table, params["test_version"], "test_version"))
    return problems


def _rollback(settings: Settings, params: Params) -> list[str]:
    version = params.get("to_version")
    return [] if version is None else [_model_version_problem(settings, version, "to_version")]


def _accept_class(settings: Settings, params: Params) -> list[str]:
    from tasks.data.classes import discovering
    from tasks.data.labels import LabelRefusedError, check_labels

    if not discovering(settings):
        return ["ingest.allowed_labels is a list in this environment's settings: add the class there"]
    try:
        check_labels(params.get("labels"))
    except LabelRefusedError as exc:
        return [f"labels: {exc}"]
    return []


def _score(settings: Settings, params: Params) -> list[str]:
    from tasks.data.inputs import InputRefusedError
    from tasks.data.sources import SourceError, open_source

    source = params.get("source")
    if not source:
        return []
    try:
        open_source(source, allowed_schemes=settings.serving.allowed_schemes, schemes_key="serving.allowed_schemes")
    except (SourceError, InputRefusedError) as exc:
        return [f"source={source!r}: {exc}"]
    return []


def _monitor(settings: Settings, params: Params) -> list[str]:
    import fsspec

    from tasks.data.inputs import InputRefusedError
    from tasks.serving.feedback import FEEDBACK_SUFFIXES, check_feedback_file

    problems: list[str] = []
    for path in params.get("feedback_files") or []:
        try:  # before anything is opened: a Param must not fetch a URL or read outside the feedback folder
            check_feedback_file(settings, str(path))
        except InputRefusedError as exc:
            problems.append(f"feedback_files: {exc}")
            continue
        fs, inner = fsspec.core.url_to_fs(str(path))
        if not fs.isfile(inner):
            problems.append(f"feedback_files: {path} is not a file")
        elif not str(path).lower().endswith(FEEDBACK_SUFFIXES):
            problems.append(f"feedback_files: {path} is neither .csv nor .jsonl")
    return problems


CHECKS: dict[str, Callable[[Settings, Params], list[str | None]]] = {
    "cd4ml_ingest": _ingest,
    "cd4ml_curate": _curate,
    "cd4ml_train": _train,
    "cd4ml_promote": _promote,
    "cd4ml_rollback": _rollback,
    "cd4ml_accept_class": _accept_class,
    "cd4ml_score": _score,
    "cd4ml_monitor": _monitor,
}


def check_params(dag_id: str, settings: Settings, params: Params) -> None:
    """Raise :class:`ParamsError` listing every bad Param of a ``dag_id`` run; return when all are usable."""
    problems = [p for p in CHECKS[dag_id](settings, params) if p]
    if problems:
        raise ParamsError(dag_id, problems)
