"""Optuna tuning on real digits: pruners stop bad trials, trials nest in MLflow, the best trains the candidate."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from tests.factories.digits import write_curated_digits
from tests.factories.training import fast, private_home

GOOD, BAD, WORSE = 0.003, 1e-6, 3e-7


def tuning_settings(base, pruner: str):
    from tasks.settings import SearchParam

    space = {"learning_rate": SearchParam(type="float", low=1e-7, high=0.01, log=True)}
    tuning = base.tuning.model_copy(
        update={
            "pruner": pruner,
            "epochs_per_trial": 4,
            "n_startup_trials": 1,
            "n_warmup_steps": 0,
            "min_resource": 1,
            "reduction_factor": 3,
            "search_space": space,
        }
    )
    return fast(base).model_copy(update={"tuning": tuning})


@pytest.mark.parametrize("pruner", ["median", "successive_halving"])
def test_a_pruner_stops_clearly_bad_trials_and_the_best_trial_trains_the_candidate(
    tmp_path_factory: pytest.TempPathFactory, pruner: str
) -> None:
    from tasks.models.registry import mlflow_client
    from tasks.training.train import train
    from tasks.training.tune import best_params, create_study, resolve_storage_uri, run_trial

    with private_home(tmp_path_factory, f"tune-{pruner}") as base:
        settings = tuning_settings(base, pruner)
        version = write_curated_digits(settings.curated_table, raw_version=6)
        table = settings.curated_table
        study = create_study(
            settings, "digits-lr", curated_table=table, curated_version=version, run_id="manual__tune", logical_date="2026-11-21"
        )
        assert create_study(settings, "digits-lr").parent_run_id == study.parent_run_id  # a retry finds it
        assert resolve_storage_uri(settings).startswith("sqlite:///")

        # A good learning rate first, then two that cannot learn in 4 epochs (fixed, not sampled).
        shared = optuna.load_study(study_name="digits-lr", storage=resolve_storage_uri(settings))
        for lr in (GOOD, BAD, WORSE):
            shared.enqueue_trial({"learning_rate": lr})
        results = [run_trial(settings, "digits-lr", i, table, version, study.parent_run_id) for i in range(3)]

        good, bad, worse = results
        assert good.state == "COMPLETE" and good.epochs_run == 4 and good.value > 0.85
        for pruned in (bad, worse):
            assert pruned.state == "PRUNED", pruned
            assert pruned.epochs_run < 4 and pruned.value is None
        assert [r.params["learning_rate"] for r in results] == [GOOD, BAD, WORSE]

        # An Airflow retry of a finished mapped task returns its trial; no new trial is asked.
        again = run_trial(settings, "digits-lr", 1, table, version, study.parent_run_id)
        assert again.reused and again.trial_number == bad.trial_number
        assert len(optuna.load_study(study_name="digits-lr", storage=resolve_storage_uri(settings)).trials) == 3

        client = mlflow_client(settings)
        for result in results:
            run = client.get_run(result.mlflow_run_id)
            assert run.data.tags["mlflow.parentRunId"] == study.parent_run_id  # nested under the tuning run
            assert run.data.tags["cd4ml.trial_state"] == result.state.lower()
            assert run.data.tags["cd4ml.curated_version"] == str(version)
            assert float(run.data.params["learning_rate"]) == result.params["learning_rate"]
            assert len(client.get_metric_history(result.mlflow_run_id, "val_accuracy")) == result.epochs_run
            assert "cd4ml.model_uri" not in run.data.tags  # trials log no model

        best = best_params(settings, "digits-lr", parent_run_id=study.parent_run_id)
        assert best == {"learning_rate": GOOD}
        parent = client.get_run(study.parent_run_id)
        assert parent.info.status == "FINISHED"
        assert parent.data.params["best.learning_rate"] == str(GOOD)
        assert parent.data.metrics["trials_pruned"] == 2.0 and parent.data.metrics["trials_complete"] == 1.0

        candidate = train(settings, table, version, "manual__tune", "2026-11-21", overrides=best,
                          tags={"cd4ml.optuna_study": "digits-lr"})
        run = client.get_run(candidate.mlflow_run_id)
        assert float(run.data.params["learning_rate"]) == GOOD
        assert run.data.tags["cd4ml.optuna_study"] == "digits-lr"
        assert candidate.model_uri and candidate.metrics["best_val_accuracy"] > 0.85


def test_a_trial_whose_worker_died_is_failed_and_asked_again(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tasks.training.tune import NoFinishedTrialError, best_params, create_study, resolve_storage_uri, run_trial

    with private_home(tmp_path_factory, "tune-orphan") as base:
        settings = tuning_settings(base, "median")
        settings = settings.model_copy(update={"tuning": settings.tuning.model_copy(update={"epochs_per_trial": 1})})
        version = write_curated_digits(settings.curated_table, raw_version=6, limit=300)
        study = create_study(settings, "orphans")
        with pytest.raises(NoFinishedTrialError, match="no completed trial"):
            best_params(settings, "orphans")

        shared = optuna.load_study(study_name="orphans", storage=resolve_storage_uri(settings))
        orphan = shared.ask()  # what a worker killed mid-trial leaves behind
        orphan.set_user_attr("trial_index", 0)
        result = run_trial(settings, "orphans", 0, settings.curated_table, version, study.parent_run_id)
        assert result.state == "COMPLETE" and not result.reused and result.trial_number != orphan.number
        states = {t.number: t.state for t in shared.get_trials(deepcopy=False)}
        assert states[orphan.number] == TrialState.FAIL


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("none", optuna.pruners.NopPruner),
        ("median", optuna.pruners.MedianPruner),
        ("successive_halving", optuna.pruners.SuccessiveHalvingPruner),
        ("hyperband", optuna.pruners.HyperbandPruner),
    ],
)
def test_the_pruner_is_chosen_by_settings(settings, name: str, kind: type) -> None:
    from tasks.training.tune import make_pruner

    assert isinstance(make_pruner(settings.tuning.model_copy(update={"pruner": name})), kind)


def test_the_search_space_is_validated_against_training_fields(tmp_path, cd4ml_home) -> None:
    from tasks.settings import REPO_ROOT, SettingsError, load_settings

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "base.yaml").write_text((REPO_ROOT / "conf" / "base.yaml").read_text())
    (conf / "sit.yaml").write_text("tuning:\n  search_space:\n    learning_rat: {type: float, low: 0.1, high: 0.2}\n")
    with pytest.raises(SettingsError, match="learning_rat"):
        load_settings("sit", conf_dir=conf)
    (conf / "sit.yaml").write_text("tuning:\n  search_space:\n    learning_rate: {type: float, low: 0.2, high: 0.1}\n")
    with pytest.raises(SettingsError, match="low < high"):
        load_settings("sit", conf_dir=conf)
