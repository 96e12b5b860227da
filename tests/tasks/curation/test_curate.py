"""Curation of one batch: real digits with planted near-duplicates, conflicts and bad images; fastdup runs for real."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image, ImageEnhance, ImageFilter

from tasks.curation import plan
from tasks.curation.assignments import split_for
from tasks.curation.curate import curate
from tasks.curation.curation_features import ImageFeatures
from tasks.curation.fastdup_optional import fastdup_installed
from tasks.curation.outliers import Measured, outlier_reason
from tasks.curation.tables import (
    COMPONENTS_TABLE,
    CURATED_SCHEMA,
    EMBEDDINGS_TABLE,
    REPORT_SCHEMA,
    REPORT_TABLE,
    CurationError,
)
from tasks.data import lake
from tasks.data.ingest import RAW_SCHEMA, ingest_landing
from tasks.data.sample_data import write_digits
from tasks.settings import OutlierSettings
from tests.factories.curation import LABELS, components, digit, encode, outcome, pair_rule_only, plant, sha

BAD_REASONS = {"too_small", "too_dark", "too_bright", "flat", "blurry"}


def original(landing: Path, i: int) -> bytes:
    return (landing / str(LABELS[i]) / f"digit_{i:04d}.png").read_bytes()


def near_copies(i: int) -> dict[str, bytes]:
    """The same digit resized (bicubic, 32 px), re-encoded as JPEG and slightly brightened."""
    return {
        "resized": encode(digit(i).resize((32, 32), Image.BICUBIC), "PNG"),
        "jpeg": encode(digit(i), "JPEG", quality=90),
        "bright": encode(ImageEnhance.Brightness(digit(i)).enhance(1.15), "PNG"),
    }


def report_details(settings, result) -> dict[str, str]:
    uri = settings.table_uri(REPORT_TABLE)
    rows = lake.read(uri, lake.current_version(uri), filter=[("curated_version", "=", result.curated_version)])
    return {d["sha256"]: d["detail"] for d in rows.to_pylist()}


def copy_score_of(settings, result, a: str, b: str) -> float:
    from tasks.curation.copy_score import copy_score, copy_signature

    raw = lake.read(settings.raw_table, result.raw_version, columns=["sha256", "image"]).to_pylist()
    images = {r["sha256"]: r["image"] for r in raw if r["sha256"] in (a, b)}
    return copy_score(copy_signature(images[a]), copy_signature(images[b]))


def versions(settings) -> dict[str, int | None]:
    names = ("curated_images", COMPONENTS_TABLE, REPORT_TABLE, EMBEDDINGS_TABLE)
    return {n: lake.current_version(settings.table_uri(n)) for n in names}


def test_planted_duplicates_conflicts_and_bad_images(settings, tmp_path):
    settings = pair_rule_only(settings)  # ~21 digits a class: the class tests would abstain (test_abstention.py)
    landing = tmp_path / "landing"
    write_digits(landing, limit=200)
    cfg = settings.curation
    ratios = dict(cfg.split_ratios)

    # Near-copy families whose members, if each were its own component, would land in different splits.
    families: list[set[str]] = []
    for i in range(20, 200):
        copies = near_copies(i)
        family = {sha(original(landing, i))} | {sha(d) for d in copies.values()}
        if len({split_for(s, cfg.split_salt, ratios) for s in family}) > 1:
            for kind, data in copies.items():
                plant(landing, f"digit_{i}_{kind}.{'jpg' if kind == 'jpeg' else 'png'}", LABELS[i], data)
            families.append(family)
        if len(families) == 3:
            break
    assert len(families) == 3
    # Same pixels, other bytes (another zlib level): an exact duplicate the raw key cannot see.
    resaved = encode(digit(11), "PNG", compress_level=1)
    assert resaved != original(landing, 11)
    exact = plant(landing, "eleven_resaved.png", LABELS[11], resaved)
    # A near-identical copy of digit 7 filed under another label: the whole component is quarantined.
    wrong = (LABELS[7] + 1) % 10
    bright7 = encode(ImageEnhance.Brightness(digit(7)).enhance(1.1), "PNG")
    conflict = {sha(original(landing, 7)), plant(landing, "seven_as_other.png", wrong, bright7)}
    # Bad images: all black, all white, a blurred digit.
    black = plant(landing, "black.png", 0, encode(Image.new("L", (8, 8), 0), "PNG"))
    white = plant(landing, "white.png", 1, encode(Image.new("L", (8, 8), 255), "PNG"))
    blurred = plant(landing, "blurred.png", LABELS[3], encode(digit(3).filter(ImageFilter.GaussianBlur(1)), "PNG"))
    total = 200 + 9 + 1 + 1 + 3

    ingested = ingest_landing(settings, run_id="ing", logical_date="2026-11-21", landing=landing)
    assert ingested.inserted == total
    result = curate(settings, ingested.raw_version, run_id="cur-1", logical_date="2026-11-21")
    assert result.committed and result.raw_version == ingested.raw_version
    assert result.embedded == total and result.new_images == total - 3  # bad images get no component
    out = outcome(settings, result)
    assert len(out) == total and result.kept + sum(result.dropped_by_reason.values()) == total

    record = components(settings, result.components_version)
    details = report_details(settings, result)
    for family in families:
        members = [out[s] for s in family]
        assert len({o["component"] for o in members}) == 1, members
        assert len({record[s]["split"] for s in family}) == 1  # one split for the whole group
        rep = min(family)  # all first seen together: the smallest sha256 represents them
        assert out[rep]["kept"]
        for s in family - {rep}:
            if out[s]["kept"]:  # grouped with the original, but not close enough to be called its copy
                assert copy_score_of(settings, result, s, rep) < cfg.copy_similarity
                continue
            # dropped only as a copy of the kept image itself, and the report says how close it is
            assert (out[s]["reason"], out[s]["kept_sha256"]) == ("near_duplicate", rep)
            assert float(details[s].split()[2]) >= cfg.copy_similarity, details[s]
        assert sum(not out[s]["kept"] for s in family) == 3  # resized, JPEG and brighter: each a copy

    pair = [out[exact], out[sha(original(landing, 11))]]
    assert pair[0]["component"] == pair[1]["component"]
    assert sorted((o["kept"], o["reason"]) for o in pair) == [(False, "exact_duplicate"), (True, None)]

    assert all(out[s]["reason"] == "label_conflict" for s in conflict)
    assert len({out[s]["component"] for s in conflict}) == 1

    assert (out[black]["reason"], out[white]["reason"], out[blurred]["reason"]) == ("too_dark", "too_bright", "blurry")
    assert all(s not in record for s in (black, white, blurred))

    table = lake.read(settings.curated_table, result.curated_version)
    assert [(f.name, f.type) for f in table.schema] == [(f.name, f.type) for f in CURATED_SCHEMA]
    rows = table.to_pylist()
    assert [r["sha256"] for r in rows] == sorted(r["sha256"] for r in rows)
    split_of_component: dict[str, set] = {}
    for r in rows:  # no component straddles splits, and each split is the pure function of the component key
        component = record[r["sha256"]]["component"]  # the snapshot's commit names the record's version
        split_of_component.setdefault(component, set()).add(r["split"])
        assert r["split"] == split_for(component, cfg.split_salt, ratios) == record[r["sha256"]]["split"]
    assert all(len(s) == 1 for s in split_of_component.values())
    assert sum(result.counts_by_split.values()) == result.kept == len(rows)

    # The report: a Delta table row per dropped image, and the same rows in the JSON report.
    report_rows = lake.read(result.report_table, lake.current_version(result.report_table)).to_pylist()
    assert [(f.name, f.type) for f in lake.read(result.report_table, 0).schema] == [(f.name, f.type) for f in REPORT_SCHEMA]
    assert len(report_rows) == sum(result.dropped_by_reason.values())
    config_hash = settings.section_hash("curation")
    assert all((r["raw_version"], r["config_hash"], r["curated_version"], r["run_id"])
               == (ingested.raw_version, config_hash, result.curated_version, "cur-1") for r in report_rows)
    report = json.loads(Path(result.report_path).read_text())
    assert sorted(d["sha256"] for d in report["dropped"]) == sorted(r["sha256"] for r in report_rows)
    assert report["curated_version"] == result.curated_version and report["features"]["computed"] == total

    # fastdup's galleries (where it is installed) are run artefacts under the reports folder, beside the page.
    assert Path(result.report_html).is_file() and Path(result.report_html).is_relative_to(settings.reports_path)
    galleries = {"duplicates", "outliers_blurry", "outliers_too_dark", "outliers_too_bright"}
    assert galleries <= set(result.galleries) if fastdup_installed() else result.galleries == {}
    for path in result.galleries.values():
        assert Path(path).is_file() and Path(path).is_relative_to(settings.reports_path)
        assert Path(path).stat().st_size > 1000
    leftovers = [p for p in (settings.reports_path / "curation").iterdir() if p.name.startswith(".work-")]
    assert leftovers == []

    embeddings = lake.read(result.embeddings_table, lake.current_version(result.embeddings_table)).to_pylist()
    assert len(embeddings) == total and {e["method"] for e in embeddings} == {"pixels"}
    assert {len(e["embedding"]) for e in embeddings} == {cfg.feature_size**2}

    commit = lake.find_commit(settings.curated_table, raw_version=str(ingested.raw_version), step="curate")
    assert commit is not None and commit.metadata["config_hash"] == config_hash
    assert commit.metadata["run_id"] == "cur-1" and commit.metadata["kept"] == str(result.kept)

    # Re-run (even with the report and galleries gone): nothing is written anywhere, same answer.
    before = versions(settings)
    Path(result.report_path).unlink()
    again = curate(settings, ingested.raw_version, run_id="cur-2", logical_date="2026-11-21")
    assert not again.committed and again.curated_version == result.curated_version
    assert versions(settings) == before
    assert Path(again.report_path).is_file()
    assert sorted(d["sha256"] for d in json.loads(Path(again.report_path).read_text())["dropped"]) == sorted(
        r["sha256"] for r in report_rows
    )
    same = {k: v for k, v in again.to_dict().items() if k not in ("committed", "run_id")}
    assert same == {k: v for k, v in result.to_dict().items() if k not in ("committed", "run_id")}


def test_full_digits_respect_split_ratios_and_no_digit_is_a_bad_image(settings, raw_digits, monkeypatch):
    monkeypatch.setattr(plan, "ROW_BLOCK", 100)  # the snapshot is written in 16+ blocks, each gathering its bytes
    result = curate(settings, raw_digits.raw_version, run_id="full", logical_date="2026-11-21")
    snapshot = lake.read(settings.curated_table, result.curated_version)
    raw = lake.read(settings.raw_table, raw_digits.raw_version, columns=["sha256", "image", "label"])
    stored = {r["sha256"]: (r["image"], r["label"]) for r in raw.to_pylist()}
    assert snapshot.schema.names == CURATED_SCHEMA.names and snapshot.num_rows == result.kept
    assert all(stored[r["sha256"]] == (r["image"], r["label"]) for r in snapshot.to_pylist())
    assert result.kept + sum(result.dropped_by_reason.values()) == 1797
    assert result.kept > 1500  # near-duplicates exist in the digits, but they are a minority
    assert not BAD_REASONS & set(result.dropped_by_reason), result.dropped_by_reason  # the relative rules drop no real digit
    assert set(result.dropped_by_reason) <= {"near_duplicate", "exact_duplicate", "label_conflict"}
    for split, ratio in settings.curation.split_ratios.items():
        assert abs(result.counts_by_split[split] / result.kept - ratio) < 0.03, result.counts_by_split
    assert all(len(result.counts_by_split_and_label[s]) == 10 for s in ("train", "val", "test"))


def test_outlier_reason_applies_the_floor_constant_images_and_the_overrides_that_are_set():
    relative = OutlierSettings()  # no override: only the input floor and constant images are absolute
    overrides = OutlierSettings(min_blur=50, min_mean=10, max_mean=245, min_training_side=8)

    def stats(blur: float, mean: float, contrast: float = 30.0, side: int = 8) -> Measured:
        return Measured("grey", side, side, mean, contrast, blur)

    for limits in (relative, overrides):
        assert outlier_reason(stats(240.0, 78.0), limits) is None
        assert outlier_reason(Measured("grey", 7, 64, 78.0, 30.0, 240.0), limits)[0] == "too_small"
        # a constant image carries no information whatever the data: black, white, one grey
        assert outlier_reason(stats(0.0, 0.0, contrast=0.0), limits)[0] == "too_dark"
        assert outlier_reason(stats(0.0, 255.0, contrast=0.0), limits)[0] == "too_bright"
        reason, detail = outlier_reason(stats(0.0, 128.0, contrast=0.4), limits)
        assert reason == "flat" and "constant" in detail and "128.0" in detail
    # the relative rules decide these, not outlier_reason
    assert outlier_reason(stats(12.5, 5.0), relative) is None
    assert outlier_reason(stats(12.5, 250.0), relative) is None
    assert outlier_reason(stats(12.5, 78.0), relative) is None
    assert outlier_reason(stats(240.0, 5.0), overrides)[0] == "too_dark"  # size, then brightness, then blur
    assert outlier_reason(stats(240.0, 250.0), overrides)[0] == "too_bright"
    reason, detail = outlier_reason(stats(12.5, 78.0), overrides)
    assert reason == "blurry" and "12.5" in detail and "50" in detail
    with pytest.raises(ValueError, match="min_mean"):
        OutlierSettings(min_mean=200, max_mean=100)


@pytest.mark.skipif(not fastdup_installed(), reason="fastdup is not installed (WITH_FASTDUP=0): its refusal is "
                                                   "tested in test_without_fastdup.py")
def test_fastdup_model_embeddings_are_stored_per_image(settings, tmp_path):
    """``embedding: fastdup``: fastdup's own model, 576 floats per image, kept apart from pixel features."""
    landing = tmp_path / "landing"
    write_digits(landing, limit=24)
    raw = ingest_landing(settings, run_id="ing", logical_date="2026-11-21", landing=landing).raw_version
    cfg = settings.curation.model_copy(update={"embedding": "fastdup", "near_duplicate_threshold": 0.9999})
    model = settings.model_copy(update={"curation": cfg})
    result = curate(model, raw, run_id="fd", logical_date="2026-11-21")
    assert result.embedded == 24 and result.kept + sum(result.dropped_by_reason.values()) == 24
    rows = lake.read(result.embeddings_table, lake.current_version(result.embeddings_table)).to_pylist()
    assert {r["method"] for r in rows} == {"fastdup"} and {len(r["embedding"]) for r in rows} == {576}
    assert all(r["blur"] is not None and r["error"] is None for r in rows)


def test_split_for_is_pure_and_follows_ratios():
    ratios = {"train": 0.7, "val": 0.15, "test": 0.15}
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(3000)]
    first = [split_for(k, "salt", ratios) for k in keys]
    assert first == [split_for(k, "salt", ratios) for k in keys]
    assert abs(first.count("train") / 3000 - 0.7) < 0.03
    assert [split_for(k, "salt", {"train": 1.0, "val": 0.0, "test": 0.0}) for k in keys[:50]] == ["train"] * 50
    assert first != [split_for(k, "other-salt", ratios) for k in keys]


def test_empty_raw_version_is_a_clear_error(settings):
    version = lake.overwrite(settings.raw_table, pa.Table.from_pylist([], schema=RAW_SCHEMA), {"step": "test"})
    with pytest.raises(CurationError, match="no rows"):
        curate(settings, version, run_id="c", logical_date="2026-11-21")
    assert lake.current_version(settings.curated_table) is None


def test_a_chain_drops_only_copies_of_kept_images_and_conflicts_only_between_copies():
    from tasks.curation.copy_pairs import CopyScores
    from tasks.curation.curation_features import Features
    from tasks.curation.dedupe import dedupe_component
    from tasks.curation.feature_facts import FeatureFacts
    from tasks.curation.tables import RawFacts, RawRows

    # A, B, C on a line: A~B and B~C are copies (score 0.999), A and C are not (0.99).
    # D is another label, a copy of nobody but in the same component (grouped generously).
    shas = ["a", "b", "c", "d"]
    features = Features(by_sha=FeatureFacts.of({s: ImageFeatures(s, 1.0, 1.0, 0, 1, None) for s in shas}),
                        row_of={s: i for i, s in enumerate(shas)}, matrix=np.eye(4, dtype=np.float32))
    known = {("a", "b"): 0.999, ("b", "c"): 0.999, ("a", "c"): 0.99, ("a", "d"): 0.4, ("b", "d"): 0.4,
             ("c", "d"): 0.4}

    def no_image(sha: str) -> bytes:
        raise AssertionError(f"every pair is known: {sha} needs no signature")

    labels = {"a": "1", "b": "1", "c": "1", "d": "7"}
    pixels = features.pixel_keys(RawRows.of(RawFacts(s, labels[s], 32, 32) for s in shas))
    kept, removed = dedupe_component(shas, pixels, labels, CopyScores(no_image, known), threshold=0.9974)
    assert kept == ["a", "c", "d"]  # c is a copy only of b, which was itself dropped: not through a chain
    [(sha, reason, rep, detail)] = removed
    assert (sha, reason, rep) == ("b", "near_duplicate", "a") and detail.startswith("copy score 0.9990")

    # The same component where C carries another label: C is a copy of B, so both are quarantined;
    # A keeps its label, D (a copy of nobody) stays.
    kept, removed = dedupe_component(shas, pixels, {**labels, "c": "7"}, CopyScores(no_image, known),
                                     threshold=0.9974)
    assert kept == ["a", "d"]
    assert sorted((s, r) for s, r, _, _ in removed) == [("b", "label_conflict"), ("c", "label_conflict")]


def test_a_bad_image_rule_that_fires_on_a_large_share_stops_curation_instead_of_dropping_quietly(settings, tmp_path):
    """Real photo tiles (flat sky, soft backgrounds) under an absolute blur override that does not fit them: it would drop
    far more than max_share, so curation stops with the numbers and writes nothing; a threshold set for the data
    (or a higher max_share) lets it through."""
    from tasks.data.sample_data import write_photos

    landing = tmp_path / "photos"
    write_photos(landing, limit=160)  # the first photos' tiles, real JPEGs
    photos = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"allowed_labels": "discover"})})
    raw = ingest_landing(photos, run_id="ing", logical_date="2026-11-21", landing=landing).raw_version
    strict = photos.model_copy(update={"curation": photos.curation.model_copy(
        update={"outliers": photos.curation.outliers.model_copy(update={"min_blur": 2000.0})})})
    from tasks.curation.outliers import OutlierRuleError

    with pytest.raises(OutlierRuleError, match=r"blurry would drop \d+ of 160 images \(.*min_blur 2000; this data's median blur"):
        curate(strict, raw, run_id="c1", logical_date="2026-11-21")
    assert lake.current_version(photos.curated_table) is None  # nothing written
    allowed = strict.model_copy(update={"curation": strict.curation.model_copy(
        update={"outliers": strict.curation.outliers.model_copy(update={"max_share": 1.0}),
                "max_class_drop_share": 1.0})})
    result = curate(allowed, raw, run_id="c2", logical_date="2026-11-21")
    assert result.dropped_by_reason.get("blurry", 0) > 0.05 * 160  # the person asked for it: dropped, each with a row
