"""A second batch: only new images are embedded, and no recorded image ever changes split.

The planted images are built against the first curation's assignment record: a near-copy of a
test image whose sha256 is smaller than the component key (the old "smallest sha" rule would
have re-keyed and moved it), a blend of two images in different splits (a bridge), and a blend
of two images in the same split (a merge). Grouping (0.97) decides components and splits;
dropping needs a copy of a kept image (copy score >= ``copy_similarity``), which the chosen blend
of two digits is not (a blend of two very similar digits can be: 2.7% of such blends score above).
"""

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from tasks.curation import assignments
from tasks.curation.assignments import split_for
from tasks.curation.copy_score import copy_score, copy_signature
from tasks.curation.curate import curate
from tasks.curation.curation_features import pixel_embedding
from tasks.curation.tables import COMPONENTS_TABLE
from tasks.data import lake
from tasks.data.ingest import ingest_landing
from tasks.data.sample_data import write_digits
from tests.factories.curation import (
    IMAGES,
    LABELS,
    components,
    encode,
    files_removed,
    outcome,
    pair_rule_only,
    plant,
    sha,
)

SURE, UNSURE = 0.975, 0.965  # planted similarities stay clear of the 0.97 threshold by this margin
COPY_MARGIN = 0.995  # the merge blend's copy score to either source stays below this (threshold 0.9974)


def _blend(i: int, j: int) -> bytes:
    mixed = np.rint((IMAGES[i].astype(np.float64) + IMAGES[j]) / 2).clip(0, 255).astype(np.uint8)
    return encode(Image.fromarray(mixed, mode="L"), "PNG")


@pytest.mark.parametrize("mapped_from", [None, 1], ids=["components-held", "components-mapped"])
def test_new_batch_moves_no_recorded_image_and_embeds_only_new_ones(settings, tmp_path, monkeypatch, mapped_from):
    if mapped_from is not None:  # every component's arrays mapped, as a component of most of a large table's are
        monkeypatch.setattr(assignments, "MAPPED_FROM", mapped_from)
    settings = pair_rule_only(settings)  # ~36 digits a class: splits and copies here, abstention elsewhere
    cfg = settings.curation
    ratios = dict(cfg.split_ratios)
    landing = tmp_path / "landing"
    write_digits(landing, limit=300)
    raw1 = ingest_landing(settings, run_id="i1", logical_date="2026-11-21", landing=landing).raw_version
    first = curate(settings, raw1, run_id="c1", logical_date="2026-11-21")
    rec1 = components(settings, first.components_version)
    out1 = outcome(settings, first)

    raw_rows = lake.read(settings.raw_table, raw1, columns=["sha256", "image", "label"]).to_pylist()
    index = {r["sha256"]: n for n, r in enumerate(raw_rows)}
    emb = np.stack([pixel_embedding(r["image"], cfg.feature_size) for r in raw_rows])
    digit_of = {sha(encode(Image.fromarray(IMAGES[i], mode="L"), "PNG", optimize=False)): i for i in range(300)}

    def copy_of(data: bytes, recorded_sha: str) -> float:
        return copy_score(copy_signature(data), copy_signature(raw_rows[index[recorded_sha]]["image"]))

    def neighbours(data: bytes) -> tuple[list[str], bool]:
        """Recorded images at or above SURE, and whether any similarity sits too close to the threshold."""
        sims = emb @ pixel_embedding(data, cfg.feature_size)
        close = [raw_rows[n]["sha256"] for n in np.nonzero(sims >= SURE)[0]]
        return close, bool(((sims >= UNSURE) & (sims < SURE)).any())

    # (a) A near-copy of a test image, with a sha256 below the component key and planned for another split.
    near_copy = target = None
    for t in sorted((s for s, o in out1.items() if o["kept"] and o["split"] == "test"),
                    key=lambda s: rec1[s]["component"], reverse=True):
        i = digit_of[t]
        variants = [encode(ImageEnhance.Brightness(Image.fromarray(IMAGES[i], mode="L")).enhance(f), "PNG")
                    for f in np.linspace(1.02, 1.3, 15)]
        variants += [encode(Image.fromarray(IMAGES[i], mode="L"), "JPEG", quality=q) for q in range(70, 99, 2)]
        for data in variants:
            close, unsure = neighbours(data)
            if (sha(data) < rec1[t]["component"] and split_for(sha(data), cfg.split_salt, ratios) != "test"
                    and not unsure and {rec1[s]["component"] for s in close} == {rec1[t]["component"]}):
                near_copy, target = data, t
                break
        if near_copy:
            break
    assert near_copy is not None

    # (b) A bridge between recorded components in different splits; (c) a merge of two in the same split.
    bridge = merge = None
    recorded = sorted(s for s in rec1 if s in index)
    for x, a in enumerate(recorded):
        for b in recorded[x + 1:]:
            ca, cb = rec1[a]["component"], rec1[b]["component"]
            if ca == cb or raw_rows[index[a]]["label"] != raw_rows[index[b]]["label"]:
                continue
            if not 0.88 <= float(emb[index[a]] @ emb[index[b]]) < UNSURE:
                continue
            data = _blend(digit_of[a], digit_of[b])
            close, unsure = neighbours(data)
            if unsure or not {a, b} <= set(close) or max(copy_of(data, a), copy_of(data, b)) >= COPY_MARGIN:
                continue
            splits = {rec1[s]["split"] for s in close}
            if bridge is None and len(splits) > 1:
                bridge = (data, a, b)
            if merge is None and len(splits) == 1:
                merge = (data, {rec1[s]["component"] for s in close}, LABELS[digit_of[a]])
        if bridge and merge:
            break
    assert bridge is not None and merge is not None

    # Batch 2: the planted images plus new digits that sit clear of everything recorded.
    planted = {
        plant(landing, "near_copy.png", LABELS[digit_of[target]], near_copy): "near_copy",
        plant(landing, "bridge.png", LABELS[digit_of[bridge[1]]], bridge[0]): "bridge",
        plant(landing, "merge.png", merge[2], merge[0]): "merge",
    }
    fresh = 0
    for i in range(300, 500):
        data = encode(Image.fromarray(IMAGES[i], mode="L"), "PNG", optimize=False)
        close, unsure = neighbours(data)
        if not close and not unsure:
            plant(landing, f"digit_{i:04d}.png", LABELS[i], data)
            fresh += 1
        if fresh == 60:
            break
    raw2 = ingest_landing(settings, run_id="i2", logical_date="2026-11-22", landing=landing).raw_version
    second = curate(settings, raw2, run_id="c2", logical_date="2026-11-22")
    assert second.committed and second.curated_version > first.curated_version
    new_count = fresh + len(planted)
    assert second.embedded == new_count  # the 300 recorded images were not embedded again
    stored = lake.read(second.embeddings_table, lake.current_version(second.embeddings_table), columns=["sha256"])
    assert stored.num_rows == 300 + new_count
    assert second.new_images == new_count - 1  # the bridge gets no component

    rec2 = components(settings, second.components_version)
    out2 = outcome(settings, second)
    by_role = {role: s for s, role in planted.items()}

    # No recorded image changed split; only the merged component's key changed.
    merged_key = min(merge[1])
    for s, row in rec1.items():
        assert rec2[s]["split"] == row["split"] and rec2[s]["first_raw_version"] == row["first_raw_version"]
        expected = merged_key if row["component"] in merge[1] else row["component"]
        assert rec2[s]["component"] == expected
    for s, o in out1.items():
        if o["kept"] and out2[s]["kept"]:
            assert out2[s]["split"] == o["split"]
        if o["kept"] and o["split"] == "test":
            assert out2[s]["kept"] or out2[s]["reason"] == "near_duplicate", out2[s]
            assert out2[s]["split"] in ("test", None)

    # (a) The near-copy joins the test component under its recorded key; the test image stays kept.
    copy = out2[by_role["near_copy"]]
    assert copy == {"kept": False, "component": rec1[target]["component"], "split": None,
                    "reason": "near_duplicate", "kept_sha256": target}
    assert out2[target]["kept"] and out2[target]["split"] == "test"
    assert rec2[by_role["near_copy"]]["split"] == "test"

    # (b) The bridge is quarantined and recorded nowhere; both sides are untouched.
    assert out2[by_role["bridge"]]["reason"] == "split_bridge"
    assert by_role["bridge"] not in rec2
    for side in bridge[1:]:
        assert rec2[side] == rec1[side]

    # (c) The merge joins the two recorded components under one key and split, and drops nothing:
    # a blend of two distinct digits is a copy of neither, and neither is a copy of the other.
    members = [s for s in rec2 if rec2[s]["component"] == merged_key and s in out2]
    assert by_role["merge"] in members and len({rec2[s]["split"] for s in members}) == 1
    for s in merge[1]:
        assert out2[s]["kept"] and out2[s]["component"] == merged_key
    assert out2[by_role["merge"]]["kept"]

    rows = lake.read(second.curated_table, second.curated_version).to_pylist()
    assert all(r["split"] == split_for(rec2[r["sha256"]]["component"], cfg.split_salt, ratios) for r in rows)
    # The merge renamed a component in the record only: the snapshot kept its rows and got the batch's appended.
    assert files_removed(second.curated_table, second.curated_version) == 0
    # ... and the record got the batch's rows and the renamed ones appended, each image's newest row its row.
    components_uri = settings.table_uri(COMPONENTS_TABLE)
    assert files_removed(components_uri, second.components_version) == 0
    assert lake.read(components_uri, second.components_version).num_rows > len(rec2)
    assert len(rows) == first.kept + sum(o["kept"] for s, o in out2.items() if s not in out1)

    # The older raw version is still curated once: asking again reuses its (not newest) commit.
    before = lake.current_version(settings.curated_table)
    again = curate(settings, raw1, run_id="c3", logical_date="2026-11-23")
    assert not again.committed and again.curated_version == first.curated_version
    assert again.counts_by_split == first.counts_by_split
    assert lake.current_version(settings.curated_table) == before


def test_a_new_salt_starts_a_fresh_record(settings, tmp_path):
    landing = tmp_path / "landing"
    write_digits(landing, limit=60)
    raw = ingest_landing(settings, run_id="i", logical_date="2026-11-21", landing=landing).raw_version
    first = curate(settings, raw, run_id="c1", logical_date="2026-11-21")
    salted = settings.model_copy(update={"curation": settings.curation.model_copy(update={"split_salt": "v2"})})
    second = curate(salted, raw, run_id="c2", logical_date="2026-11-21")
    assert second.committed and second.components_version > first.components_version
    assert second.embedded == 0  # features do not depend on the salt
    ratios = dict(settings.curation.split_ratios)
    rows = lake.read(second.curated_table, second.curated_version).to_pylist()
    record = components(salted, second.components_version)
    assert all(r["split"] == split_for(record[r["sha256"]]["component"], "v2", ratios) for r in rows)
