"""The features table gains the statistics' columns without losing what an older version of it holds."""

import numpy as np
import pyarrow as pa

from tasks.curation.curation_features import (
    FEATURES_SCHEMA,
    _as_features,
    compute_features,
    feature_config,
    load_features,
    store_features,
)
from tasks.curation.tables import EMBEDDINGS_TABLE
from tasks.data import lake
from tests.factories.curation import digit, encode


def test_rows_with_the_new_columns_merge_into_a_table_written_before_them(settings, tmp_path):
    uri = settings.table_uri(EMBEDDINGS_TABLE)
    old_schema = pa.schema([f for f in FEATURES_SCHEMA if f.name not in ("contrast", "family")])
    old_row = {"sha256": "a" * 64, "config": "pixels;feature_size=8;export_min_side=32;fastdup=2.54", "method": "pixels",
               "pixel_digest": "d", "embedding": [0.125] * 64, "blur": 240.0, "mean": 78.0, "min": 0.0, "max": 255.0,
               "error": None, "run_id": "old"}
    lake.merge_new_rows(uri, pa.Table.from_pylist([old_row], schema=old_schema), ["sha256", "config"], {"step": "t"})

    cfg = settings.curation
    assert "stats=v2" in feature_config(cfg) and "fastdup" not in feature_config(cfg)  # pixels: no fastdup version
    images = [("b" * 64, encode(digit(0), "PNG")), ("c" * 64, b"not an image")]
    rows = compute_features(images, cfg, tmp_path / "work", run_id="new")
    assert not (tmp_path / "work").exists()  # embedding: pixels writes no exported copies
    store_features(uri, rows, {"step": "t"})

    table = lake.read(uri, lake.current_version(uri))
    assert {"contrast", "family"} <= set(table.column_names) and table.num_rows == 3
    fresh = load_features(uri, feature_config(cfg), {"a" * 64, "b" * 64, "c" * 64})
    assert set(fresh.by_sha) == {"b" * 64, "c" * 64}  # the old row is another config: never misread
    good = fresh.by_sha["b" * 64]
    assert good.family == "grey" and good.contrast > 0 and good.blur > 0 and good.error is None
    assert fresh.by_sha["c" * 64].error.startswith("undecodable")
    old = load_features(uri, old_row["config"], {"a" * 64}).by_sha["a" * 64]
    assert (old.blur, old.contrast, old.family) == (240.0, None, None)


def test_the_embedding_matrix_is_the_valid_rows_made_unit_length_whichever_chunks_hold_them():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(9, 4)).astype(np.float32)
    vectors[4] = 0.0  # a flat image's row stays zero
    rows = [{"sha256": f"{i:064d}", "embedding": v.tolist(), "error": None} for i, v in enumerate(vectors)]
    rows[2]["embedding"], rows[6]["error"] = None, "did not decode"  # no row in the matrix
    schema = pa.schema([FEATURES_SCHEMA.field(c) for c in ("sha256", "embedding", "error")])
    table = pa.Table.from_batches([pa.RecordBatch.from_pylist(part, schema=schema)
                                   for part in (rows[:1], rows[1:5], [], rows[5:])], schema=schema)
    features = _as_features(table)
    valid = [0, 1, 3, 4, 5, 7, 8]
    norms = np.linalg.norm(vectors[valid], axis=1, keepdims=True)
    np.testing.assert_array_equal(features.matrix, vectors[valid] / np.where(norms == 0, 1.0, norms))
    assert features.row_of == {f"{i:064d}": r for r, i in enumerate(valid)}
