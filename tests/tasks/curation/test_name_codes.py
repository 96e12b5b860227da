"""Names as integer codes (tasks.curation.name_codes)."""

import numpy as np
import pyarrow as pa
import pytest

from tasks.curation.name_codes import encode


def test_names_are_coded_once_a_name_as_first_seen_and_a_null_is_minus_one():
    """One encoder for labels and families: codes into the names given, new names appended in the order first seen."""
    names = ["b"]
    codes = encode(pa.chunked_array([["a", None, "b"], ["c", "a"]]), names)
    assert names == ["b", "a", "c"] and codes.tolist() == [1, -1, 0, 2, 1] and codes.dtype == np.int32
    small = encode(["x", "y"], [], np.int8, most=2)
    assert small.dtype == np.int8 and small.tolist() == [0, 1]
    with pytest.raises(ValueError):
        encode(["x", "y", "z"], [], np.int8, most=2)
