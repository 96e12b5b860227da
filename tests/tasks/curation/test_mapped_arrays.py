"""Arrays by table position mapped from files: the same values as ``array``, no file left behind, and their pages not
the process's anonymous memory."""

from __future__ import annotations

import math
from array import array
from pathlib import Path

import numpy as np
import pytest

from tasks.curation.mapped_arrays import by_position, mapped_copy


@pytest.mark.parametrize(("typecode", "fill"), [("B", 0), ("B", 1), ("i", -1), ("q", -1), ("d", math.nan), ("d", 0.5)])
def test_a_mapped_array_reads_and_writes_as_an_array_does(tmp_path: Path, typecode: str, fill: float) -> None:
    mapped, plain = by_position(1_000, typecode, fill, tmp_path / "scratch"), by_position(1_000, typecode, fill, None)
    assert isinstance(plain, array) and len(mapped) == len(plain) == 1_000
    assert np.array_equal(np.frombuffer(mapped, dtype=np.dtype(typecode)), np.frombuffer(plain, dtype=np.dtype(typecode)),
                          equal_nan=typecode == "d")
    for values in (mapped, plain):
        values[7] = 1  # an item set by index, and through numpy's view of the same memory
        np.frombuffer(values, dtype=np.dtype(typecode))[9] = 2
    assert (mapped[7], mapped[9]) == (plain[7], plain[9]) == (1, 2)
    assert type(mapped[7]) is type(plain[7])  # a Python int or float, as from an array
    assert list((tmp_path / "scratch").iterdir()) == []  # unlinked once mapped
    assert len(by_position(0, typecode, fill, tmp_path / "scratch")) == 0


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_a_mapped_arrays_pages_are_not_anonymous_memory(tmp_path: Path) -> None:
    n = 8 << 20  # 64 MiB of float64, every page written
    anonymous = _kib("RssAnon")
    mapped = by_position(n, "d", math.nan, tmp_path)
    grown = _kib("RssAnon") - anonymous
    assert np.isnan(np.frombuffer(mapped, dtype=np.float64)).all()
    assert grown < 8 << 10  # KiB: under 8 MiB of the 64 (numpy's own temporaries), where an array adds all 64
    held = by_position(n, "d", math.nan, None)
    assert _kib("RssAnon") - anonymous > 48 << 10
    del held


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_a_mapped_copy_holds_the_values_writable_and_without_a_folder_is_them(tmp_path: Path, dtype) -> None:
    values = (np.arange(1_000) * 3 - 7).astype(dtype)
    copied = mapped_copy(values, tmp_path)
    assert copied.dtype == dtype and np.array_equal(copied, values) and not np.shares_memory(copied, values)
    copied[5] = 1
    assert values[5] == 8 and list(tmp_path.iterdir()) == []
    assert mapped_copy(values, None) is values and len(mapped_copy(values[:0], tmp_path)) == 0


@pytest.mark.parametrize("block", [1, 7, 65_536])
def test_take_and_compress_into_are_numpys_a_block_at_a_time(tmp_path, block):
    from tasks.curation.mapped_arrays import compress_into, mapped_zeros, take_into

    rng = np.random.default_rng(block)
    values = rng.integers(-50, 50, size=1_000).astype(np.int32)
    at = rng.integers(0, 1_000, size=777).astype(np.int32)
    assert np.array_equal(take_into(values, at, mapped_zeros(len(at), values.dtype, tmp_path), block), values[at])
    keep = rng.random(1_000) < 0.3
    out = mapped_zeros(int(keep.sum()), values.dtype, tmp_path)
    assert np.array_equal(compress_into(keep, values, out, block), values[keep])
    with pytest.raises(IndexError):
        take_into(values, np.array([0, 1_000]), np.zeros(2, dtype=values.dtype), block)
