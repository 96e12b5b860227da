"""The seen-images file: deterministic bytes, 32 bytes an image, refused when it is not what it claims."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest


def test_the_same_images_in_any_order_give_the_same_bytes_32_per_image(tmp_path: Path) -> None:
    from tasks.models.seen_images import read, write

    digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(1000)]
    a = write(tmp_path / "a.npy", digests)
    b = write(tmp_path / "b.npy", list(reversed(digests)) + digests[:10])  # order and repeats do not matter
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size == 128 + 32 * 1000  # npy header + raw digests
    assert read(a) == set(digests)


def test_a_file_of_another_shape_or_type_is_refused(tmp_path: Path) -> None:
    from tasks.models.seen_images import read

    for bad in (np.zeros((3, 31), np.uint8), np.zeros((3, 32), np.int16), np.zeros(32, np.uint8)):
        np.save(tmp_path / "bad.npy", bad, allow_pickle=False)
        with pytest.raises(ValueError, match="not a uint8 array"):
            read(tmp_path / "bad.npy")
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        read(tmp_path / "pickled.npy")  # never unpickled
