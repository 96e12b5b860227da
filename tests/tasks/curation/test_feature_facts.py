"""The features' facts held as columns read back as the tuples they were, and the screen reads them as before."""

import numpy as np
import pyarrow as pa
import pytest

from tasks.curation.curation_features import (
    FACTS_SCHEMA,
    Features,
    RowOf,
    facts_in_order,
    stored_facts,
    stored_positions,
)
from tasks.curation.feature_facts import FeatureFacts, ImageFeatures
from tasks.curation.outliers import CONSTANT_STD, Measured, constant_images, is_constant, outlier_reason, screen
from tasks.curation.sha_list import Keys
from tasks.curation.tables import RawFacts, RawRows
from tasks.settings import OutlierSettings

GOOD = ImageFeatures("d1", 240.0, 78.0, 0.0, 255.0, None, 30.0, "grey")
BLACK = ImageFeatures("d2", 0.0, 0.0, 0.0, 0.0, None, 0.0, "grey")
BROKEN = ImageFeatures(None, None, None, None, None, "undecodable: truncated", None, None)
OLD = ImageFeatures("d3", 12.0, 128.0, 0.0, 255.0, None, None, None)  # stored before contrast and family


def test_a_table_read_as_columns_gives_back_each_images_tuple_nulls_as_none():
    rows = {"a": GOOD, "b": BLACK, "c": BROKEN, "d": OLD}
    table = pa.Table.from_pylist([{"sha256": s, **f._asdict()} for s, f in rows.items()])
    facts = FeatureFacts.of_table(table)
    assert dict(facts) == rows and list(facts) == list(rows) and len(facts) == 4
    assert "c" in facts and "z" not in facts
    assert facts.failed().tolist() == [False, False, True, False]
    assert dict(FeatureFacts.of(rows)) == rows


def test_a_table_without_the_newer_columns_reads_them_as_missing():
    table = pa.Table.from_pylist([{"sha256": "a", "pixel_digest": "d", "blur": 1.0, "mean": 2.0, "min": 0.0,
                                   "max": 9.0, "error": None}])
    assert FeatureFacts.of_table(table)["a"] == ImageFeatures("d", 1.0, 2.0, 0.0, 9.0, None, None, None)


def _table(rows: dict[str, ImageFeatures]) -> pa.Table:
    return pa.Table.from_pylist([{"sha256": s, **f._asdict()} for s, f in rows.items()], schema=FACTS_SCHEMA)


def test_facts_in_the_raw_rows_order_come_from_the_stored_rows_else_the_computed_ones_and_share_their_map():
    stored, fresh = _table({"c": OLD, "a": GOOD}), _table({"b": BLACK})
    rows = RawRows.of(RawFacts(s, "1", 32, 32) for s in "abc")
    found = stored_positions(np.array([2, 0]), 3)  # the stored rows' images: c, a
    assert found.tolist() == [1, -1, 0]
    facts = facts_in_order(stored, fresh, found, rows)
    assert facts.at is rows.at and list(facts) == ["a", "b", "c"]
    assert dict(facts) == {"a": GOOD, "b": BLACK, "c": OLD}
    assert facts.failed().tolist() == [False, False, False] and constant_images(facts) == {"b"}
    with pytest.raises(KeyError, match="1 images have neither"):
        facts_in_order(stored, _table({}), found, rows)


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


def test_stored_facts_are_the_wanted_images_rows_under_the_config_with_their_positions(tmp_path):
    from deltalake import write_deltalake

    uri = str(tmp_path / "features")

    def rows(config: str, shas: str, run: str) -> pa.Table:
        table = _table({s: GOOD._replace(pixel_digest=f"{config}-{s}") for s in shas})
        return (table.append_column("config", pa.array([config] * len(shas)))
                .append_column("method", pa.array(["pixels"] * len(shas))).append_column("run_id", pa.array([run] * len(shas))))

    write_deltalake(uri, rows("v1", "cab", "r1"))
    write_deltalake(uri, rows("v2", "ad", "r2"), mode="append")
    write_deltalake(uri, rows("v1", "e", "r3"), mode="append")  # z is asked for and not stored: no row
    wanted = Keys.of(["a", "b", "c", "d", "e", "z"])
    facts, at = stored_facts(uri, "v1", wanted)
    assert "sha256" not in facts.column_names and "config" not in facts.column_names
    digests = facts.column("pixel_digest").to_pylist()
    assert sorted(zip(at.tolist(), digests)) == [(0, "v1-a"), (1, "v1-b"), (2, "v1-c"), (4, "v1-e")]
    assert stored_positions(at, len(wanted)).tolist()[3] == -1
    assert [digests[r] for r in stored_positions(at, len(wanted)) if r >= 0] == ["v1-a", "v1-b", "v1-c", "v1-e"]
    assert stored_facts(str(tmp_path / "none"), "v1", wanted)[0].num_rows == 0
