"""
### cd4ml_train: curated version -> drift check -> training -> gate -> registry

Triggered by the `curated_images` Asset, or by hand with an explicit `curated_version` or a
`dataset_version` (a version number, a name such as `release-3`, or a timestamp).

1. **drift_check**: alibi-detect MMD test of the new training data against the data the
   current `champion` was trained on (first run: no champion, skipped and said so).
2. **train**: torch on that exact curated version, tracked in MLflow with the Delta table
   and version it read. The same version with the same training settings reuses the
   finished run unless `force_retrain` is set.
3. **evaluate_gate**: candidate and champion scored on the same test split.
4. **promote**: the candidate is registered; only a passing candidate gets the `champion`
   alias of this environment's registered model, published on the champion Asset.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import CHAMPION_MODEL, CURATED_IMAGES
from cd4ml_airflow.context import fail_fast_on_data_errors, input_version, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs


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
        "force_retrain": Param(False, type="boolean", description="Train again even if a finished run exists."),
    },
    **dag_kwargs(["training", "drift", "gate", "registry"], __doc__),
)
def cd4ml_train():
    @task
    def resolve_input(**context) -> dict:
        """Pin the curated version this run works on."""
        from tasks import lake
        from tasks.settings import load_settings

        settings = load_settings()
        params = context["params"]
        with fail_fast_on_data_errors():
            if params["curated_version"] is None and params["dataset_version"]:
                version = lake.resolve_dataset_version(settings.curated_table, params["dataset_version"],
                                                       settings.raw_table)
            else:
                version = input_version(
                    context, param="curated_version", asset=CURATED_IMAGES, extra_key="curated_version",
                    table_uri=settings.curated_table,
                )
        return {"curated_table": settings.curated_table, "curated_version": version}

    @task
    def drift_check(data: dict, **context) -> dict:
        """New training data against the champion's training data."""
        from tasks.alerts import Alert, send
        from tasks.drift import DriftReference, check_drift
        from tasks.registry import champion
        from tasks.settings import load_settings

        settings = load_settings()
        current = champion(settings)
        reference = (
            DriftReference(current.curated_table, current.curated_version, current.version) if current else None
        )
        with fail_fast_on_data_errors():
            result = check_drift(settings, data["curated_table"], data["curated_version"], reference, context["run_id"])
        print(f"drift: {result.status} ({result.reason}); report: {result.report_path}")
        if result.status == "drift":
            send(Alert(summary=f"data drift against champion v{result.champion_version}: {result.reason}",
                       severity="warning", source="dag:cd4ml_train/task:drift_check", env=settings.env,
                       dedup_key=f"{settings.env}:drift:{data['curated_table']}", details=result.to_dict()), settings)
        return result.to_dict()

    @task
    def train(data: dict, drift: dict, **context) -> dict:
        """Train on the pinned curated version; tracked in MLflow."""
        from tasks.settings import load_settings
        from tasks.train import train as run_training

        with fail_fast_on_data_errors():
            result = run_training(
                load_settings(), data["curated_table"], data["curated_version"], run_id=context["run_id"],
                logical_date=logical_date_of(context), force=bool(context["params"]["force_retrain"]),
            )
        print(f"MLflow run: {result.mlflow_run_id} (reused={result.reused})  metrics: {result.metrics}")
        return result.to_dict()

    @task
    def evaluate_gate(data: dict, trained: dict) -> dict:
        """Candidate vs. champion on the same test split."""
        from tasks.evaluate import evaluate
        from tasks.settings import load_settings

        with fail_fast_on_data_errors():
            gate = evaluate(load_settings(), trained["mlflow_run_id"], data["curated_table"], data["curated_version"])
        print(f"gate passed={gate.passed}: {'; '.join(gate.reasons)}  report: {gate.report_path}")
        return gate.to_dict()

    @task(outlets=[CHAMPION_MODEL])
    def promote(trained: dict, gate: dict, *, outlet_events=None) -> dict:
        """Register the candidate; give it the champion alias only if the gate passed."""
        from airflow.sdk.exceptions import AirflowSkipException

        from tasks.alerts import Alert, send
        from tasks.registry import register_and_promote
        from tasks.settings import load_settings

        settings = load_settings()
        with fail_fast_on_data_errors():  # e.g. the champion moved since the gate compared against it
            result = register_and_promote(settings, trained["mlflow_run_id"], gate)
        if not result.alias_set:
            message = (f"{result.model_name} v{result.version} registered but not promoted: "
                       + "; ".join(gate["reasons"]))
            send(Alert(summary=message, severity="warning", source="dag:cd4ml_train/task:promote",
                       env=settings.env, dedup_key=f"{settings.env}:gate:{result.model_name}",
                       details={"gate": gate, "version": result.version}), settings)
            raise AirflowSkipException(message)  # no champion event: nothing downstream moves
        outlet_events[CHAMPION_MODEL].extra = {"model_name": result.model_name, "version": result.version}
        return result.to_dict()

    data = resolve_input()
    drift = drift_check(data)
    trained = train(data, drift)
    gate = evaluate_gate(data, trained)
    promote(trained, gate)


cd4ml_train()
