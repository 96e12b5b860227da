"""The promotion gate on real digits: floor, champion comparison, report, determinism."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.tasks.test_train import fast, private_home, split_rows, with_model_name, write_curated_digits


@dataclass(frozen=True)
class Candidates:
    settings: Any
    version: int
    good: Any  # TrainResult: a few epochs, well above the floor
    weak: Any  # TrainResult: one epoch at a tiny learning rate, clearly worse


@pytest.fixture(scope="module")
def candidates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Candidates]:
    from tasks.train import train

    with private_home(tmp_path_factory, "gate-home") as base:
        settings = fast(base)
        version = write_curated_digits(settings.curated_table, raw_version=5)
        good = train(settings, settings.curated_table, version, "manual__good", "2026-11-21")
        weak = train(fast(settings, epochs=1, learning_rate=1e-4), settings.curated_table, version, "manual__weak", "2026-11-21")
        yield Candidates(settings, version, good, weak)


def test_gate_passes_without_a_champion_and_is_deterministic(candidates: Candidates) -> None:
    from tasks.evaluate import evaluate
    from tasks.registry import mlflow_client

    s = with_model_name(candidates.settings, "no-champion")
    run_id = candidates.good.mlflow_run_id
    gate = evaluate(s, run_id, s.curated_table, candidates.version)
    assert gate.passed
    assert gate.metric == "accuracy"
    assert gate.champion_version is None and gate.champion_value is None
    assert gate.threshold == s.gate.min_value
    assert gate.candidate_value >= s.gate.min_value
    assert any("no champion" in reason for reason in gate.reasons)
    assert any(f"min_value {s.gate.min_value:.4f}" in reason for reason in gate.reasons)

    report_path = Path(gate.report_path)
    assert report_path == s.reports_path / "gate" / f"{run_id}.json"
    report = json.loads(report_path.read_text())
    assert report["candidate"]["run_id"] == run_id
    assert report["champion"] is None
    assert report["test_data"] == {
        "curated_table": s.curated_table,
        "curated_version": candidates.version,
        "split": "test",
        "rows": len(split_rows("test")),
    }
    assert report["passed"] is True

    run = mlflow_client(s).get_run(run_id)
    assert run.data.metrics["test_accuracy"] == pytest.approx(gate.candidate_value)
    assert 0.0 < run.data.metrics["test_macro_f1"] <= 1.0
    assert run.data.metrics["gate_passed"] == 1.0

    first_bytes = report_path.read_bytes()
    again = evaluate(s, run_id, s.curated_table, candidates.version)
    assert again == gate
    assert report_path.read_bytes() == first_bytes


def test_gate_fails_below_the_floor_with_a_clear_reason(candidates: Candidates) -> None:
    from tasks.evaluate import evaluate

    base = with_model_name(candidates.settings, "floor")
    s = base.model_copy(update={"gate": base.gate.model_copy(update={"min_value": 1.0, "metric": "macro_f1"})})
    gate = evaluate(s, candidates.good.mlflow_run_id, s.curated_table, candidates.version)
    assert gate.candidate_value < 1.0  # the scenario needs an imperfect model
    assert not gate.passed
    assert gate.metric == "macro_f1" and gate.threshold == 1.0
    assert gate.reasons[0] == f"test macro_f1 {gate.candidate_value:.4f} is below the floor min_value 1.0000."
    assert json.loads(Path(gate.report_path).read_text())["passed"] is False


def test_gate_compares_with_the_champion_on_the_same_test_split(candidates: Candidates) -> None:
    from tasks.evaluate import evaluate
    from tasks.registry import register_and_promote

    s = with_model_name(candidates.settings, "regression")
    good_gate = evaluate(s, candidates.good.mlflow_run_id, s.curated_table, candidates.version)
    promoted = register_and_promote(s, candidates.good.mlflow_run_id, good_gate)
    assert promoted.alias_set

    gate = evaluate(s, candidates.weak.mlflow_run_id, s.curated_table, candidates.version)
    assert not gate.passed
    assert gate.champion_version == promoted.version
    assert gate.champion_value == pytest.approx(good_gate.candidate_value)  # same split, same serving path
    assert gate.candidate_value < gate.champion_value
    assert gate.threshold == pytest.approx(max(s.gate.min_value, gate.champion_value - s.gate.max_regression))
    assert any(
        "regresses more than max_regression" in r and f"champion version {promoted.version}" in r for r in gate.reasons
    )
    report = json.loads(Path(gate.report_path).read_text())
    assert report["champion"]["version"] == promoted.version
    assert report["champion"]["run_id"] == candidates.good.mlflow_run_id
    assert report["candidate"]["run_id"] == candidates.weak.mlflow_run_id
    assert report["test_data"]["curated_version"] == candidates.version

    # A generous max_regression and floor let the same weak candidate through.
    lenient = s.model_copy(update={"gate": s.gate.model_copy(update={"min_value": 0.0, "max_regression": 1.0})})
    assert evaluate(lenient, candidates.weak.mlflow_run_id, s.curated_table, candidates.version).passed

    # The champion itself re-evaluated (a re-run after promotion) passes against itself.
    same = evaluate(s, candidates.good.mlflow_run_id, s.curated_table, candidates.version)
    assert same.passed and same.candidate_value == same.champion_value
