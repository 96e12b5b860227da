"""The facts held as columns read as the dict of named tuples they replace: same values, types and Nones."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from tasks.curation.feature_facts import FACT_COLUMNS, FactColumns, ImageFeatures
from tasks.curation.tables import RawFacts


def _table(rows: list[dict]) -> pa.Table:
    schema = pa.schema([("sha256", pa.string()), ("pixel_digest", pa.string()), ("blur", pa.float64()),
                        ("mean", pa.float64()), ("min", pa.float64()), ("max", pa.float64()), ("error", pa.string()),
                        ("contrast", pa.float64()), ("family", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def _as_dict(table: pa.Table) -> dict[str, ImageFeatures]:
    """The reading FactColumns replaced: a named tuple of Python objects per row, the last row of a sha256 winning."""
    cols = {c: table.column(c).to_pylist() if c in table.column_names else [None] * table.num_rows
            for c in FACT_COLUMNS}
    return {sha: ImageFeatures(*(cols[c][i] for c in FACT_COLUMNS))
            for i, sha in enumerate(table.column("sha256").to_pylist())}


ROWS = [
    {"sha256": "c" * 64, "pixel_digest": "d1", "blur": 1.5, "mean": 0.25, "min": 0.0, "max": 1.0, "error": None,
     "contrast": 0.3, "family": "grey"},
    {"sha256": "a" * 64, "pixel_digest": None, "blur": None, "mean": None, "min": None, "max": None,
     "error": "undecodable: not an image", "contrast": None, "family": None},
    {"sha256": "b" * 64, "pixel_digest": "", "blur": float("nan"), "mean": 2.0, "min": -1.0, "max": 3.0, "error": None,
     "contrast": 0.0, "family": "colour"},
    {"sha256": "é" + "e" * 63, "pixel_digest": "d4", "blur": 7.0, "mean": 0.5, "min": 0.0, "max": 1.0, "error": None,
     "contrast": None, "family": "grey"},
    {"sha256": "c" * 64, "pixel_digest": "d5", "blur": 9.0, "mean": 0.75, "min": 0.0, "max": 1.0, "error": None,
     "contrast": 0.5, "family": "grey"},  # a sha256 twice: its last row
]


def _same(a: ImageFeatures, b: ImageFeatures) -> bool:
    return all((x is None and y is None) or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               or (x == y and type(x) is type(y)) for x, y in zip(a, b))


def test_every_image_reads_as_the_dict_of_named_tuples() -> None:
    table = _table(ROWS)
    facts, expected = FactColumns.from_table(table), _as_dict(table)
    assert len(facts) == len(expected) == 4
    assert list(facts) == sorted(expected)  # sha256 order
    for sha, want in expected.items():
        assert sha in facts and _same(facts[sha], want), sha
    assert facts["c" * 64].pixel_digest == "d5"
    assert "f" * 64 not in facts and 3 not in facts and facts.get("f" * 64) is None
    with pytest.raises(KeyError):
        facts["f" * 64]


def test_a_table_without_the_newer_columns_reads_them_as_none() -> None:
    table = _table(ROWS[:3]).drop_columns(["contrast", "family"])
    facts = FactColumns.from_table(table)
    assert all(facts[s].contrast is None and facts[s].family is None for s in facts)
    assert all(_same(facts[s], want) for s, want in _as_dict(table).items())


def test_merged_takes_the_newer_row_and_keeps_the_rest() -> None:
    older, newer = FactColumns.from_table(_table(ROWS[:3])), FactColumns.from_table(_table(ROWS[3:]))
    merged = older.merged(newer)
    assert len(merged) == 4 and merged["c" * 64].blur == 9.0 and merged["a" * 64].error.startswith("undecodable")
    assert len(FactColumns.empty().merged(newer)) == 2 and len(FactColumns.empty()) == 0


def test_raw_facts_read_as_the_dicts_of_the_raw_rows() -> None:
    raw = pa.table({"sha256": ["b" * 64, "a" * 64, "c" * 64, "a" * 64], "width": pa.array([32, 640, 8, 33], pa.int32()),
                    "height": pa.array([32, 480, 8, 34], pa.int32()), "label": ["7", "cat", "7", "dog"]})
    facts = RawFacts.from_table(raw)
    expected = {r["sha256"]: r for r in sorted(raw.to_pylist(), key=lambda r: r["sha256"])}
    assert list(facts) == list(expected) and dict(facts.items()) == expected
    assert all(type(facts[s]["width"]) is int and type(facts[s]["label"]) is str for s in facts)
    assert facts["a" * 64] == {"sha256": "a" * 64, "width": 33, "height": 34, "label": "dog"}  # its last row
