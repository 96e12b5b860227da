"""Gate, challenger, promotion, approval, rollback, audit and lineage against a real local MLflow registry.

Three real models trained on the real digits: ``base`` and ``equal`` (same data and settings,
another seed: an equally good retrain) and ``worse`` (trained on a copy whose train and val
labels are 60% shuffled: the candidate made worse on purpose).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tasks.curation.curate import CURATED_SCHEMA
from tests.factories.digits import curated_rows, write_curated_digits
from tests.factories.training import fast, private_home, with_model_name


@dataclass(frozen=True)
class Models:
    settings: Any
    version: int  # curated version: the frozen test split
    base: Any
    equal: Any
    worse: Any


def write_shuffled_digits(uri: str, share: float = 0.6, seed: int = 3) -> int:
    from tasks.data import lake

    rows = [dict(r) for r in curated_rows()]
    rng = np.random.default_rng(seed)
    fit = [r for r in rows if r["split"] in ("train", "val")]
    chosen = rng.choice(len(fit), size=int(share * len(fit)), replace=False)
    labels = [fit[i]["label"] for i in chosen]
    rng.shuffle(labels)
    for i, label in zip(chosen, labels):
        fit[i]["label"] = label
    return lake.overwrite(uri, pa.Table.from_pylist(rows, schema=CURATED_SCHEMA),
                          metadata={"run_id": "test-shuffle", "step": "curate", "raw_version": 9})


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    from tasks.training.train import train

    with private_home(tmp_path_factory, "release-home") as base_settings:
        s = fast(base_settings, epochs=4)
        # The latency check compares wall-clock milliseconds with a limit: on 2 shared cores its p95 moved
        # from 22 to 291 ms under load. These tests are about the statistics; the latency rule still runs
        # in every gate here, and its failure is tested with a limit no model meets (max_latency_p95_ms 0.001).
        s = s.model_copy(update={"gate": s.gate.model_copy(update={"max_latency_p95_ms": 60_000.0})})
        version = write_curated_digits(s.curated_table, raw_version=7)
        shuffled = s.table_uri("curated_shuffled")
        shuffled_version = write_shuffled_digits(shuffled)
        base = train(s, s.curated_table, version, "manual__base", "2026-11-21")
        equal = train(fast(s, epochs=4, seed=11), s.curated_table, version, "manual__equal", "2026-11-21")
        worse = train(s, shuffled, shuffled_version, "manual__worse", "2026-11-21")
        yield Models(s, version, base, equal, worse)


def _model(models: Models, suffix: str, **gate: Any) -> Any:
    s = with_model_name(models.settings, suffix)
    if gate:
        s = s.model_copy(update={"gate": s.gate.model_copy(update=gate)})
    return s


def _first_champion(models: Models, s: Any) -> int:
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import mark_challenger, promote

    v = register_candidate(s, models.base.mlflow_run_id)
    gate = evaluate(s, v, s.curated_table, models.version)
    assert gate.passed, gate.reasons
    mark_challenger(s, v, gate, run_id="r1")
    promote(s, v, gate, run_id="r1", actor="tests")
    return v


def _alias(s: Any, alias: str) -> int | None:
    from tasks.models.registry import alias_version, mlflow_client

    return alias_version(mlflow_client(s), s.registry.model_name, alias)


def test_first_candidate_becomes_challenger_then_champion_with_audit_rows(models: Models) -> None:
    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import audit, mark_challenger, promote

    s = _model(models, "first")
    v = register_candidate(s, models.base.mlflow_run_id)
    assert register_candidate(s, models.base.mlflow_run_id) == v  # a retry reuses the version
    gate = evaluate(s, v, s.curated_table, models.version)
    assert gate.decision == "pass" and gate.champion_version is None
    names = [c.name for c in gate.checks]
    assert names == ["not_rolled_back", "test_size", "floor", "smoke", "latency", "model_size"]
    report = json.loads(Path(gate.report_path).read_text())
    assert report["details"]["smoke"]["images_per_format"] > 0 and report["details"]["smoke"]["model_mb"] > 0
    assert report["test_version"] == models.version and report["candidate_version"] == v

    assert _alias(s, "challenger") is None and _alias(s, "champion") is None  # registration moves nothing
    mark_challenger(s, v, gate, run_id="r1")
    assert _alias(s, "challenger") == v and _alias(s, "champion") is None
    result = promote(s, v, gate, run_id="r1", actor="ci")
    assert result.changed and (result.from_version, result.to_version) == (None, v)
    assert _alias(s, "champion") == v and _alias(s, "challenger") is None  # the challenger won
    again = promote(s, v, gate, run_id="r1", actor="ci")  # a retried task: nothing new
    assert not again.changed
    rerun = evaluate(s, v, s.curated_table, models.version)  # the whole release again (a re-run DAG)
    assert rerun.passed and rerun.champion_version is None  # the champion is not compared with itself
    assert not mark_challenger(s, v, rerun, run_id="r9").changed
    assert not promote(s, v, rerun, run_id="r9", actor="ci").changed
    assert _alias(s, "challenger") is None and _alias(s, "champion") == v  # reconciling keeps it so

    rows = [r for r in audit.read(s) if r.model_name == s.registry.model_name]
    assert [(r.action, r.alias, r.from_version, r.to_version) for r in rows] == [
        ("challenger", "challenger", None, v), ("promote", "champion", None, v)]
    assert rows[1].actor == "ci" and rows[1].gate_report == gate.report_path and rows[1].airflow_run_id == "r1"
    tags = mlflow_client(s).get_model_version(s.registry.model_name, str(v)).tags
    assert json.loads(tags["cd4ml.release.last"])["action"] == "promote"
    assert tags["cd4ml.gate.decision"] == "pass" and tags["cd4ml.curated_version"] == str(models.version)


def test_a_worse_candidate_is_never_promoted_and_an_equal_retrain_is(models: Models) -> None:
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import ReleaseError, mark_challenger, promote

    s = _model(models, "worse")
    champion = _first_champion(models, s)
    bad = register_candidate(s, models.worse.mlflow_run_id)
    gate = evaluate(s, bad, s.curated_table, models.version)
    assert gate.decision == "fail" and gate.champion_version == champion
    failed = {c.name for c in gate.checks if not c.passed}
    assert {"non_inferiority", "mcnemar"} <= failed, gate.reasons
    with pytest.raises(ReleaseError, match="decided 'fail'"):
        mark_challenger(s, bad, gate)
    with pytest.raises(ReleaseError, match="decided 'fail'"):
        promote(s, bad, gate, actor="tests")
    assert _alias(s, "champion") == champion

    from tasks.settings import load_settings

    for env in ("sit", "uat", "prod"):  # every environment's gate settings say no
        strictness = load_settings(env, home=s.home).gate
        verdict = evaluate(s.model_copy(update={"gate": strictness}), bad, s.curated_table, models.version)
        assert verdict.decision == "fail", (env, verdict.reasons)

    same = register_candidate(s, models.equal.mlflow_run_id)
    gate = evaluate(s, same, s.curated_table, models.version)
    assert gate.decision == "pass", gate.reasons  # a retrain of equal quality is not blocked by noise
    report = json.loads(Path(gate.report_path).read_text())
    paired = report["details"]["paired"]
    assert paired["n"] == gate.test_images and len(paired["bootstrap_95"]) == 2
    assert set(report["details"]["per_class"]) == {str(d) for d in range(10)}
    promote(s, same, gate, run_id="r2", actor="tests")
    assert _alias(s, "champion") == same


def test_too_small_a_test_set_leaves_the_gate_undecided(models: Models) -> None:
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import ReleaseError, promote

    s = _model(models, "small", min_test_images=10_000)
    v = register_candidate(s, models.base.mlflow_run_id)
    gate = evaluate(s, v, s.curated_table, models.version)
    assert gate.decision == "undecided"
    assert any("min_test_images 10000: no decision" in r for r in gate.reasons)
    with pytest.raises(ReleaseError, match="undecided"):
        promote(s, v, gate, actor="tests")


def test_per_class_recall_floor_and_serving_limits_fail_the_gate(models: Models) -> None:
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate

    s = _model(models, "limits")
    _first_champion(models, s)
    strict = s.model_copy(update={"gate": s.gate.model_copy(update={
        "max_class_recall_drop": 0.0, "max_regression": 1.0, "alpha": 0.5, "max_latency_p95_ms": 0.001,
        "max_model_mb": 0.0001})})
    v = register_candidate(strict, models.worse.mlflow_run_id)
    gate = evaluate(strict, v, s.curated_table, models.version)
    failed = {c.name for c in gate.checks if not c.passed}
    assert failed == {"mcnemar", "class_recall", "latency", "model_size"}, gate.reasons


def test_a_class_fails_only_for_a_drop_beyond_the_limit_that_is_not_noise(settings) -> None:
    from tasks.release.evaluate import comparison_checks

    truth = ["8"] * 20 + ["1"] * 200
    champion = list(truth)
    three_missed = ["3"] * 3 + ["8"] * 17 + ["1"] * 200  # -0.15 exactly: the limit, and p = 0.125
    eight_missed = ["3"] * 8 + ["8"] * 12 + ["1"] * 200  # -0.40, p = 0.004
    gate = settings.gate
    assert gate.max_class_recall_drop == 0.15 and gate.alpha == 0.05
    checks, details = comparison_checks(settings, truth, three_missed, champion, 1)
    assert {c.name: c.passed for c in checks}["class_recall"], checks
    assert details["per_class"]["8"]["net_losses"] == 3
    checks, details = comparison_checks(settings, truth, eight_missed, champion, 1)
    by_name = {c.name: c for c in checks}
    assert not by_name["class_recall"].passed and "8 -0.400" in by_name["class_recall"].detail
    assert details["per_class"]["8"]["p_value_candidate_worse"] < 0.01


def test_smoke_test_fails_cleanly_for_a_model_that_cannot_load(models: Models, tmp_path: Path) -> None:
    from tasks.release.evaluate import smoke_test
    from tests.factories.digits import split_rows

    image = split_rows("test")[0]["image"]
    out = smoke_test(models.settings, f"models:/{models.settings.registry.model_name}-nothing/1", [image], {"0"})
    assert out["ok"] is False and "cannot download" in out["error"]  # found missing before its files are checked


def test_two_promotions_racing_end_with_one_champion_and_a_truthful_ledger(models: Models) -> None:
    from tasks.models.registry import StaleGateError, register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import audit, promote

    s = _model(models, "race", max_regression=1.0, alpha=1e-12, min_value=0.0, max_class_recall_drop=1.0)
    champion = _first_champion(models, s)
    a = register_candidate(s, models.equal.mlflow_run_id)
    b = register_candidate(s, models.worse.mlflow_run_id)
    gates = {v: evaluate(s, v, s.curated_table, models.version) for v in (a, b)}
    assert all(g.passed and g.champion_version == champion for g in gates.values())
    outcomes: dict[int, Any] = {}
    barrier = threading.Barrier(2)

    def race(v: int) -> None:
        barrier.wait()
        try:
            outcomes[v] = promote(s, v, gates[v], run_id=f"race-{v}", actor="tests")
        except StaleGateError as exc:
            outcomes[v] = exc

    threads = [threading.Thread(target=race, args=(v,)) for v in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [v for v, o in outcomes.items() if not isinstance(o, Exception)]
    assert len(winners) == 1, outcomes
    loser = ({a, b} - set(winners)).pop()
    assert isinstance(outcomes[loser], StaleGateError)
    assert _alias(s, "champion") == winners[0]
    promotions = [r for r in audit.read(s) if r.model_name == s.registry.model_name and r.action == "promote"]
    assert [(r.from_version, r.to_version) for r in promotions] == [(None, champion), (champion, winners[0])]


_RACER = """
import json, os, sys, time
from tasks.models.registry import StaleGateError
from tasks.release.release import promote
from tasks.settings import Settings
settings = Settings.model_validate_json(open(sys.argv[1]).read())
gate = json.load(open(sys.argv[2]))
while not os.path.exists(sys.argv[3]):
    time.sleep(0.005)
try:
    print("WON", promote(settings, gate["candidate_version"], gate, run_id=sys.argv[4], actor="tests").to_version)
except StaleGateError:
    print("STALE")
"""


def test_two_promotions_racing_in_two_processes(models: Models, tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from tasks.models.registry import register_candidate
    from tasks.release import audit
    from tasks.release.evaluate import evaluate

    s = _model(models, "race-proc", max_regression=1.0, alpha=1e-12, min_value=0.0, max_class_recall_drop=1.0,
               smoke_test=False)
    champion = _first_champion(models, s)
    versions = [register_candidate(s, run.mlflow_run_id) for run in (models.equal, models.worse)]
    (tmp_path / "settings.json").write_text(s.model_dump_json())
    go = tmp_path / "go"
    racers = []
    for v in versions:
        (tmp_path / f"gate{v}.json").write_text(json.dumps(evaluate(s, v, s.curated_table, models.version).to_dict()))
        racers.append(subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path / "settings.json"), str(tmp_path / f"gate{v}.json"), str(go),
             f"proc-{v}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    time.sleep(8)  # both processes imported everything and wait at the line
    go.touch()
    outcomes = [r.communicate(timeout=120) for r in racers]
    said = sorted(out.strip().splitlines()[-1] for out, _ in outcomes)
    assert said[0] == "STALE" and said[1].startswith("WON "), outcomes
    winner = int(said[1].split()[1])
    assert _alias(s, "champion") == winner
    promotions = [r for r in audit.read(s) if r.model_name == s.registry.model_name and r.action == "promote"]
    assert [(r.from_version, r.to_version) for r in promotions] == [(None, champion), (champion, winner)]


def test_rollback_restores_the_previous_champion_and_is_a_no_op_when_repeated(models: Models) -> None:
    import mlflow
    import pandas as pd

    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import RolledBackError, audit, promote, rollback
    from tests.factories.digits import split_rows

    s = _model(models, "rollback")
    first = _first_champion(models, s)
    second = register_candidate(s, models.equal.mlflow_run_id)
    gate = evaluate(s, second, s.curated_table, models.version)
    promote(s, second, gate, run_id="r2", actor="tests")
    assert _alias(s, "champion") == second

    result = rollback(s, reason="bad predictions on the new camera", actor="oncall", run_id="rb1")
    assert result.changed and (result.from_version, result.to_version) == (second, first)
    assert _alias(s, "champion") == first
    model = mlflow.pyfunc.load_model(f"models:/{s.registry.model_name}@champion")
    assert model.metadata.run_id == models.base.mlflow_run_id  # the alias now loads the restored version
    assert len(model.predict(pd.DataFrame({"image": [r["image"] for r in split_rows("test")[:3]]}))) == 3
    tags = mlflow_client(s).get_model_version(s.registry.model_name, str(second)).tags
    assert "bad predictions on the new camera" in tags["cd4ml.rolled_back"]

    assert not rollback(s, reason="bad predictions on the new camera", actor="oncall").changed  # same again
    assert not rollback(s, reason="other", to_version=first, actor="oncall").changed  # already there
    assert _alias(s, "champion") == first
    with pytest.raises(RolledBackError):
        promote(s, second, evaluate(s, second, s.curated_table, models.version), actor="tests")
    gate = evaluate(s, second, s.curated_table, models.version)
    assert gate.decision == "fail" and not gate.checks[0].passed  # not_rolled_back
    rows = [r for r in audit.read(s) if r.model_name == s.registry.model_name]
    assert [(r.action, r.from_version, r.to_version) for r in rows][-1] == ("rollback", second, first)
    assert rows[-1].actor == "oncall" and rows[-1].reason == "bad predictions on the new camera"


def test_bad_release_requests_are_clear_errors_that_change_nothing(models: Models, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.models.registry import UnknownModelVersionError, mlflow_client, register_candidate
    from tasks.release.evaluate import LineageError, evaluate
    from tasks.release.release import NoChampionError, ReleaseError, audit, rollback
    from tasks.settings import SettingsError, load_settings

    s = _model(models, "bad")
    with pytest.raises(NoChampionError, match="no champion"):
        rollback(s, reason="x", actor="oncall")
    with pytest.raises(ReleaseError, match="needs a reason"):
        rollback(s, reason=" ", actor="oncall")
    v = register_candidate(s, models.base.mlflow_run_id)
    with pytest.raises(UnknownModelVersionError, match=f"has no version 99 \\(versions: \\[{v}\\]\\)"):
        evaluate(s, 99, s.curated_table, models.version)
    with pytest.raises(UnknownModelVersionError):
        rollback(s, reason="x", to_version=99, actor="oncall")
    with pytest.raises(SettingsError, match="not a known environment"):
        load_settings("staging")

    # A version registered straight from the artifact, with no lineage tags and no run.
    client: MlflowClient = mlflow_client(s)
    source = client.get_model_version(s.registry.model_name, str(v)).source
    orphan = client.create_model_version(s.registry.model_name, source, run_id=None)
    with pytest.raises(LineageError, match="no cd4ml.curated_table"):
        evaluate(s, int(orphan.version), s.curated_table, models.version)
    assert _alias(s, "champion") is None and _alias(s, "challenger") is None
    assert [r for r in audit.read(s) if r.model_name == s.registry.model_name] == []


def test_deploy_model_with_no_upstream_champion_or_a_rolled_back_one_copies_nothing(
    models: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.release.model_import as model_import
    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.model_import import import_model
    from tasks.release.release import NoChampionError, ReleaseError, RolledBackError, promote, rollback
    from tasks.settings import load_settings

    sit = _model(models, "upstream")
    uat = load_settings("uat", home=sit.home)
    with pytest.raises(ReleaseError, match="deploy_code"):
        import_model(uat)  # uat deploys code by default: nothing to copy
    uat = uat.model_copy(update={
        "release": uat.release.model_copy(update={"pattern": "deploy_model", "upstream": "sit"}),
        "registry": uat.registry.model_copy(update={"model_name": "digits-classifier-uat-upstream"}),
    })
    monkeypatch.setattr(model_import, "load_settings", lambda env, home=None: sit)  # sit = this test's upstream model
    with pytest.raises(NoChampionError, match="upstream sit has no champion"):
        import_model(uat)
    assert not mlflow_client(uat).search_model_versions(f"name = '{uat.registry.model_name}'")

    first = _first_champion(models, sit)
    second = register_candidate(sit, models.equal.mlflow_run_id)
    promote(sit, second, evaluate(sit, second, sit.curated_table, models.version), run_id="up2", actor="tests")
    rollback(sit, reason="broken upstream", actor="oncall")
    with pytest.raises(RolledBackError):
        import_model(uat, source_version=second)
    assert import_model(uat).source == f"models:/{sit.registry.model_name}/{first}"


def _refusals(s: Any) -> list[Any]:
    from tasks.alerting import incidents

    return [i for i in incidents.open_incidents(s) if i.alert.kind == "release_refused"
            and i.alert.versions.get("model_name") == s.registry.model_name]


def test_prod_promotes_only_on_a_recorded_approval_by_an_allowed_approver(models: Models) -> None:
    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import ApprovalRequiredError, audit, promote, record_decision

    s = _model(models, "approval", smoke_test=False)
    s = s.model_copy(update={"release": s.release.model_copy(update={"approval": "required",
                                                                     "approvers": ("alice", "bob")})})
    v = register_candidate(s, models.base.mlflow_run_id)
    gate = evaluate(s, v, s.curated_table, models.version)
    # `approve` marked success by hand: the run goes on to promote, but nobody decided anything.
    with pytest.raises(ApprovalRequiredError):
        promote(s, v, gate, actor="airflow-run", run_id="by-hand")
    assert len(_refusals(s)) == 1  # on-call hears of it
    with pytest.raises(ApprovalRequiredError):  # an answer with no responder is no answer
        record_decision(s, v, "approved", actor="", reason="", gate_report=gate.report_path)
    record_decision(s, v, "approved", actor="mallory", reason="lgtm", gate_report=gate.report_path, run_id="p0")
    with pytest.raises(ApprovalRequiredError):  # not an approver
        promote(s, v, gate, actor="airflow-run", run_id="p0")
    record_decision(s, v, "rejected", actor="alice", reason="wait for the holiday freeze", gate_report=gate.report_path,
                    run_id="p1")
    with pytest.raises(ApprovalRequiredError):  # the last word was no
        promote(s, v, gate, actor="airflow-run", run_id="p1")
    assert _alias(s, "champion") is None
    rows = [r for r in audit.read(s) if r.model_name == s.registry.model_name]
    assert rows[-1].action == "rejected" and rows[-1].actor == "alice" and rows[-1].reason == "wait for the holiday freeze"
    assert json.loads(mlflow_client(s).get_model_version(s.registry.model_name, str(v)).tags["cd4ml.approval"])[
        "decision"] == "rejected"
    record_decision(s, v, "approved", actor="bob", reason="canary clean", gate_report=gate.report_path, run_id="p2",
                    extra={"at": "2026-11-23T10:00:00Z"})
    result = promote(s, v, gate, actor="airflow-run", run_id="p2")
    assert result.changed and _alias(s, "champion") == v
    row = [r for r in audit.read(s) if r.model_name == s.registry.model_name][-1]
    assert (row.action, row.actor, row.approval["by"], row.approval["at"]) == ("promote", "bob", "bob",
                                                                              "2026-11-23T10:00:00Z")


def test_an_approver_named_by_role_counts_only_as_checked_by_airflow() -> None:
    from tasks.release.release import may_approve

    approvers = ("role:Approver", "approver")
    assert may_approve(approvers, "approver", {})
    assert may_approve(approvers, "carol", {"assigned": list(approvers)})  # Airflow's auth manager resolved the role
    assert not may_approve(approvers, "carol", {})
    assert not may_approve(approvers, "carol", {"assigned": ["carol"]})
    assert not may_approve(approvers, None, {"assigned": list(approvers)})
    assert may_approve((), "anyone", {}) and not may_approve((), "", {})


def test_champion_moves_forward_only_through_this_environments_gate(models: Models, tmp_path: Path) -> None:
    from tasks.models.registry import StaleGateError, mlflow_client, register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import GateNotRecordedError, NotAFormerChampionError, audit, promote, rollback

    s = _model(models, "forward", smoke_test=False)
    first = _first_champion(models, s)
    second = register_candidate(s, models.equal.mlflow_run_id)
    claimed = {"decision": "pass", "candidate_version": second, "champion_version": first, "report_path": ""}
    with pytest.raises(NotAFormerChampionError):  # "rolling back" to a version that never served is a promotion
        rollback(s, reason="roll forward", to_version=second, actor="oncall")
    with pytest.raises(GateNotRecordedError):  # a gate result handed in is not a gate that ran
        promote(s, second, claimed, actor="tests", run_id="claimed")
    forged = tmp_path / "gate.json"
    forged.write_text(json.dumps({**claimed, "env": s.env, "model_name": s.registry.model_name}))
    client = mlflow_client(s)
    client.set_model_version_tag(s.registry.model_name, str(second), "cd4ml.gate.report", str(forged))
    client.set_model_version_tag(s.registry.model_name, str(second), "cd4ml.gate.decision", "pass")
    with pytest.raises(GateNotRecordedError):  # a report outside this environment's gate folder
        promote(s, second, actor="tests", run_id="planted")
    assert _alias(s, "champion") == first and len(_refusals(s)) == 2

    gate = evaluate(s, second, s.curated_table, models.version)  # the gate, for real
    assert gate.passed and gate.champion_version == first
    assert promote(s, second, actor="tests", run_id="fwd").changed and _alias(s, "champion") == second
    with pytest.raises(StaleGateError):  # the first version's gate compared with no champion: stale now
        promote(s, first, actor="tests")
    assert rollback(s, reason="back to the first", to_version=first, actor="oncall").to_version == first
    rows = [r for r in audit.read(s) if r.model_name == s.registry.model_name]
    assert [(r.action, r.to_version) for r in rows][-2:] == [("promote", second), ("rollback", first)]


def _cli_conf(tmp_path: Path, model_name: str) -> Path:
    """The repository's settings with this test's private sit model name (the CLI loads settings itself)."""
    import shutil

    import yaml

    from tasks.settings import REPO_ROOT

    conf = tmp_path / "conf"
    shutil.copytree(REPO_ROOT / "conf", conf)
    sit = yaml.safe_load((conf / "sit.yaml").read_text()) or {}
    (conf / "sit.yaml").write_text(yaml.safe_dump({**sit, "registry": {"model_name": model_name}}))
    return conf


def test_the_cli_in_sit_acts_as_the_account_running_it_and_refuses_a_typed_actor(
    models: Models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import os
    import pwd

    from tasks.cli import main
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release import audit

    s = _model(models, "cli", smoke_test=False)
    monkeypatch.setenv("CD4ML_CONF_DIR", str(_cli_conf(tmp_path, s.registry.model_name)))
    monkeypatch.setenv("USER", "ceo@example.com")  # $USER is typed too: never the actor
    monkeypatch.delenv("CD4ML_ACTOR", raising=False)
    first = _first_champion(models, s)
    second = register_candidate(s, models.equal.mlflow_run_id)
    evaluate(s, second, s.curated_table, models.version)
    assert main(["promote", "--env", "sit", "--version", str(second)]) == 0
    assert _alias(s, "champion") == second
    assert main(["rollback", "--env", "sit", "--reason", "canary", "--by", "ceo@example.com"]) == 1
    monkeypatch.setenv("CD4ML_ACTOR", "ceo@example.com")
    assert main(["rollback", "--env", "sit", "--reason", "canary"]) == 1
    assert _alias(s, "champion") == second
    monkeypatch.delenv("CD4ML_ACTOR")
    capsys.readouterr()
    assert main(["rollback", "--env", "sit", "--reason", "canary"]) == 0, capsys.readouterr().err
    assert _alias(s, "champion") == first
    rows = [r for r in audit.read(s) if r.model_name == s.registry.model_name]
    me = f"cli:{pwd.getpwuid(os.getuid()).pw_name}"
    assert [(r.action, r.actor) for r in rows][-2:] == [("promote", me), ("rollback", me)]


def test_deploy_model_copies_the_upstream_champion_with_its_lineage(models: Models) -> None:
    from tasks.models.registry import mlflow_client
    from tasks.release.lineage import format_lineage, lineage
    from tasks.release.model_import import import_model
    from tasks.settings import load_settings

    sit = models.settings  # the real sit model name: uat's upstream
    _first_champion(models, sit)
    uat = load_settings("uat", home=sit.home)
    uat = uat.model_copy(update={"release": uat.release.model_copy(update={"pattern": "deploy_model", "upstream": "sit"})})
    copied = import_model(uat).to_dict()
    assert not copied["reused"] and copied["source"].startswith(f"models:/{sit.registry.model_name}/")
    assert import_model(uat).to_dict() == {**copied, "reused": True}
    tags = mlflow_client(uat).get_model_version(uat.registry.model_name, str(copied["version"])).tags
    assert tags["cd4ml.curated_version"] == str(models.version) and tags["cd4ml.env"] == "uat"
    assert tags["cd4ml.trained_in"] == "sit" and tags["cd4ml.copied_from"] == copied["source"]

    info = lineage(f"models:/{uat.registry.model_name}/{copied['version']}", home=sit.home)
    assert info["copied_from"]["run"]["run_id"] == models.base.mlflow_run_id
    assert info["copied_from"]["data"]["raw"]["version"] == 7
    assert info["copied_from"]["run"]["requirements_hash"]
    text = format_lineage(info)
    assert "copied from:" in text and "raw:" in text


def test_sit_sample_is_deterministic_named_and_a_subset(models: Models) -> None:
    from tasks.data import lake
    from tasks.data.sampling import training_data

    s = models.settings
    assert s.training_data.sample_fraction == 0.5
    first = training_data(s, s.curated_table, models.version, "run-a")
    again = training_data(s, s.curated_table, models.version, "run-b")
    assert first == again and first["sample"].startswith("sample-50pct-")
    rows = lake.read(first["table"], first["version"])
    full = lake.read(s.curated_table, models.version)
    assert 0.4 * full.num_rows < rows.num_rows < 0.6 * full.num_rows
    assert set(rows["sha256"].to_pylist()) <= set(full["sha256"].to_pylist())
    names = {t.name: t.version for t in lake.tags(first["table"])}
    assert names[first["sample"]] == first["version"]
    full_env = s.model_copy(update={"training_data": s.training_data.model_copy(update={"sample_fraction": 1.0})})
    assert training_data(full_env, s.curated_table, models.version, "x") == {
        "table": s.curated_table, "version": models.version, "sample": None}


def test_retention_keeps_the_sample_a_model_trained_on_and_the_curated_version_it_was_cut_from(models: Models) -> None:
    from tasks.data.sampling import training_data
    from tasks.models.registry import TAG_CURATED_TABLE, TAG_CURATED_VERSION, mlflow_client, register_candidate
    from tasks.ops.retention import protected_versions

    s = _model(models, "retention")
    sample = training_data(s, s.curated_table, models.version, "run-r")
    v = register_candidate(s, models.base.mlflow_run_id)
    client = mlflow_client(s)
    client.set_model_version_tag(s.registry.model_name, str(v), TAG_CURATED_TABLE, sample["table"])
    client.set_model_version_tag(s.registry.model_name, str(v), TAG_CURATED_VERSION, str(sample["version"]))
    assert sample["version"] in protected_versions(s, s.sample_table)
    assert models.version in protected_versions(s, s.curated_table)


def test_the_approval_text_compares_class_by_class_with_names(models: Models) -> None:
    from tasks.models.registry import register_candidate
    from tasks.release.evaluate import evaluate
    from tasks.release.release_notes import approval_body

    s = _model(models, "notes")
    _first_champion(models, s)
    v = register_candidate(s, models.equal.mlflow_run_id)
    gate = evaluate(s, v, s.curated_table, models.version)
    body = approval_body(s, gate.to_dict())
    assert f"{s.registry.model_name} v{v} vs champion v1" in body
    assert "| 7 |" in body and "McNemar one-sided p" in body and "**Drift**" in body
    assert f"`{s.curated_table}` v{models.version} (raw v7)" in body
