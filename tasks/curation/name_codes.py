"""Names (class labels, mode families) as integer codes into a list of the names: one small int an image, not a string.

The one encoder the curation's columns share (the raw rows' labels, the features' families, a rule's classes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def encode(values: pa.Array | pa.ChunkedArray | Sequence[str], names: list[str], dtype: type = np.int32,
           most: int | None = None) -> np.ndarray:
    """Each value's code into ``names``, -1 for a null. A name not there yet is appended to ``names`` (in place) as
    it is first seen; ``most``: more names than this is a ``ValueError`` (the codes' type holds no more).

    Each distinct value is looked up once (Arrow's dictionary encoding), not once an image."""
    column = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, pa.string())
    encoded = (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column).dictionary_encode()
    code = {name: k for k, name in enumerate(names)}
    for name in encoded.dictionary.to_pylist():
        if name not in code:
            if most is not None and len(names) >= most:
                raise ValueError(f"more than {most} distinct names")
            code[name] = len(names)
            names.append(name)
    to_code = np.array([code[n] for n in encoded.dictionary.to_pylist()] + [-1], dtype=dtype)  # a null's index: -1
    return to_code[encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)]
