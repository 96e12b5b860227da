"""Registration and promotion against a real local MLflow registry."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.tasks.test_train import fast, private_home, with_model_name, write_curated_digits


@dataclass(frozen=True)
class Runs:
    settings: Any
    version: int
    a: Any  # TrainResult
    b: Any  # TrainResult (another seed and a single epoch)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    from tasks.train import train

    with private_home(tmp_path_factory, "registry-home") as base:
        settings = fast(base, epochs=3)
        version = write_curated_digits(settings.curated_table, raw_version=7)
        a = train(settings, settings.curated_table, version, "manual__a", "2026-11-21")
        b = train(fast(settings, epochs=1, seed=11, learning_rate=1e-4), settings.curated_table, version, "manual__b", "2026-11-22")
        yield Runs(settings, version, a, b)


def passed_gate(champion_version: int | None) -> dict[str, Any]:
    """A gate result as it arrives through XCom (``GateResult.to_dict()``)."""
    return {
        "passed": True,
        "metric": "accuracy",
        "candidate_value": 0.97,
        "champion_version": champion_version,
        "champion_value": None,
        "threshold": 0.85,
        "reasons": ["test accuracy 0.9700 meets the floor min_value 0.8500."],
        "report_path": "",
    }


def test_nothing_registered_yet(runs: Runs) -> None:
    from tasks.registry import champion, model_versions

    s = with_model_name(runs.settings, "empty")
    assert champion(s) is None
    assert model_versions(s) == []


def test_register_promote_and_reuse_the_version(runs: Runs) -> None:
    from tasks.evaluate import evaluate
    from tasks.registry import champion, mlflow_client, model_versions, register_and_promote

    s = with_model_name(runs.settings, "promote")
    gate = evaluate(s, runs.a.mlflow_run_id, s.curated_table, runs.version)
    assert gate.passed

    first = register_and_promote(s, runs.a.mlflow_run_id, gate)
    assert first.model_name == s.registry.model_name
    assert first.alias_set and first.previous_champion_version is None

    info = champion(s)
    assert info is not None
    assert (info.version, info.run_id) == (first.version, runs.a.mlflow_run_id)
    assert (info.curated_table, info.curated_version, info.raw_version) == (s.curated_table, runs.version, 7)
    assert info.to_dict()["raw_version"] == 7

    tags = mlflow_client(s).get_model_version(s.registry.model_name, str(first.version)).tags
    assert tags["cd4ml.env"] == "sit"
    assert tags["cd4ml.curated_table"] == s.curated_table
    assert tags["cd4ml.curated_version"] == str(runs.version)
    assert tags["cd4ml.raw_version"] == "7"
    assert tags["cd4ml.gate.passed"] == "true"
    assert tags["cd4ml.gate.report"] == gate.report_path

    again = register_and_promote(s, runs.a.mlflow_run_id, gate.to_dict())  # e.g. a task retry, via XCom
    assert again.version == first.version
    assert again.alias_set and again.previous_champion_version == first.version
    versions = model_versions(s)
    assert [v["version"] for v in versions] == [first.version]
    assert versions[0]["aliases"] == ["champion"]
    assert versions[0]["run_id"] == runs.a.mlflow_run_id
    assert versions[0]["curated_version"] == runs.version and versions[0]["raw_version"] == 7
    assert versions[0]["created"]


def test_failing_gate_registers_but_does_not_move_the_alias(runs: Runs) -> None:
    from tasks.evaluate import evaluate
    from tasks.registry import champion, mlflow_client, model_versions, register_and_promote

    s = with_model_name(runs.settings, "failing")
    promoted = register_and_promote(s, runs.a.mlflow_run_id, passed_gate(None))
    assert promoted.alias_set

    gate = evaluate(s, runs.b.mlflow_run_id, s.curated_table, runs.version)
    assert not gate.passed and gate.champion_version == promoted.version
    result = register_and_promote(s, runs.b.mlflow_run_id, gate)
    assert result.version != promoted.version
    assert not result.alias_set
    assert result.previous_champion_version == promoted.version

    info = champion(s)
    assert info is not None and info.version == promoted.version and info.run_id == runs.a.mlflow_run_id
    tags = mlflow_client(s).get_model_version(s.registry.model_name, str(result.version)).tags
    assert tags["cd4ml.gate.passed"] == "false"
    assert tags["cd4ml.logical_date"] == "2026-11-22"
    by_version = {v["version"]: v for v in model_versions(s)}
    assert by_version[promoted.version]["aliases"] == ["champion"]
    assert by_version[result.version]["aliases"] == []
    assert by_version[result.version]["gate_passed"] is False


def test_a_gate_against_a_champion_that_has_since_moved_is_refused(runs: Runs) -> None:
    from tasks.registry import StaleGateError, champion, register_and_promote

    s = with_model_name(runs.settings, "stale")
    first = register_and_promote(s, runs.a.mlflow_run_id, passed_gate(None))
    with pytest.raises(StaleGateError, match=f"now version {first.version}"):
        register_and_promote(s, runs.b.mlflow_run_id, passed_gate(None))  # compared with no champion
    info = champion(s)
    assert info is not None and info.version == first.version
    moved = register_and_promote(s, runs.b.mlflow_run_id, passed_gate(first.version))
    assert moved.alias_set and moved.previous_champion_version == first.version
    assert champion(s).version == moved.version
