"""Drift check on real digits against a real champion (trained here, registered in MLflow):
skipped without a champion or without new images (cheaply), quiet on new data from the same
distribution, loud on inverted digits and on a batch of one class, deterministic, detectors
fitted once per champion and reused, a report page with plots, and the block policy.

Each batch is a raw version (as ingested) and a curated version built from it (its commit names
the raw version), as the pipeline writes them: the check judges the raw batch, so what curation
dropped from it (most of one class; nearly all of an inverted batch) biases nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tasks.data import lake
from tasks.data.sample_data import digits_arrays
from tasks.monitoring.drift import (
    DriftBlockedError,
    DriftReference,
    check_drift,
    enforce_policy,
    log_report,
    sample_rows,
    should_train,
)
from tests.factories.digits import curated_table, raw_table

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A champion trained on 1,000 shuffled digits (700/150/150), and curated versions that add new images."""
    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.settings import load_settings
    from tasks.training.train import train

    home = tmp_path_factory.mktemp("drift_home")
    settings = load_settings("sit", home=home)
    settings = settings.model_copy(update={"training": settings.training.model_copy(update={"epochs": 6})})
    images, labels = digits_arrays()
    order = np.random.default_rng(0).permutation(len(images))  # the raw order is by writer
    images, labels = images[order], labels[order]
    splits = ["train"] * 700 + ["val"] * 150 + ["test"] * 150
    base = curated_table(images[:1000], labels[:1000], splits)
    base_raw = raw_table(images[:1000], labels[:1000])
    uri = settings.curated_table

    def version(batch: tuple[np.ndarray, np.ndarray] | None, tag: str, kept: np.ndarray | None = None) -> int:
        """The raw version with ``batch`` added, and its curated version keeping the batch's ``kept`` rows."""
        raw = base_raw if batch is None else pa.concat_tables([base_raw, raw_table(*batch)])
        raw_version = lake.overwrite(settings.raw_table, raw, metadata={"run_id": f"test-ingest-{tag}"})
        table = base
        if batch is not None:
            keep = np.ones(len(batch[0]), bool) if kept is None else kept
            table = pa.concat_tables([base, curated_table(batch[0][keep], batch[1][keep], ["train"] * int(keep.sum()))])
        return lake.overwrite(uri, table, metadata={"run_id": f"test-{tag}", "raw_version": raw_version})

    ref = version(None, "ref")
    trained = train(settings, uri, ref, run_id="drift-champion", logical_date="2026-11-21")
    model_version = register_candidate(settings, trained.mlflow_run_id)
    mlflow_client(settings).set_registered_model_alias(settings.registry.model_name, "champion", str(model_version))
    pool, pool_labels = images[1000:1500], labels[1000:1500]
    ones = pool_labels == 1
    thinned = ~ones | (np.cumsum(ones) <= 4)  # curation kept 4 of the batch's ones (issue 23: 6 of ~40)
    few = np.arange(len(pool)) < 5  # curation kept 5 of 500 inverted digits (as outliers, say)
    return {
        "settings": settings, "uri": uri, "ref": ref, "run_id": trained.mlflow_run_id,
        "reference": DriftReference(uri, ref, model_version),
        "same": version((pool, pool_labels), "same"),
        "inverted": version((255 - pool, pool_labels), "inverted"),
        "one_class": version((pool[ones], pool_labels[ones]), "one-class"),
        "unchanged": version(None, "unchanged"),
        "thinned": version((pool, pool_labels), "thinned", kept=thinned),
        "inverted_curated_away": version((255 - pool, pool_labels), "inverted-curated-away", kept=few),
        "n_ones": int(ones.sum()),
        "reference_raw": int(lake.commit_at(uri, ref).metadata["raw_version"]),
    }


def _report(result) -> dict:
    return json.loads(Path(result.report_path).read_text())


def test_skipped_without_champion_or_new_images_and_cheaply(world, tmp_path) -> None:
    settings = world["settings"]
    first = check_drift(settings, world["uri"], world["ref"], None, run_id="run-1")
    assert first.status == "skipped" and "no champion" in first.reason
    unchanged = check_drift(settings, world["uri"], world["unchanged"], world["reference"], run_id="run-2")
    assert unchanged.status == "skipped" and unchanged.n_new == 0 and "0 new image(s)" in unchanged.reason
    assert _report(unchanged)["status"] == "skipped"
    # Neither path imports torch or alibi-detect: an unchanged input costs a read of two sha columns.
    code = (
        "import sys, time\n"
        "from tasks.settings import load_settings\n"
        "from tasks.monitoring.drift import check_drift, DriftReference\n"
        f"s = load_settings('sit', home={str(settings.home)!r})\n"
        "t = time.perf_counter()\n"
        f"r = check_drift(s, {world['uri']!r}, {world['unchanged']}, DriftReference({world['uri']!r}, "
        f"{world['ref']}, 1), 'run-x')\n"
        "assert r.status == 'skipped', r\n"
        "heavy = sorted(m for m in ('alibi_detect', 'torch') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "print(time.perf_counter() - t)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.strip().splitlines()[-1]) < 5.0


def test_new_data_from_the_same_distribution_is_no_drift_deterministic_and_reuses_detectors(world) -> None:
    import torch

    settings = world["settings"]
    rng_before = torch.get_rng_state()
    first = check_drift(settings, world["uri"], world["same"], world["reference"], run_id="run-1")
    detectors = Path(_report(first)["detectors"])
    fitted_at = (detectors / "meta.json").stat().st_mtime_ns
    second = check_drift(settings, world["uri"], world["same"], world["reference"], run_id="run-1")

    assert first.status == "no_drift", first.reason
    assert first.feature_method == "champion" and first.n_new == 500 and first.n_current == 500
    assert [t["name"] for t in first.tests] == ["softmax_ks", "embedding_mmd", "label_chi2"]
    assert all(t["threshold"] == pytest.approx(settings.drift.familywise_alpha / 3) for t in first.tests)
    assert first.severity["accuracy_drop"] is not None and first.severity["accuracy_drop"] < 0.05
    assert first.n_reference == 300  # the champion's held-out images (val + test), not what it fitted
    assert (first.raw_table, first.reference_raw_version) == (settings.raw_table, world["reference_raw"])
    assert str(first.raw_version) == lake.commit_at(world["uri"], world["same"]).metadata["raw_version"]
    assert f"raw v{first.raw_version} (as ingested)" in first.reason
    assert second.tests == first.tests and second.status == first.status  # same inputs, same answer
    assert (detectors / "meta.json").stat().st_mtime_ns == fitted_at  # fitted once, loaded the second time
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is left alone


def test_inverted_digits_are_drift_with_severity_a_page_and_artifacts(world) -> None:
    settings = world["settings"]
    result = check_drift(settings, world["uri"], world["inverted"], world["reference"], run_id="run-2")
    assert result.status == "drift", result.reason
    flagged = {t["name"] for t in result.tests if t["drift"]}
    assert {"softmax_ks", "embedding_mmd"} <= flagged
    assert result.severity["accuracy_drop"] > 0.2  # the champion really is worse on them
    assert result.harmful is True and "harmful: accuracy drop" in result.reason
    page = Path(result.html_path)
    assert page.exists() and "DRIFT" in page.read_text()
    assert len(list(page.parent.glob(f"{page.stem}_*.png"))) == 3

    from tasks.models.registry import mlflow_client

    log_report(settings, world["run_id"], result.to_dict())
    names = {Path(a.path).name for a in mlflow_client(settings).list_artifacts(world["run_id"], "drift")}
    assert {Path(result.report_path).name, page.name, f"{page.stem}_pvalues.png"} <= names


def test_a_batch_of_one_class_is_label_drift(world) -> None:
    settings = world["settings"]
    result = check_drift(settings, world["uri"], world["one_class"], world["reference"], run_id="run-3")
    assert result.status == "drift", result.reason
    chi2 = next(t for t in result.tests if t["name"] == "label_chi2")
    assert chi2["drift"] and result.n_current == world["n_ones"]
    assert _report(result)["label_counts"]["new"] == {"1": world["n_ones"]}
    drop = result.severity["accuracy_drop"]  # harmful only if the champion is worse on them than allowed
    assert result.harmful is (drop > settings.drift.harmful_accuracy_drop)


def test_a_batch_curation_thinned_is_judged_as_it_arrived(world) -> None:
    """Issue 23: curation kept 4 of the batch's ones; judged on the curated survivors the label test fired."""
    settings = world["settings"]
    result = check_drift(settings, world["uri"], world["thinned"], world["reference"], run_id="run-thin")
    chi2 = next(t for t in result.tests if t["name"] == "label_chi2")
    assert result.status == "no_drift" and not chi2["drift"], result.reason
    assert result.n_current == 500  # every image that arrived, the ones curation dropped included
    assert _report(result)["label_counts"]["new"]["1"] == world["n_ones"]
    assert _report(result)["label_counts"]["reference"] == pytest.approx(
        {k: v / 1000 for k, v in _raw_label_counts(world).items()})  # the champion's data as it arrived too


def _raw_label_counts(world) -> dict[str, int]:
    from collections import Counter

    labels = lake.read(world["settings"].raw_table, world["reference_raw"], columns=["label"]).column("label")
    return dict(Counter(labels.to_pylist()))


def test_an_inverted_batch_is_caught_though_curation_dropped_nearly_all_of_it(world) -> None:
    settings = world["settings"]
    result = check_drift(settings, world["uri"], world["inverted_curated_away"], world["reference"], run_id="run-inv")
    assert result.status == "drift" and result.n_current == 500, result.reason
    assert result.harmful is True


def test_the_projection_basis_comes_from_the_train_split_not_the_reference(world) -> None:
    """A basis fitted on the reference favours it over any new sample (bench/README.md#drift)."""
    from tasks.monitoring.drift import Featurizer, _read_sample, load_or_fit

    settings = world["settings"]
    reference = dataclasses.replace(world["reference"], raw_version=world["reference_raw"])
    featurizer = Featurizer(settings, f"models:/{settings.registry.model_name}/{reference.model_version}")
    detectors = load_or_fit(settings, reference, featurizer)
    train, _ = _read_sample(world["uri"], world["ref"], settings.drift.max_reference, "pca", splits=("train",))
    held_out, _ = _read_sample(world["uri"], world["ref"], settings.drift.max_reference, "x", splits=("val", "test"))
    assert len(train.shas) == 700 and len(held_out.shas) == 300
    mean = featurizer(train.images)[1].astype(np.float64).mean(axis=0)
    assert np.allclose(detectors.mean, mean, atol=1e-4)
    assert not np.allclose(detectors.mean, featurizer(held_out.images)[1].astype(np.float64).mean(axis=0), atol=1e-4)


def test_the_label_test_pools_rare_classes_and_names_them() -> None:
    from tasks.monitoring.drift import label_test

    reference = {"a": 300, "b": 300, "c": 30, "d": 1}
    # "d" is expected 3.2 times in the new sample: below the approximation's 5, pooled with the next rarest
    pooled = label_test(reference, {"a": 190, "b": 190, "c": 16, "d": 7}, alpha=0.05 / 3)
    assert pooled["pooled_classes"] == ["d", "c"] and not pooled["drift"]
    assert label_test(reference, {"a": 380, "b": 20}, alpha=0.05 / 3)["drift"]  # a real shift still shows
    assert label_test({"a": 10}, {"a": 400}, alpha=0.05 / 3)["p_value"] == 1.0  # one class: nothing to test


def test_settings_refuse_a_permutation_test_that_can_never_fire() -> None:
    from pydantic import ValidationError

    from tasks.monitoring.drift import TESTS
    from tasks.settings import DRIFT_TEST_COUNT, DriftSettings

    assert DRIFT_TEST_COUNT == len(TESTS)
    assert DriftSettings().n_permutations >= 3 / DriftSettings().familywise_alpha  # the default can fire
    with pytest.raises(ValidationError, match="raise n_permutations"):
        DriftSettings(n_permutations=50)  # p >= 1/51 = 0.0196 > 0.05 / 3


def test_block_policy_stops_training_and_warn_does_not(world) -> None:
    settings = world["settings"]
    drifted = check_drift(settings, world["uri"], world["inverted"], world["reference"], run_id="run-4")
    enforce_policy(settings, drifted)  # sit: warn
    block = settings.model_copy(update={"drift": settings.drift.model_copy(update={"policy": "block"})})
    with pytest.raises(DriftBlockedError, match="training blocked by drift policy in sit"):
        enforce_policy(block, drifted)
    quiet = check_drift(settings, world["uri"], world["same"], world["reference"], run_id="run-5")
    enforce_policy(block, quiet)  # no drift: nothing to block
    harmless = dataclasses.replace(drifted, harmful=False)  # drift the champion copes with: warn, train
    enforce_policy(block, harmless)
    unknown = dataclasses.replace(drifted, harmful=True, severity={"accuracy_drop": None})
    with pytest.raises(DriftBlockedError):
        enforce_policy(block, unknown)


def test_retrain_policy_trains_only_on_drift_without_a_champion_or_when_forced(world) -> None:
    settings = world["settings"]
    retrain = settings.model_copy(update={"drift": settings.drift.model_copy(update={"policy": "retrain"})})
    drifted = check_drift(settings, world["uri"], world["inverted"], world["reference"], run_id="run-6")
    quiet = check_drift(settings, world["uri"], world["same"], world["reference"], run_id="run-7")
    first = check_drift(settings, world["uri"], world["same"], None, run_id="run-8")
    assert should_train(retrain, drifted)[0]
    go, why = should_train(retrain, quiet)
    assert not go and "the champion stays" in why and f"champion v{quiet.champion_version}" in why
    assert should_train(retrain, quiet, force=True)[0]
    assert should_train(retrain, first)[0]  # no champion yet: the first model must be trained
    assert should_train(settings, quiet)[0]  # warn trains whatever the check says


def test_sample_rows_is_deterministic_and_order_free() -> None:
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(100)]
    picked = sample_rows(shas, 10, "reference")
    assert len(picked) == 10
    chosen = [shas[i] for i in picked]
    assert chosen == sorted(chosen)
    reversed_shas = shas[::-1]
    assert [reversed_shas[i] for i in sample_rows(reversed_shas, 10, "reference")] == chosen
    assert sample_rows(shas, 10, "current") != picked  # sides are sampled independently
    assert sorted(sample_rows(shas + shas[:5], 1000, "reference")) == list(range(100))  # dedupe, cap
