"""The sha256 lists beside the vector files and the index, held as one byte array: the same file, the same rows."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from tasks.curation.sha_list import Keys, ShaList


def _shas(n: int, seed: int) -> list[str]:
    return [hashlib.sha256(f"{seed}:{i}".encode()).hexdigest() for i in range(n)]


def _strings(listed: ShaList) -> list[str]:
    return [k.decode("ascii") for k in listed.array.tolist()]


def test_a_list_is_written_and_read_as_the_text_file_it_was(tmp_path):
    shas = _shas(1000, 1)  # stored order: not sorted
    path = tmp_path / "x.shas"
    ShaList.of(shas).write(path)
    assert path.read_text() == "".join(f"{s}\n" for s in shas)  # the file as the string list wrote it
    back = ShaList.read(path)
    assert back.array.dtype == np.dtype("S64") and _strings(back) == shas and len(back) == 1000


def test_lines_that_are_not_sha256s_are_read_one_by_one(tmp_path):
    path = tmp_path / "x.shas"
    path.write_text("a\nbb\nccc\n")
    assert _strings(ShaList.read(path)) == ["a", "bb", "ccc"]
    path.write_text("")
    assert _strings(ShaList.read(path)) == []


def test_each_listed_row_is_located_among_the_eligible_images_and_each_eligible_image_s_row_found():
    listed = _shas(500, 2)
    random.Random(0).shuffle(listed)  # a stored list: batches appended, not sorted
    rows = ShaList.of(listed)
    other = _shas(50, 3)
    eligible = sorted(listed[::7] + other)
    located = rows.located(Keys.of(eligible))
    assert located.tolist() == [eligible.index(s) if s in eligible else -1 for s in listed]
    assert rows.rows_of(Keys.of(eligible)).tolist() == [listed.index(s) if s in listed else -1 for s in eligible]
    assert Keys.of(eligible).order is None  # sorted, as the eligible images are: searched as they are
    unsorted = eligible[::-1]  # the eligible images not sorted: the same answer, by the order that sorts them
    assert Keys.of(unsorted).order.tolist() == list(range(len(unsorted)))[::-1]
    assert rows.located(Keys.of(unsorted)).tolist() == [unsorted.index(s) if s in unsorted else -1 for s in listed]
    assert rows.rows_of(Keys.of(unsorted)).tolist() == [listed.index(s) if s in listed else -1 for s in unsorted]
    assert ShaList.of([]).rows_of(Keys.of(eligible)).tolist() == [-1] * len(eligible)
    assert rows.located(Keys.of([])).tolist() == [-1] * len(listed) and rows.rows_of(Keys.of([])).tolist() == []


def test_a_list_extended_keeps_its_rows_and_adds_after_them_whatever_the_widths():
    short = ShaList.of(["a", "c"])
    longer = short.extended(_shas(2, 4))
    assert _strings(longer) == ["a", "c", *_shas(2, 4)] and _strings(short) == ["a", "c"]
    assert longer.rows_of(Keys.of(["b", "c", _shas(2, 4)[1]])).tolist() == [-1, 1, 3]
    assert longer.extended([]) is longer


def test_an_arrow_column_is_located_among_the_keys_as_an_arrow_lookup_would():
    """``Keys.positions``: the sha256s' data buffer as is (sliced and chunked too), other values one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tasks.curation.sha_list import Keys, column_keys

    rng = np.random.default_rng(3)
    eligible = sorted(bytes(r).hex() for r in rng.integers(0, 256, size=(300, 32), dtype=np.uint8))
    asked = [eligible[i] for i in rng.integers(0, 300, 200).tolist()] + _shas(20, seed=9)
    column = pa.chunked_array([pa.array(asked[:90]), pa.array(asked).slice(90, 130)])  # a chunk with an offset
    expected = pc.fill_null(pc.index_in(column, value_set=pa.array(eligible)), -1).to_numpy(zero_copy_only=False)
    for keys in (Keys.of(eligible), Keys.of(list(reversed(eligible)))):  # sorted, or with the order that sorts it
        got = keys.positions(column)
        located = [eligible.index(asked[i]) if asked[i] in eligible else -1 for i in range(len(asked))]
        if keys.order is None:
            assert got.tolist() == expected.tolist() == located
        else:  # positions among the reversed list
            assert got.tolist() == [299 - p if p >= 0 else -1 for p in located]
    assert column_keys(column).dtype == np.dtype("S64")
    # Not sha256s (other lengths): one value at a time, the same answers.
    odd = pa.array(["b", "a" * 70, "cd", "a"])
    assert Keys.of(["a", "b", "cd"]).positions(odd).tolist() == [1, -1, 2, 0]
    with pytest.raises(ValueError, match="nulls"):
        column_keys(pa.array(["a", None]))


def test_keys_that_share_their_first_sixteen_digits_are_still_told_apart():
    """The 64-bit prefixes serve a lookup only where they tell every key apart; otherwise whole keys are compared."""
    import pyarrow as pa

    shared = "0123456789abcdef"
    eligible = sorted([shared + "0" * 48, shared + "1" * 48, *_shas(50, seed=4)])
    keys = Keys.of(eligible)
    assert keys.prefix is None
    asked = [shared + "1" * 48, shared + "2" * 48, eligible[7], "0" * 64]
    assert keys.positions(pa.array(asked)).tolist() == [eligible.index(asked[0]), -1, 7, -1]
    apart = Keys.of(_shas(50, seed=4))
    assert apart.prefix is not None and len(apart.prefix) == 50
    assert apart.positions(pa.array(asked)).tolist() == [-1, -1, _shas(50, seed=4).index(eligible[7]), -1]  # given order
    upper = Keys.of([s.upper() for s in _shas(5, seed=4)])  # not lowercase hex: whole keys
    assert upper.prefix is None and upper.positions(pa.array([_shas(5, seed=4)[2].upper()])).tolist() != [-1]


def test_a_read_list_is_the_file_mapped_and_answers_as_one_held_in_memory(tmp_path, monkeypatch):
    from tasks.curation import sha_list

    monkeypatch.setattr(sha_list, "PREFIX_ROWS", 7)  # prefixes made a few keys at a time
    monkeypatch.setattr(sha_list, "WRITE_ROWS", 5)  # lines checked and written a few at a time
    shas = _shas(300, 4)
    path = tmp_path / "x.shas"
    ShaList.of(shas[:200]).write(path, more=shas[200:])  # a stored list and its new lines, in one file
    mapped, held = ShaList.read(path), ShaList.of(shas)
    assert not mapped.array.flags.owndata and not mapped.array.flags.c_contiguous  # 64 bytes of every 65 of the file
    assert isinstance(mapped.array.base, np.memmap) or isinstance(mapped.array.base.base, np.memmap)
    assert _strings(mapped) == shas
    rng = random.Random(3)
    eligible = Keys.of(sorted(rng.sample(shas, 120) + _shas(40, 5)))
    assert np.array_equal(mapped.located(eligible), held.located(eligible))
    position = {k: i for i, k in enumerate(eligible.array.tolist())}  # located a block of 7 at a time: as one lookup
    assert mapped.located(eligible).tolist() == [position.get(k.encode(), -1) for k in shas]
    assert np.array_equal(mapped.rows_of(eligible), held.rows_of(eligible))
    assert np.array_equal(sha_list.prefixes(mapped.array), sha_list.prefixes(held.array))
    path.write_bytes(path.read_bytes()[:65 * 10] + b"x" * 30 + b" " + b"y" * 33 + b"\n")  # 65 bytes, not a sha256
    assert len(path.read_bytes()) == 65 * 11
    assert _strings(ShaList.read(path)) == [*shas[:10], "x" * 30, "y" * 33]  # read one by one


@pytest.mark.parametrize("width", [64, 3])  # sha256s (looked up by their prefixes), and short names
def test_sorted_shas_and_a_subset_of_them_read_and_look_up_as_sorted_lists(width):
    import pyarrow as pa

    from tasks.curation.sha_list import SortedShas

    every = sorted({s[:width] for s in _shas(3000, 5)})
    base = SortedShas.of(every)
    picked = sorted(random.Random(2).sample(range(len(every)), 700))
    subset = base.take(np.array(picked))
    chosen = [every[i] for i in picked]
    assert list(base) == every and base[17] == every[17] and base[3:9] == every[3:9] and len(base) == len(every)
    assert list(subset) == chosen and subset[5] == chosen[5] and subset[2:6] == chosen[2:6] and len(subset) == 700
    for k in (0, 1, 350, 699):
        assert subset.index_of(chosen[k]) == k and base.index_of(chosen[k]) == picked[k]
    outside = every[next(i for i in range(len(every)) if i not in set(picked))]
    assert subset.index_of(outside) is None and outside not in subset and outside in base
    assert base.index_of("g" * width) is None and base.index_of("é") is None and subset.index_of("") is None
    column = pa.array([chosen[3], outside, "zz", chosen[699]])
    assert Keys.of(subset).positions(column).tolist() == [3, -1, -1, 699]
    assert Keys.of(base).positions(column).tolist() == [picked[3], every.index(outside), -1, picked[699]]
    assert len(Keys.of(subset)) == 700 and Keys.of(subset).at(np.array([0, 2])).tolist() == \
        [chosen[0].encode(), chosen[2].encode()]
    assert list(subset.union([outside, chosen[0]])) == sorted({*chosen, outside})
    with pytest.raises(KeyError):
        subset.union(["not one"])
    with pytest.raises(ValueError):
        SortedShas.of(every[::-1])
    listed = ShaList.of([chosen[9], outside, chosen[1]])
    assert listed.located(Keys.of(subset)).tolist() == [9, -1, 1]
    assert listed.rows_of(Keys.of(subset)).tolist()[:10] == [-1, 2, -1, -1, -1, -1, -1, -1, -1, 0]
    assert ShaList.of(chosen[:2]).located(Keys.of(base.take(np.zeros(0, dtype=np.int64)))).tolist() == [-1, -1]


def test_rows_found_a_block_of_the_list_at_a_time_are_the_first_of_an_image_listed_twice(monkeypatch):
    from tasks.curation import sha_list

    monkeypatch.setattr(sha_list, "PREFIX_ROWS", 4)  # the list read 4 rows at a time
    shas = _shas(30, 6)
    listed = shas[:10] + [shas[3]] + shas[10:20] + [shas[3], shas[12]] + shas[20:25]  # twice, in and across blocks
    asked = sorted(random.Random(2).sample(shas, 20))
    expected = [listed.index(s) if s in listed else -1 for s in asked]
    rows = ShaList.of(listed).rows_of(Keys.of(asked), np.int32)
    assert rows.dtype == np.int32 and rows.tolist() == expected
    monkeypatch.setattr(sha_list, "PREFIX_ROWS", 1 << 16)
    assert ShaList.of(listed).rows_of(Keys.of(asked)).tolist() == expected  # the list as one block: the same
