"""The components after assignment held as arrays read back as the map of lists they replace."""

import random

import numpy as np
import pytest

from tasks.curation import groups as groups_module
from tasks.curation.groups import GroupsBuilder


@pytest.mark.parametrize("block", [7, 65_536])
def test_groups_are_the_map_a_dict_of_lists_would_be_a_key_given_twice_gathering_both(monkeypatch, block):
    monkeypatch.setattr(groups_module, "KEY_BLOCK", block)  # keys held as bytes a block at a time
    rng = random.Random(3)
    eligible = [f"{i:04x}" for i in range(300)]
    positions = list(range(300))
    rng.shuffle(positions)
    builder, expected = GroupsBuilder(eligible), {}
    while positions:
        take, positions = sorted(positions[:rng.choice((1, 1, 1, 2, 5))]), positions[rng.choice((1, 1, 1, 2, 5)):]
        take = [p for p in take if p not in {q for m in expected.values() for q in m}]
        if not take:
            continue
        key = rng.choice(["k1", "k2"]) if rng.random() < 0.05 else eligible[take[0]]
        builder.add(key, take)
        expected.setdefault(key, []).extend(take)
    groups = builder.build()
    want = {k: [eligible[p] for p in sorted(v)] for k, v in expected.items()}
    assert dict(groups) == want and list(groups) == sorted(want) and len(groups) == len(want)
    assert dict(groups.items()) == want
    assert "k1" in groups and "zzzz" not in groups and "" not in groups
    with pytest.raises(KeyError):
        groups["zzzz"]


def test_no_components_are_no_groups():
    groups = GroupsBuilder([]).build()
    assert dict(groups) == {} and len(groups) == 0 and list(groups.items()) == [] and "a" not in groups
    assert groups.starts.tolist() == [0] and groups.members.dtype == np.int64


@pytest.mark.parametrize("mapped", [False, True])
def test_roots_by_pointer_jumping_are_each_find_and_as_recorded_marks_unchanged_components(tmp_path, monkeypatch,
                                                                                           mapped):
    from tasks.curation import curation_features
    from tasks.curation.assignments import as_recorded, components_of
    from tasks.curation.curation_features import UnionFind

    monkeypatch.setattr(curation_features, "FILL_ROWS", 64)  # each its own parent a few blocks at a time
    rng = random.Random(5)
    sets = UnionFind(500, tmp_path / "scratch" if mapped else None)
    assert sets.roots().tolist() == list(range(500))
    for _ in range(400):
        sets.union(rng.randrange(500), rng.randrange(500))
    roots = sets.roots()
    assert roots.tolist() == [sets.find(i) for i in range(500)]
    assert roots.dtype == np.int32 and (not mapped or list((tmp_path / "scratch").iterdir()) == [])  # unlinked
    codes = np.array([-1 if rng.random() < 0.05 else int(r) % 7 for r in roots.tolist()])  # a code a component, mostly
    codes[roots == roots[3]] = -1  # a component with only new images
    same = as_recorded(roots, codes, tmp_path / "same" if mapped else None)
    assert same.dtype == bool and np.array_equal(same, as_recorded(roots, codes))  # mapped: the same answer
    for root in set(roots.tolist()):
        members = codes[roots == root]
        assert bool(same[roots == root].all()) == (len(set(members.tolist())) == 1 and members[0] >= 0)
        assert len(set(same[roots == root].tolist())) == 1
    walked = [c.tolist() for c in components_of(roots, ~same)]
    assert sorted(p for c in walked for p in c) == np.flatnonzero(~same).tolist()
    assert all(c == sorted(c) and len({int(roots[p]) for p in c}) == 1 for c in walked)
    assert [c[0] for c in walked] == sorted(c[0] for c in walked)  # by their first member
    assert as_recorded(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


def test_keys_that_are_raw_rows_are_held_as_their_positions_and_others_by_name():
    from tasks.curation.sha_list import SortedShas, SortedSubset

    raw = SortedShas.of(sorted(f"{i:04x}" for i in range(40)))
    eligible = SortedSubset(raw, np.arange(0, 40, 2))  # every other raw row
    names = {-1: "gone-key"}  # a record's code past the raw rows names a key that is no raw row

    def name_of(code):
        return names[-1] if code >= len(raw) else raw[code]

    builder = GroupsBuilder(eligible)
    builder.add_many(np.array([3, 7]), np.array([2, 1]), np.array([0, 4, 9]), name_of)  # raw rows 3, 7: not eligible
    builder.add(raw[30], np.array([15]))
    builder.add(raw[3], [1])  # given again: its members gathered
    groups = builder.build()
    assert isinstance(groups.ordered.members, SortedSubset)  # every key a raw row: positions, no bytes held
    assert groups.members.dtype == np.int32 and groups.ordered.members.positions.dtype == np.int32  # no int64 copy
    assert dict(groups) == {raw[3]: [eligible[0], eligible[1], eligible[4]], raw[7]: [eligible[9]],
                            raw[30]: [eligible[15]]}
    builder = GroupsBuilder(eligible)
    builder.add_many(np.array([5, len(raw)]), np.array([1, 2]), np.array([2, 3, 6]), name_of)
    builder.add("a-new-key", [8])
    groups = builder.build()
    assert list(groups) == sorted([raw[5], "gone-key", "a-new-key"])
    assert dict(groups) == {raw[5]: [eligible[2]], "gone-key": [eligible[3], eligible[6]], "a-new-key": [eligible[8]]}


@pytest.mark.parametrize("seed", range(8))
def test_components_given_in_order_then_a_few_more_build_the_groups_a_full_sort_builds(seed, tmp_path):
    from tasks.curation.sha_list import SortedShas, SortedSubset

    rng = random.Random(seed)
    raw = SortedShas.of(sorted(f"{i:05x}" for i in range(400)))
    eligible = SortedSubset(raw, np.array(sorted(rng.sample(range(400), 300))))
    positions = list(range(300))
    rng.shuffle(positions)
    recorded, later = positions[:240], positions[240:]
    bulk = {}  # raw row of the key -> members
    for p in recorded:
        bulk.setdefault(int(eligible.positions[rng.choice(recorded[:120])]), []).append(p)
    codes = np.array(sorted(bulk))
    members = np.concatenate([sorted(bulk[c]) for c in codes.tolist()])
    sizes = np.array([len(bulk[c]) for c in codes.tolist()])
    after = []
    while later:
        take, later = sorted(later[:rng.choice((1, 2, 3))]), later[3:]
        roll = rng.random()
        key = (raw[int(codes[0])] if roll < 0.1 * (seed % 2) else "gone" if roll > 1 - 0.1 * (seed % 3 == 2)
               else eligible[take[0]])  # a key given twice, a key no raw row (the merge then falls back), or new
        after.append((key, take))

    def built(merge: bool):
        builder = GroupsBuilder(eligible, tmp_path / "scratch" if seed % 4 < 2 else None)  # mapped arrays, or held
        builder.add_many(codes, sizes, members, lambda code: "unused")
        assert builder.bulk == len(codes)
        builder.bulk = builder.bulk if merge else 0
        for key, take in after:
            builder.add(key, np.array(take))
        return builder.build()

    merged, sorted_once = built(True), built(False)
    assert list(merged) == list(sorted_once) and dict(merged.items()) == dict(sorted_once.items())
    assert merged.members.dtype == sorted_once.members.dtype and merged.starts.tolist() == sorted_once.starts.tolist()
    assert np.array_equal(merged.members, sorted_once.members)


def test_components_given_out_of_order_are_sorted_whole():
    from tasks.curation.sha_list import SortedShas, SortedSubset

    raw = SortedShas.of([f"{i:04x}" for i in range(10)])
    eligible = SortedSubset(raw, np.arange(10))
    builder = GroupsBuilder(eligible)
    builder.add_many(np.array([4, 2]), np.array([1, 1]), np.array([1, 0]), lambda code: raw[code])
    assert builder.bulk == 0  # not ascending: the whole sort
    assert dict(builder.build()) == {"0002": ["0000"], "0004": ["0001"]}
    unsorted = GroupsBuilder(eligible)
    unsorted.add_many(np.array([2, 4]), np.array([2, 1]), np.array([3, 1, 0]), lambda code: raw[code])
    assert unsorted.bulk == 0  # a component's members not ascending: the whole sort
    assert dict(unsorted.build()) == {"0002": ["0001", "0003"], "0004": ["0000"]}


@pytest.mark.parametrize("block", [1, 3, 64, 65_536])
@pytest.mark.parametrize("mapped", [False, True])
def test_positions_grouped_by_code_are_the_stable_sort_of_their_codes(tmp_path, block, mapped):
    from tasks.curation.groups import grouped_by_code

    rng = np.random.default_rng(block)
    codes = rng.integers(-1, 90, 700).astype(np.int32)  # -1: not recorded, never among
    codes[rng.random(700) < 0.3] = 42  # a large component among the small ones
    among = (codes >= 0) & (rng.random(700) < 0.8)
    keys, sizes, members = grouped_by_code(codes, among, tmp_path / "scratch" if mapped else None, block)
    picked = np.flatnonzero(among)
    order = picked[np.argsort(codes[picked], kind="stable")]
    want_keys, want_sizes = np.unique(codes[picked], return_counts=True)
    assert keys.tolist() == want_keys.tolist() and sizes.tolist() == want_sizes.tolist()
    assert members.tolist() == order.tolist() and members.dtype == np.int32 and keys.dtype == codes.dtype
    empty = grouped_by_code(codes, np.zeros(700, dtype=bool), None, block)
    assert [len(part) for part in empty] == [0, 0, 0]


@pytest.mark.parametrize("mapped", [False, True])
def test_attached_codes_join_each_code_under_its_smallest_index_a_block_at_a_time(tmp_path, monkeypatch, mapped):
    from tasks.curation import curation_features
    from tasks.curation.curation_features import UnionFind

    monkeypatch.setattr(curation_features, "FILL_ROWS", 16)  # the codes read a few blocks at a time
    rng = np.random.default_rng(2)
    codes = rng.integers(-1, 40, 300).astype(np.int32)  # -1: not recorded, left as it is
    sets = UnionFind(300, tmp_path / "scratch" if mapped else None)
    sets.attach_codes(codes, tmp_path / "scratch" if mapped else None)
    smallest = {c: int(np.flatnonzero(codes == c)[0]) for c in set(codes.tolist()) if c >= 0}
    assert sets.roots().tolist() == [i if c < 0 else smallest[c] for i, c in enumerate(codes.tolist())]


@pytest.mark.parametrize("block", [1, 2, 3, 65_536])
def test_each_components_members_ascending_is_checked_a_block_of_components_at_a_time(block):
    from tasks.curation.groups import _each_ascending

    sizes = np.array([2, 1, 3, 2])
    assert _each_ascending(np.array([4, 9, 1, 0, 5, 7, 2, 3]), sizes, block)  # a step down only where one starts
    assert not _each_ascending(np.array([4, 9, 1, 0, 5, 7, 3, 2]), sizes, block)  # the last one's members
    assert not _each_ascending(np.array([4, 9, 1, 0, 5, 5, 2, 3]), sizes, block)  # a member twice
    assert _each_ascending(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), block)


@pytest.mark.parametrize("block", [1, 3, 65_536])
def test_a_components_recorded_splits_are_each_recorded_components_last_members_read_a_block_at_a_time(
        monkeypatch, block):
    from tasks.curation import assignments

    monkeypatch.setattr(assignments, "WRITE_ROWS", block)

    class Named:  # a record's names for codes and splits
        splits = ["train", "val", "test"]

        @staticmethod
        def name_of_code(code):
            return f"key{code}"

    rng = np.random.default_rng(block)
    codes = rng.integers(-1, 6, 40).astype(np.int32)  # -1: a new image
    split_at = rng.integers(1, 4, 40).astype(np.int8)  # 1 + a code into the splits
    last = {int(c): int(split_at[i]) for i, c in enumerate(codes.tolist()) if c >= 0}  # a later member overwrites
    want = {f"key{c}": Named.splits[k - 1] for c, k in last.items()}
    assert assignments._splits(Named, codes, split_at) == want


@pytest.mark.parametrize("block", [1, 3, 64, 65_536])
@pytest.mark.parametrize("mapped", [False, True])
def test_components_each_key_once_are_moved_as_blocks_where_the_sort_of_every_member_put_them(tmp_path, block, mapped):
    """``_placed`` (each key once, members ascending: no order of every member) lays the members out as the sort by
    (key, position) does; an empty component and one of most members included."""
    from tasks.curation.groups import _placed

    rng = np.random.default_rng(block)
    sizes = np.concatenate([rng.integers(0, 6, size=40), [500], [0]])
    rng.shuffle(sizes)
    members = np.concatenate([np.sort(rng.choice(10_000, size=int(n), replace=False)) for n in sizes]).astype(np.int32)
    place = rng.permutation(len(sizes))
    starts, out = _placed(place, sizes, members, tmp_path if mapped else None, block)
    of_member = np.repeat(place, sizes)
    order = np.lexsort((members, of_member))
    assert np.array_equal(out, members[order]) and out.dtype == members.dtype
    assert starts.tolist() == [0, *np.cumsum(np.bincount(of_member, minlength=len(sizes))).tolist()]
