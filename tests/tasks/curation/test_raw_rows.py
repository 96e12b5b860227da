"""The raw version's facts and the pixel keys held by position read back as the maps they were."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from tasks.curation.pixel_keys import Digests, PixelKeys, token
from tasks.curation.sha_list import SortedShas
from tasks.curation.tables import RawFacts, RawRows, raw_facts


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_raw_rows_are_the_map_of_sorted_tuples_they_replace():
    rows = [RawFacts(_sha(str(i)), str(i % 3), 32 + i, 30 - i % 5) for i in range(50)]
    rows += [RawFacts(rows[4].sha256, "z", 1, 1), RawFacts(rows[7].sha256, "0", 99, 99)]  # a sha256 given twice
    table = pa.Table.from_pylist([r._asdict() for r in reversed(rows)])
    expected = {r.sha256: r for r in sorted(rows)}  # the map the plan held before
    for got in (raw_facts(table), RawRows.of(rows)):
        assert dict(got) == expected and list(got) == list(expected) == sorted(expected)
        assert got.sizes() == {label: sum(r.label == label for r in expected.values()) for label in "012z"}
        some = list(expected)[::7]
        assert got.labels_at(got.positions(some)) == [expected[s].label for s in some]
        assert [got.label(s) for s in some] == [expected[s].label for s in some]
        assert rows[4].sha256 in got and "nope" not in got and len(got) == 50


def test_the_raw_rows_are_one_byte_array_and_locate_a_column_without_strings():
    table = pa.Table.from_pylist([{"sha256": _sha(str(i)), "label": "a", "width": 8, "height": 8} for i in range(20)])
    got = raw_facts(table)
    assert isinstance(got.shas, SortedShas) and got.shas.array.dtype == np.dtype("S64")
    assert list(got.shas) == sorted(_sha(str(i)) for i in range(20))
    read = pa.array([_sha("3"), _sha("outside"), _sha("17"), "short"])
    assert got.located(read).tolist() == [got.at[_sha("3")], -1, got.at[_sha("17")], -1]
    assert got.at.get(_sha("outside")) is None and got.at.get("é" * 64) is None and got.at.get(3) is None


def test_an_empty_raw_version_reads_as_no_rows():
    empty = raw_facts(pa.table({"sha256": pa.array([], pa.string()), "label": pa.array([], pa.string()),
                                "width": pa.array([], pa.int64()), "height": pa.array([], pa.int64())}))
    assert len(empty) == 0 and dict(empty) == {} and empty.sizes() == {}


def test_pixel_keys_give_back_each_key_and_group_the_equal_ones():
    shas = sorted(_sha(f"image{i}") for i in range(12))
    at = {s: i for i, s in enumerate(shas)}
    keys = [_sha(f"pixels{i % 5}") for i in range(10)] + ["not a digest", shas[11].upper()]
    pixels = PixelKeys.of(at, keys)
    assert dict(pixels) == dict(zip(shas, keys)) and len(pixels) == 12
    assert pixels.packed.nbytes == 12 * 32 and set(pixels.odd) == {shas[10], shas[11]}
    order = np.array([3, 0, 8, 5, 10, 11, 1, 6], dtype=np.int64)  # keys 3, 0, 3, 0, odd, odd, 1, 1
    first = pixels.first_alike(order, np.arange(len(order)))
    expected = [next(j for j, q in enumerate(order) if keys[q] == keys[p]) for p in order]
    assert first.tolist() == expected == [0, 1, 0, 1, 4, 5, 6, 6]
    assert pixels.first_alike(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


def test_the_first_alike_of_a_few_is_their_first_among_all():
    import random

    rng = random.Random(5)
    shas = sorted(_sha(f"image{i}") for i in range(300))
    at = {s: i for i, s in enumerate(shas)}
    head = "ab" * 8  # keys that share their first 8 bytes and differ after them
    keys = [head + _sha(f"tail{rng.randrange(20)}")[16:] if i % 3 else _sha(f"pixels{rng.randrange(40)}")
            for i in range(298)] + ["not a digest", shas[299].upper()]
    pixels = PixelKeys.of(at, keys)
    order = np.array(rng.sample(range(300), 250), dtype=np.int64)
    everyone = np.array([next(j for j, q in enumerate(order) if keys[q] == keys[p]) for p in order])
    for among in (np.array(sorted(rng.sample(range(250), 30))), np.arange(250), np.zeros(0, dtype=np.int64)):
        assert pixels.first_alike(order, among).tolist() == everyone[among].tolist()


def test_the_positions_sharing_a_head_are_those_isin_finds_a_block_at_a_time(monkeypatch):
    import random

    from tasks.curation import pixel_keys

    rng = random.Random(6)
    shas = sorted(_sha(f"image{i}") for i in range(200))
    head = "cd" * 8
    keys = [head + _sha(f"tail{i}")[16:] if i % 4 == 0 else _sha(f"pixels{rng.randrange(60)}") for i in range(199)]
    pixels = PixelKeys.of({s: i for i, s in enumerate(shas)}, keys + ["not a digest"])  # the last: its own key
    monkeypatch.setattr(pixel_keys, "HEAD_BLOCK", 7)  # several blocks
    positions = np.array(rng.sample(range(200), 150), dtype=np.int32)
    for wanted in (np.array([0, 3, 199]), np.array(rng.sample(range(200), 20)), np.zeros(0, dtype=np.int64)):
        expected = np.flatnonzero(np.isin(pixels.heads(positions), pixels.heads(wanted)))
        assert pixels.sharing_heads(positions, wanted).tolist() == expected.tolist()


def test_a_bridges_members_sharing_a_head_are_found_a_block_of_members_at_a_time(monkeypatch):
    """RecordedMembers reads its known members' raw positions a block at a time: the same hits as one array."""
    import random

    from tasks.curation import dedupe

    rng = random.Random(8)
    shas = sorted(_sha(f"image{i}") for i in range(120))
    keys = [_sha(f"pixels{rng.randrange(30)}") for i in range(120)]
    pixels = PixelKeys.of({s: i for i, s in enumerate(shas)}, keys)
    raw_at = np.array(rng.sample(range(120), 120), dtype=np.int32)  # eligible -> raw position, shuffled
    known = np.array(sorted(rng.sample(range(120), 90)), dtype=np.int32)
    wanted = raw_at[np.setdiff1d(np.arange(120), known)]
    expected = pixels.sharing_heads(raw_at[known], wanted).tolist()
    for block in (1, 7, 90, 65_536):
        monkeypatch.setattr(dedupe, "HEAD_BLOCK", block)
        assert dedupe._sharing_heads(pixels, known, raw_at, wanted).tolist() == expected
    assert dedupe._sharing_heads(pixels, known[:0], raw_at, wanted).tolist() == []


def test_a_pixel_keys_token_is_equal_exactly_when_the_keys_are():
    shas = sorted(_sha(f"image{i}") for i in range(4))
    keys = [_sha("pixels0"), _sha("pixels0"), _sha("pixels1"), "odd key"]
    pixels = PixelKeys.of({s: i for i, s in enumerate(shas)}, keys)
    tokens = [pixels.token(s) for s in shas]
    assert tokens == [token(k) for k in keys] and [bytes(t).hex() for t in tokens[:3]] == keys[:3]
    assert isinstance(tokens[0], bytes) and len(tokens[0]) == 32 and tokens[3] == "odd key"
    assert tokens[0] == tokens[1] != tokens[2] and token(keys[0].upper()) == keys[0].upper()


@pytest.mark.parametrize("decode_rows", [3, 65_536])
def test_digests_read_from_a_column_give_back_each_value_and_the_keys_of_the_strings(
        decode_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hex digests packed, odd strings (a name, upper case, a non-ASCII one of 64 bytes, empty) kept as they are, a
    missing digest None; over two chunks and a sliced one. The pixel keys built from them are those built from the
    strings, an image without a digest keyed by its sha256."""
    shas = sorted(_sha(f"image{i}") for i in range(9))
    shas.insert(8, "test-name")  # an image without a digest whose name is no sha256: its key is odd too
    values = [_sha("p0"), None, _sha("p0"), "not a digest", _sha("p1").upper(), "é" * 32, "", _sha("p2"), None,
              _sha("p3")]
    monkeypatch.setattr("tasks.curation.pixel_keys.DECODE_ROWS", decode_rows)  # slices within the chunks, or none
    column = pa.chunked_array([pa.array(values[:4]), pa.array(["x", *values[4:]]).slice(1)])
    digests = Digests.of_column(column)
    assert [digests.value(i) for i in range(len(values))] == values and len(digests) == 10
    assert sorted(digests.odd) == [3, 4, 5, 6] and digests.present.tolist() == [v is not None for v in values]
    taken = digests.take(np.array([9, 3, 1, 0], dtype=np.int64))
    assert [taken.value(i) for i in range(4)] == [values[9], values[3], None, values[0]]
    at = {s: i for i, s in enumerate(shas)}
    packed = PixelKeys.of_digests(at, shas, digests)
    expected = PixelKeys.of(at, [v if v is not None else s for s, v in zip(shas, values, strict=True)])
    assert dict(packed) == dict(expected) and packed.odd == expected.odd
    assert [packed.key_at(i) for i in range(len(shas))] == [expected.key_at(i) for i in range(len(shas))]
    assert packed.packed is digests.packed  # the digests' own bytes: no copy an image
    assert "test-name" in packed.odd
    assert Digests.of_values([]).packed.shape == (0, 32) and len(Digests.of_column(pa.chunked_array([], pa.string()))) == 0


def test_raw_rows_read_a_block_at_a_time_are_those_of_the_whole_table():
    """``read_raw`` makes the rows from blocks of the table: a sha256 given twice across blocks keeps its greatest row,
    and the labels are numbered as the sorted rows first show them, whatever the blocks."""
    from tasks.curation.tables import rows_of_blocks

    rows = [RawFacts(_sha(str(i)), "bca"[i % 3], 32 + i, 30 - i % 5) for i in range(40)]
    rows += [RawFacts(rows[4].sha256, "z", 1, 1), RawFacts(rows[7].sha256, "a", 99, 99), RawFacts(rows[7].sha256, "a", 9, 9)]
    table = pa.Table.from_pylist([r._asdict() for r in reversed(rows)])
    whole = raw_facts(table)
    for cut in ([1, 2], [17, 30], [41]):
        edges = [0, *cut, table.num_rows]
        got = rows_of_blocks([table.slice(a, b - a) for a, b in zip(edges, edges[1:])])
        assert dict(got) == dict(whole) == {r.sha256: r for r in sorted(rows)}
        assert got.names == whole.names and got.codes.tolist() == whole.codes.tolist()
