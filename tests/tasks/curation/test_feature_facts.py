"""The features' facts held as columns read back as the tuples they were, and the screen reads them as before."""

import numpy as np
import pyarrow as pa
import pytest

from tasks.curation.curation_features import FACTS_SCHEMA, Features, RowOf, fill_stored_facts
from tasks.curation.feature_facts import FeatureFacts, ImageFeatures
from tasks.curation.outliers import CONSTANT_STD, Measured, constant_images, is_constant, outlier_reason, screen
from tasks.curation.sha_list import Keys
from tasks.curation.tables import RawFacts, RawRows
from tasks.data import lake
from tasks.settings import OutlierSettings

GOOD = ImageFeatures("d1", 240.0, 78.0, 0.0, 255.0, None, 30.0, "grey")
BLACK = ImageFeatures("d2", 0.0, 0.0, 0.0, 0.0, None, 0.0, "grey")
BROKEN = ImageFeatures(None, None, None, None, None, "undecodable: truncated", None, None)
OLD = ImageFeatures("d3", 12.0, 128.0, 0.0, 255.0, None, None, None)  # stored before contrast and family


def held(rows: dict[str, ImageFeatures]) -> dict[str, ImageFeatures]:
    """What the facts give back: every stored fact but the grey minimum and maximum (no step reads them)."""
    return {s: f._replace(min=None, max=None) for s, f in rows.items()}


def test_a_table_read_as_columns_gives_back_each_images_tuple_nulls_as_none():
    rows = {"a": GOOD, "b": BLACK, "c": BROKEN, "d": OLD}
    table = pa.Table.from_pylist([{"sha256": s, **f._asdict()} for s, f in rows.items()])
    facts = FeatureFacts.of_table(table)
    assert dict(facts) == held(rows) and list(facts) == list(rows) and len(facts) == 4
    assert "c" in facts and "z" not in facts
    assert facts.failed().tolist() == [False, False, True, False]
    assert dict(FeatureFacts.of(rows)) == held(rows)


def test_a_table_without_the_newer_columns_reads_them_as_missing():
    table = pa.Table.from_pylist([{"sha256": "a", "pixel_digest": "d", "blur": 1.0, "mean": 2.0, "min": 0.0,
                                   "max": 9.0, "error": None}])
    assert FeatureFacts.of_table(table)["a"] == ImageFeatures("d", 1.0, 2.0, None, None, None, None, None)


def _table(rows: dict[str, ImageFeatures]) -> pa.Table:
    return pa.Table.from_pylist([{"sha256": s, **f._asdict()} for s, f in rows.items()], schema=FACTS_SCHEMA)


def test_facts_filled_by_position_from_rows_in_any_order_share_the_raw_rows_map():
    rows = RawRows.of(RawFacts(s, "1", 32, 32) for s in "abc")
    facts = FeatureFacts.blank(rows.shas, rows.at)
    facts.fill(np.array([2, 0]), _table({"c": OLD, "a": GOOD}))
    odd = GOOD._replace(pixel_digest="not-a-hex-digest", error="undecodable", family=None)
    facts.fill(np.array([1]), _table({"b": odd}))
    assert facts.at is rows.at and list(facts) == ["a", "b", "c"]
    assert dict(facts) == held({"a": GOOD, "b": odd, "c": OLD})
    assert facts.failed().tolist() == [False, True, False]
    assert constant_images(facts) == set()
    more = FeatureFacts.blank(rows.shas, rows.at)
    more.fill(np.array([1]), _table({"b": BLACK}))
    more.fill(np.array([0]), pa.table({"pixel_digest": ["d4"], "blur": [1.0]}))  # written before the other facts
    assert more["a"] == ImageFeatures("d4", 1.0, None, None, None, None, None, None)
    assert more["b"] == held({"b": BLACK})["b"] and constant_images(more) == {"b"}
    assert more["c"] == ImageFeatures(None, None, None, None, None, None, None, None)  # not filled: blank


def test_constant_images_are_those_is_constant_names():
    rows = {"a": GOOD, "b": BLACK, "c": BROKEN, "d": OLD, "e": GOOD._replace(contrast=CONSTANT_STD / 2)}
    facts = FeatureFacts.of(rows)
    assert constant_images(facts) == {s for s, f in rows.items() if is_constant(f)} == {"b", "e"}


def test_the_screen_on_columns_flags_what_the_rules_flag_image_by_image():
    """Random statistics, a few images of each absolute kind: the columns' screen drops exactly the images
    ``outlier_reason`` names (the relative rules abstain on noise without a gap), with its reasons and details."""
    rng = np.random.default_rng(7)
    rows, raw = {}, {}
    for i in range(400):
        sha = f"{i:064x}"
        side = 4 if i % 97 == 3 else 32
        f = ImageFeatures(f"p{i}", float(rng.uniform(50, 400)), float(rng.uniform(60, 200)), 0.0, 255.0, None,
                          0.2 if i % 89 == 5 else float(rng.uniform(10, 80)), "grey" if i % 3 else "colour")
        rows[sha] = BROKEN if i % 101 == 7 else f
        raw[sha] = RawFacts(sha, str(i % 4), side, side)
    limits = OutlierSettings(min_blur=60.0)
    eligible, dropped, outliers, _ = screen(RawRows.of(raw.values()), Features(FeatureFacts.of(rows), {}, np.zeros((0, 1))), {}, limits)

    expected = {}
    for sha, f in rows.items():
        if f.error is None:
            bad = outlier_reason(Measured(f.family, raw[sha].width, raw[sha].height, f.mean, f.contrast, f.blur), limits)
            if bad is not None:
                expected[sha] = bad
    assert {o[0]: (o[1], o[2]) for o in outliers} == expected
    assert {d["sha256"] for d in dropped} == set(expected) | {s for s, f in rows.items() if f.error}
    assert {"too_small", "flat", "blurry"} <= {r for r, _ in expected.values()}
    assert list(eligible) == [s for s in raw if s not in expected and rows[s].error is None]


def test_rows_of_computed_vectors_are_found_by_raw_position():
    rows = RawRows.of(RawFacts(s, "1", 8, 8) for s in ["a", "b", "c", "d", "e"])
    row_of = RowOf.of(rows, rows.positions(["d", "b"]))  # matrix row 0 is d's, row 1 b's
    assert (row_of["d"], row_of["b"]) == (0, 1) and dict(row_of) == {"b": 1, "d": 0} and len(row_of) == 2
    assert "c" not in row_of and "zz" not in row_of
    with pytest.raises(KeyError):
        row_of["c"]  # a raw row with no computed vector
    with pytest.raises(KeyError):
        RowOf.of(rows, np.array([0, -1]))  # an embedded image that is no raw row


def test_stored_facts_fill_the_wanted_images_first_row_under_the_config(tmp_path):
    from deltalake import write_deltalake

    uri = str(tmp_path / "features")

    def rows(config: str, shas: str, run: str, blur: float = 1.0) -> pa.Table:
        table = _table({s: GOOD._replace(pixel_digest=f"{ord(s):064x}", blur=blur) for s in shas})
        return (table.append_column("config", pa.array([config] * len(shas)))
                .append_column("method", pa.array(["pixels"] * len(shas))).append_column("run_id", pa.array([run] * len(shas))))

    write_deltalake(uri, rows("v1", "cab", "r1"))
    write_deltalake(uri, rows("v2", "ad", "r2", blur=5.0), mode="append")  # another config: not read
    write_deltalake(uri, rows("v1", "ea", "r3", blur=9.0), mode="append")  # a stored twice: its first row counts
    raw = RawRows.of(RawFacts(s, "1", 32, 32) for s in "abcdez")  # d has only v2's row, z none
    facts = FeatureFacts.blank(raw.shas, raw.at)
    filled = fill_stored_facts(uri, "v1", Keys.of(raw.shas), facts)
    assert filled.tolist() == [True, True, True, False, True, False]
    assert [facts[s].pixel_digest for s in "abce"] == [f"{ord(s):064x}" for s in "abce"]
    order = [r["blur"] for b in lake.scan_batches(uri, 2, ["sha256", "config", "blur"]) for r in b.to_pylist()
             if r["sha256"] == "a" and r["config"] == "v1"]  # a's two rows, in the table's order
    assert [facts[s].blur for s in "abce"] == [order[0], 1.0, 1.0, 9.0] and facts["d"].blur is None
    assert not fill_stored_facts(str(tmp_path / "none"), "v1", Keys.of(raw.shas), facts).any()


def test_mode_families_are_byte_codes_kept_across_fills_and_a_missing_one_is_none():
    rows = RawRows.of(RawFacts(s, "1", 32, 32) for s in "abcd")
    facts = FeatureFacts.blank(rows.shas, rows.at)
    facts.fill(np.array([0, 1]), _table({"a": GOOD, "b": OLD}))  # grey, then none
    facts.fill(np.array([3]), _table({"d": GOOD._replace(family="colour")}))  # a family first seen in a later block
    assert facts.family.dtype == np.int8 and facts.families == ["grey", "colour"]
    assert [facts[s].family for s in "abcd"] == ["grey", None, None, "colour"]
    assert facts.errors == {} and not facts.failed().any()
