"""Precision first: the copy rule proves it separates before it drops, and no class loses more than its share.

Real images: colour tiles of a bundled photo (distinct, and separable: their copies stand out) and
noisy renderings of one digit whose copy scores straddle the threshold (no gap between copies and
the class's bulk: the rule must abstain there).
"""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tasks.curation.class_guard import budget, guard_outliers
from tasks.curation.curate import curate
from tasks.curation.separation import separation
from tasks.curation.tables import RawFacts, RawRows
from tasks.data.ingest import ingest_landing
from tasks.data.sample_data import photo_sources
from tests.factories.curation import IMAGES, encode, outcome, plant, sha

THRESHOLD = 0.9974


def photo_tiles(n: int, size: int = 48) -> list[Image.Image]:
    """``n`` non-overlapping, non-flat tiles of the china photo."""
    photo = photo_sources()["china"]
    grey = np.asarray(Image.fromarray(photo).convert("L"), dtype=np.float64)
    tiles = []
    for y in range(0, photo.shape[0] - size + 1, size):
        for x in range(0, photo.shape[1] - size + 1, size):
            if grey[y:y + size, x:x + size].std() >= 12:
                tiles.append(Image.fromarray(photo[y:y + size, x:x + size]))
    assert len(tiles) >= n
    return tiles[:n]


def noisy_digits(n: int, seed: int = 0) -> list[Image.Image]:
    """One digit at 28 px with independent noise (sigma 30-45): distinct files whose copy scores straddle 0.9974."""
    rng = np.random.default_rng(seed)
    base = np.asarray(Image.fromarray(IMAGES[1], mode="L").resize((28, 28), Image.BILINEAR), dtype=np.float64)
    return [Image.fromarray(np.clip(base + rng.normal(0, rng.uniform(30, 45), base.shape), 0, 255).astype(np.uint8))
            for _ in range(n)]


def _curate(settings, landing: Path):
    raw = ingest_landing(settings, run_id="i", logical_date="2026-11-21", landing=landing).raw_version
    result = curate(settings, raw, run_id="c", logical_date="2026-11-21")
    return result, json.loads(Path(result.report_path).read_text())


def test_the_rule_abstains_where_the_threshold_sits_in_the_bulk_and_still_drops_copies_that_stand_out(
        settings, tmp_path, caplog):
    landing = tmp_path / "landing"
    tiles = photo_tiles(60)
    for i, t in enumerate(tiles):
        plant(landing, f"tile_{i:03d}.png", 1, encode(t, "PNG"))
    copy = plant(landing, "tile_007_copy.jpg", 1, encode(tiles[7], "JPEG", quality=85))
    noisy = [plant(landing, f"noisy_{i:03d}.png", 2, encode(img, "PNG")) for i, img in enumerate(noisy_digits(60))]

    with caplog.at_level(logging.WARNING, logger="tasks.curation.curate"):
        result, report = _curate(settings, landing)
    out = outcome(settings, result)

    # Class 1 separates: the re-encoded tile is dropped as a copy of its original.
    assert report["decisions"]["separation"]["1"]["separates"]
    assert (out[copy]["reason"], out[copy]["kept_sha256"]) == ("near_duplicate", sha(encode(tiles[7], "PNG")))

    # Class 2: its images score like copies of each other, so it drops none of them and says why.
    sep = report["decisions"]["separation"]["2"]
    assert not sep["separates"] and sep["at_or_above"] > 0, sep
    assert all(out[s]["kept"] for s in noisy)
    [entry] = [a for a in report["decisions"]["abstained"] if a["label"] == "2"]
    assert entry["rule"] == "near_duplicate" and "spreads above the bulk" in entry["why"]
    possible = [p for p in report["decisions"]["possible_copies"] if p["label"] == "2"]
    assert possible and all(p["score"] >= THRESHOLD and p["sha256"] in noisy and p["partner"] in noisy
                            for p in possible)
    assert {p["sha256"] for p in possible} <= {s for s in noisy if out[s]["kept"]}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "abstained" in r.getMessage()]
    assert len(warnings) == 1


def test_the_class_guard_keeps_copies_beyond_the_share_and_lists_them(settings, tmp_path):
    landing = tmp_path / "landing"
    tiles = photo_tiles(60)
    for i, t in enumerate(tiles):
        plant(landing, f"tile_{i:03d}.png", 1, encode(t, "PNG"))
    # 4 copies in a class of 64: floor(0.02 x 64) = 1 may go, so none goes as a near-duplicate.
    copies = [plant(landing, f"copy_{i}.jpg", 1, encode(tiles[i], "JPEG", quality=85)) for i in (3, 11, 19, 27)]
    result, report = _curate(settings, landing)
    out = outcome(settings, result)
    assert report["decisions"]["separation"]["1"]["separates"]  # the rule itself would drop them
    assert all(out[s]["kept"] for s in copies)
    assert result.dropped_by_reason.get("near_duplicate", 0) == 0
    [entry] = report["decisions"]["abstained"]
    assert (entry["rule"], entry["label"]) == ("near_duplicate", "1") and "max_class_drop_share" in entry["why"]
    pairs = {frozenset((p["sha256"], p["partner"])) for p in report["decisions"]["possible_copies"]}
    assert pairs == {frozenset((c, sha(encode(tiles[i], "PNG")))) for c, i in zip(copies, (3, 11, 19, 27))}

    # Allowed a larger share, the same curation drops the 4 copies, each as a copy of its own tile.
    relaxed = settings.model_copy(update={"curation": settings.curation.model_copy(
        update={"max_class_drop_share": 0.1})})
    again, report = _curate(relaxed, landing)
    out = outcome(relaxed, again)
    dropped = [m for pair in pairs for m in pair if not out[m]["kept"]]
    assert len(dropped) == 4 and {out[m]["reason"] for m in dropped} == {"near_duplicate"}
    assert report["decisions"]["abstained"] == []


@pytest.mark.parametrize(("images", "expected"), [(1, 0), (49, 0), (50, 1), (99, 1), (100, 2), (150, 3)])
def test_a_class_budget_is_the_floor_of_its_share(images, expected):
    assert budget(images, 0.02) == expected


def test_bad_images_beyond_a_class_share_are_kept_and_listed():
    by_sha = RawRows.of(RawFacts(f"{c}{i:02d}", c, 32, 32) for c in "ab" for i in range(60))
    flagged = ["a00", "b00", "b01"]  # class a: 1 of 60 (its budget); class b: 2 of 60 (over it)
    outliers = [(s, "blurry", "blur 1 < min_blur 50", None) for s in flagged]
    dropped = [{"sha256": s, "reason": "blurry", "label": by_sha[s].label} for s in flagged]
    eligible = sorted(set(by_sha) - set(flagged))
    eligible2, dropped2, outliers2, decisions = guard_outliers(by_sha, by_sha.shas.take(by_sha.positions(eligible)), dropped,
                                                               outliers, 0.02)
    assert [d["sha256"] for d in dropped2] == ["a00"] and [o[0] for o in outliers2] == ["a00"]
    assert list(eligible2) == sorted(set(eligible) | {"b00", "b01"})
    [d] = decisions
    assert (d["rule"], d["label"]) == ("bad_images", "b") and [k["sha256"] for k in d["kept"]] == ["b00", "b01"]


def test_separation_needs_a_gap_between_the_threshold_and_the_bulk():
    rng = np.random.default_rng(0)
    bulk = list(1 - np.exp(-rng.normal(3.5, 0.4, 80)))  # nearest scores around 0.97
    assert separation("x", bulk + [0.9995] * 4, THRESHOLD, 3.0, 30).separates
    near = list(1 - np.exp(-rng.normal(6.0, 0.5, 80)))  # around the threshold itself
    sep = separation("y", near, THRESHOLD, 3.0, 30)
    assert not sep.separates and sep.z < 1 and sep.at_or_above > 20
    assert not separation("z", bulk[:10], THRESHOLD, 3.0, 30).separates  # too few to tell
