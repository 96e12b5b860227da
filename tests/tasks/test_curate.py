"""Curation on real digits with planted duplicates and conflicts; fastdup runs for real."""

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest
from PIL import Image, ImageEnhance

from tasks import lake
from tasks.curate import CURATED_SCHEMA, CurationError, curate, split_for
from tasks.ingest import RAW_SCHEMA, ingest_landing
from tasks.sample_data import digits_arrays, write_digits

IMAGES, LABELS = digits_arrays()


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _digit(i: int) -> Image.Image:
    return Image.fromarray(IMAGES[i], mode="L")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _plant(landing: Path, name: str, label: int, data: bytes) -> str:
    (landing / str(label)).mkdir(parents=True, exist_ok=True)
    (landing / str(label) / name).write_bytes(data)
    return _sha(data)


def _outcome(result) -> dict[str, dict]:
    """sha256 -> {"kept": bool, "component": ..., "reason": ..., "split": ...} from table and report."""
    table = lake.read(result.curated_table, result.curated_version).to_pylist()
    out = {r["sha256"]: {"kept": True, "component": r["component"], "split": r["split"], "reason": None} for r in table}
    for d in json.loads(Path(result.report_path).read_text())["dropped"]:
        out[d["sha256"]] = {"kept": False, "component": d["component"], "split": None, "reason": d["reason"]}
    return out


def test_planted_duplicates_collapse_conflicts_drop_and_rerun_is_a_no_op(settings, tmp_path):
    landing = tmp_path / "landing"
    write_digits(landing, limit=200)
    original = lambda i: (landing / str(LABELS[i]) / f"digit_{i:04d}.png").read_bytes()  # noqa: E731

    # Near-duplicates of digit 5 under its own label: a JPEG re-encode and a brightened copy.
    dup_family = {_sha(original(5))}
    dup_family.add(_plant(landing, "five_again.jpg", LABELS[5], _encode(_digit(5), "JPEG", quality=90)))
    dup_family.add(_plant(landing, "five_bright.png", LABELS[5], _encode(ImageEnhance.Brightness(_digit(5)).enhance(1.15), "PNG")))
    # Same pixels, other bytes (another zlib level): an exact duplicate the raw key cannot see.
    resaved = _encode(_digit(11), "PNG", compress_level=1)
    assert resaved != original(11)
    exact = _plant(landing, "eleven_resaved.png", LABELS[11], resaved)
    # A near-identical copy of digit 7 filed under another label: the whole component must go.
    wrong = (LABELS[7] + 1) % 10
    conflict = {_sha(original(7)), _plant(landing, "seven_as_other.png", wrong, _encode(ImageEnhance.Brightness(_digit(7)).enhance(1.1), "PNG"))}

    ingested = ingest_landing(settings, run_id="ing", logical_date="2026-11-21", landing=landing)
    assert ingested.inserted == 204
    result = curate(settings, ingested.raw_version, run_id="cur-1", logical_date="2026-11-21")
    assert result.committed and result.raw_version == ingested.raw_version
    outcome = _outcome(result)
    assert len(outcome) == 204 and result.kept + sum(result.dropped_by_reason.values()) == 204

    family = [outcome[s] for s in dup_family]
    assert len({o["component"] for o in family}) == 1, family
    assert sum(o["kept"] for o in family) == 1
    assert {o["reason"] for o in family if not o["kept"]} == {"near_duplicate"}

    pair = [outcome[exact], outcome[_sha(original(11))]]  # digit 11 has no near-duplicate of its own
    assert pair[0]["component"] == pair[1]["component"]
    assert sorted((o["kept"], o["reason"]) for o in pair) == [(False, "exact_duplicate"), (True, None)]

    assert all(outcome[s]["reason"] == "label_conflict" for s in conflict)
    assert len({outcome[s]["component"] for s in conflict}) == 1

    table = lake.read(settings.curated_table, result.curated_version)
    assert [(f.name, f.type) for f in table.schema] == [(f.name, f.type) for f in CURATED_SCHEMA]
    rows = table.to_pylist()
    assert [r["sha256"] for r in rows] == sorted(r["sha256"] for r in rows)
    # No component straddles splits, and each split is the pure function of the component key.
    cfg = settings.curation
    split_of_component: dict[str, set] = {}
    for r in rows:
        split_of_component.setdefault(r["component"], set()).add(r["split"])
        assert r["split"] == split_for(r["component"], cfg.split_salt, dict(cfg.split_ratios))
    assert all(len(s) == 1 for s in split_of_component.values())
    assert sum(result.counts_by_split.values()) == result.kept == len(rows)

    report = json.loads(Path(result.report_path).read_text())
    assert Path(report["fastdup"]["similarity_csv"]).is_file()
    assert report["curated_version"] == result.curated_version

    commit = lake.find_commit(settings.curated_table, raw_version=str(ingested.raw_version), step="curate")
    assert commit is not None and commit.metadata["config_hash"] == settings.section_hash("curation")
    assert commit.metadata["run_id"] == "cur-1" and commit.metadata["kept"] == str(result.kept)

    # Re-run (even with the report gone): same version, no new commit, same answer.
    before = lake.current_version(settings.curated_table)
    Path(result.report_path).unlink()
    again = curate(settings, ingested.raw_version, run_id="cur-2", logical_date="2026-11-21")
    assert not again.committed and again.curated_version == result.curated_version
    assert lake.current_version(settings.curated_table) == before
    assert Path(again.report_path).is_file()
    same = {k: v for k, v in again.to_dict().items() if k not in ("committed", "run_id")}
    assert same == {k: v for k, v in result.to_dict().items() if k not in ("committed", "run_id")}


def test_split_is_stable_when_new_images_arrive(settings, tmp_path):
    landing = tmp_path / "landing"
    write_digits(landing, limit=120)
    first_raw = ingest_landing(settings, run_id="i1", logical_date="2026-11-21", landing=landing).raw_version
    first = curate(settings, first_raw, run_id="c1", logical_date="2026-11-21")

    write_digits(landing, limit=260)  # the same 120 files plus 140 new ones
    second_raw = ingest_landing(settings, run_id="i2", logical_date="2026-11-22", landing=landing).raw_version
    assert second_raw > first_raw
    second = curate(settings, second_raw, run_id="c2", logical_date="2026-11-22")
    assert second.committed and second.curated_version > first.curated_version

    old = {r["sha256"]: r for r in lake.read(settings.curated_table, first.curated_version).to_pylist()}
    new = {r["sha256"]: r for r in lake.read(settings.curated_table, second.curated_version).to_pylist()}
    carried = [s for s in old if s in new and new[s]["component"] == old[s]["component"]]
    assert len(carried) > 0.9 * len(old)
    assert all(new[s]["split"] == old[s]["split"] for s in carried)

    # The older raw version is still curated once: asking again reuses its (not newest) commit.
    before = lake.current_version(settings.curated_table)
    again = curate(settings, first_raw, run_id="c3", logical_date="2026-11-23")
    assert not again.committed and again.curated_version == first.curated_version
    assert again.counts_by_split == first.counts_by_split
    assert lake.current_version(settings.curated_table) == before


def test_full_digits_respect_split_ratios(settings, raw_digits):
    result = curate(settings, raw_digits.raw_version, run_id="full", logical_date="2026-11-21")
    assert result.kept + sum(result.dropped_by_reason.values()) == 1797
    assert result.kept > 1500  # near-duplicates exist in the digits, but they are a minority
    for split, ratio in settings.curation.split_ratios.items():
        assert abs(result.counts_by_split[split] / result.kept - ratio) < 0.03, result.counts_by_split
    assert all(len(result.counts_by_split_and_label[s]) == 10 for s in ("train", "val", "test"))


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
