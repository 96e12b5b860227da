"""The components after assignment: each final component key and its eligible members, held as arrays.

Every curation holds every component from the assignment to the end of the walk: a batch keeps the decisions of the
components it does not touch (``tasks.curation.prior_walk``), but must know them all. Where most components are one
image (distinct photos), a map from key to a list of members took about 100 bytes an image (a list and a map entry a
component; measured with ``tracemalloc`` on 100,000 singletons). Here the keys are one sorted list (a lookup is a
binary search) and the members positions into the eligible images (int32), 20 bytes an image; a lookup builds
that component's list of sha256.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from tasks.curation.by_position import PlaceAmong, SortedRank
from tasks.curation.mapped_arrays import mapped_zeros, take_into
from tasks.curation.positions import position_code, position_dtype
from tasks.curation.sha_list import SortedShas, SortedSubset, keys

KEY_BLOCK = 65_536  # component keys given as strings, coded a block at a time


class Groups(Mapping[str, list[str]]):
    """Final component key -> its eligible members (ascending, as the eligible images), keys in ascending order."""

    def __init__(self, eligible: Sequence[str], keys: SortedShas | SortedSubset, starts: np.ndarray, members: np.ndarray
                 ) -> None:
        self.eligible = eligible
        self.ordered = SortedRank(keys)  # ascending, distinct: key -> its place
        self.starts = starts  # len(keys) + 1: the members of keys[k] are members[starts[k]:starts[k + 1]]
        self.members = members  # positions into ``eligible``
        self._rank: SortedRank | None = None  # eligible image -> its position, made when ``index_in`` is first asked

    def positions(self, key: str) -> np.ndarray:
        """The members of ``key`` as ascending positions into ``eligible`` (no string made)."""
        k = self.ordered[key]
        return self.members[self.starts[k]:self.starts[k + 1]]

    def keys_where(self, hit_of: Callable[[np.ndarray], np.ndarray], block: int = KEY_BLOCK) -> set[str]:
        """The keys of the components with a member ``hit_of`` marks (given a block of ``members``, a bool each): a
        block at a time, each hit's component found by bisecting ``starts`` (a component number a member, int64, and
        a mark a member were about 9 bytes an image of a batch's heap)."""
        found: set[int] = set()
        for a in range(0, len(self.members), block):
            hit = np.flatnonzero(hit_of(self.members[a:a + block])) + a
            found.update(np.unique(np.searchsorted(self.starts, hit, side="right") - 1).tolist())
        keys = self.ordered.members
        return {keys[k] for k in found}

    def rank(self) -> SortedRank:
        """The eligible images -> their positions (made when first asked: a bisection of their bytes)."""
        if self._rank is None:
            self._rank = SortedRank(self.eligible)
        return self._rank

    def index_in(self, key: str, sha: str) -> int | None:
        """``sha``'s index among ``positions(key)``, None when it is not a member."""
        return PlaceAmong(self.rank(), self.positions(key)).get(sha)

    def _members(self, k: int) -> list[str]:
        eligible = self.eligible
        return [eligible[p] for p in self.members[self.starts[k]:self.starts[k + 1]].tolist()]

    def __getitem__(self, key: str) -> list[str]:
        return self._members(self.ordered[key])

    def __contains__(self, key: object) -> bool:
        return key in self.ordered

    def __iter__(self) -> Iterator[str]:
        return iter(self.ordered)

    def __len__(self) -> int:
        return len(self.ordered)

    def items(self) -> Iterator[tuple[str, list[str]]]:  # type: ignore[override]
        """(key, members) of every component, in key order (a list built for one component at a time)."""
        for k, key in enumerate(self.ordered):
            yield key, self._members(k)


class GroupsBuilder:
    """Collects (key, member positions) in any order; a key given twice gathers the members of both. A key is held as
    a code: its position among the raw rows where it is one of them (``eligible``'s base, when ``eligible`` is a
    ``SortedSubset`` of them), else past them, a string kept for each such key (few: a component named after an image
    that left the raw version). The groups' keys are then the raw rows' own, 4 bytes a component (as bytes, with their
    prefixes for the lookups, they were 72: at a million images about 26 MB held from the assignment to the end)."""

    def __init__(self, eligible: Sequence[str], scratch: Path | None = None) -> None:
        """``scratch``: a folder the built groups' arrays are mapped from (``mapped_arrays``), held from the assignment
        to the end of the walk (about 16 bytes an image where most components are one image)."""
        self.eligible, self.scratch = eligible, scratch
        self.base = eligible.base if isinstance(eligible, SortedSubset) else None
        self.n = len(self.base) if self.base is not None else 0
        self.codes: list[np.ndarray] = []
        self.pending: list[int] = []
        self.outside: dict[str, int] = {}  # a key that is no raw row -> its code past them, less ``n``
        self.kind = position_dtype(len(eligible))  # positions into the eligible images
        # a key's code: a raw row's position, or past the rows one a key named as a string (at most one a component)
        self.code_kind = position_dtype(self.n + len(eligible))
        self.sizes = array("q")
        self.members = array(position_code(len(eligible)))  # as ``Groups`` holds them: no int64 copy
        self.bulk = 0  # components given first, by ``add_many``, in order: ascending codes, each one's members ascending
        self.held: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # their codes, sizes, members: as given

    def code(self, key: str) -> int:
        at = self.base.index_of(key) if self.base is not None else None
        return at if at is not None else self.n + self.outside.setdefault(key, len(self.outside))

    def add(self, key: str, positions: Sequence[int] | np.ndarray) -> None:
        self.pending.append(self.code(key))
        if len(self.pending) == KEY_BLOCK:
            self._flush()
        self.sizes.append(len(positions))
        if isinstance(positions, np.ndarray):
            self._extend(positions)
        else:
            self.members.extend(positions)

    def add_many(self, codes: np.ndarray, sizes: np.ndarray, members: np.ndarray, name_of: Callable[[int], str]
                 ) -> None:
        """``add`` for many components at once: their keys as positions among the raw rows (``eligible``'s base), or
        past them a code ``name_of`` names, their sizes, and their members one component after the other. Given first
        and in order (ascending codes, each component's members ascending: ``grouped_by_code``'s), they are the
        ``bulk`` and held as given (arrays mapped from a folder stay mapped: no copy of every recorded image's)."""
        self._flush()
        codes = np.asarray(codes, dtype=self.code_kind)
        outside = np.flatnonzero(codes >= self.n)  # every code when there is no base: each named
        if len(outside):
            codes = codes.copy()  # the caller's stay as they are
            for j in outside.tolist():
                codes[j] = self.code(name_of(int(codes[j])))
        sizes = np.asarray(sizes, dtype=np.int64)
        members = np.asarray(members, dtype=self.kind)
        if not self.sizes and self.held is None and len(codes) and _ascending(codes) and _each_ascending(members, sizes):
            self.held, self.bulk = (codes, sizes, members), len(codes)  # ``build`` merges what follows into them
            return
        self.codes.append(codes)
        self.sizes.frombytes(memoryview(np.ascontiguousarray(sizes)).cast("B"))  # no int a size
        self._extend(members)

    def _extend(self, positions: np.ndarray) -> None:
        """The members appended as they are held, without a bytes copy (``tobytes`` of every member's int64 copy
        held three copies of them at once)."""
        self.members.frombytes(memoryview(np.ascontiguousarray(positions, dtype=self.kind)).cast("B"))

    def _flush(self) -> None:
        if self.pending:
            self.codes.append(np.array(self.pending, dtype=self.code_kind))
        self.pending = []

    def build(self) -> Groups:
        """The groups by key: one sort of the keys' codes, one of the members (by key, then position).

        The members and each member's key place are sorted as int32 (below 2**31 eligible images and keys) and the
        members gathered in their own type: at a million images the int64 members, their key places, the order and
        the gathered copy held about 67 bytes an image at once (bench/README.md, run 37). Components given first in
        order (``bulk``: a batch's recorded components as they were, nearly all of a table's) are not sorted again:
        the few given after them are sorted alone and merged in (``_merged``)."""
        self._flush()
        merged = self._merged() if self.bulk else None
        if merged is not None:
            return merged
        self._unheld()
        every = np.concatenate([np.zeros(0, dtype=self.code_kind), *self.codes])
        self.codes = []
        if not len(every):
            return Groups(self.eligible, SortedShas(np.zeros(0, dtype="S64")), np.zeros(1, dtype=np.int64),
                          np.zeros(0, dtype=np.int64))
        unique, rank = np.unique(every, return_inverse=True)
        del every
        ordered, rank = self._keys(unique, rank.ravel())
        sizes = np.frombuffer(self.sizes, dtype=np.int64)
        members = np.frombuffer(self.members, dtype=self.kind)
        if len(unique) == len(rank) and _each_ascending(members, sizes):  # each key once, its members ascending
            return Groups(self.eligible, ordered, *_placed(rank, sizes, members, self.scratch))
        of_member = np.repeat(rank.astype(position_dtype(len(unique))), sizes)
        del rank
        starts = mapped_zeros(len(unique) + 1, np.int64, self.scratch)
        np.cumsum(np.bincount(of_member, minlength=len(unique)), out=starts[1:])
        order = np.lexsort((members, of_member))
        del of_member
        return Groups(self.eligible, ordered, starts, take_into(members, order, mapped_zeros(len(order), self.kind,
                                                                                             self.scratch)))

    def _unheld(self) -> None:
        """The bulk's held arrays copied in front of what was added after them (the whole sort reads them all)."""
        if self.held is None:
            return
        codes, sizes, members = self.held
        self.held, self.bulk = None, 0
        self.codes.insert(0, codes)
        self.sizes, after = array("q"), self.sizes
        self.sizes.frombytes(memoryview(np.ascontiguousarray(sizes)).cast("B"))
        self.sizes.extend(after)
        self.members, after = array(self.members.typecode), self.members
        self._extend(members)
        self.members.extend(after)

    def _merged(self) -> Groups | None:
        """The groups from the ``bulk`` components and those after them (``rest``: sorted alone, as ``build`` sorts
        all), merged by key: their keys spliced into the bulk's codes, their members into the bulk's. None where the
        merge does not apply (more components after the bulk than in it, a key given twice, a key no raw row).
        The merged arrays are written into mappings of the scratch folder, the bulk's read once (no copy held)."""
        assert self.held is not None
        bulk_codes, bulk_sizes, bulk_members = self.held
        if len(self.sizes) > self.bulk:
            return None
        rest = GroupsBuilder(self.eligible)
        rest.codes, rest.sizes, rest.members, rest.outside = self.codes, self.sizes, self.members, self.outside
        groups = rest.build()
        codes = groups.ordered.members.positions if isinstance(groups.ordered.members, SortedSubset) else None
        if codes is None and len(groups):
            return None
        codes = np.zeros(0, dtype=bulk_codes.dtype) if codes is None else codes.astype(bulk_codes.dtype)
        at = np.searchsorted(bulk_codes, codes)
        if int(bulk_codes[-1]) >= self.n or (bulk_codes[np.minimum(at, len(bulk_codes) - 1)] == codes).any():
            return None
        self.held, self.codes = None, []
        one_each = np.arange(len(at) + 1)  # the inserted keys and sizes: a piece of one each
        keys = _spliced(bulk_codes, at, one_each, codes,
                        mapped_zeros(len(bulk_codes) + len(codes), bulk_codes.dtype, self.scratch))
        starts = mapped_zeros(len(keys) + 1, np.int64, self.scratch)
        _spliced(bulk_sizes, at, one_each, np.diff(groups.starts), starts[1:])
        np.cumsum(starts[1:], out=starts[1:])
        out = mapped_zeros(len(bulk_members) + len(groups.members), self.kind, self.scratch)
        ends = starts[at + one_each[:-1]] - groups.starts[:-1]  # each inserted one's place among the bulk's members
        return Groups(self.eligible, SortedSubset(self.base, keys), starts,
                      _spliced(bulk_members, ends, groups.starts, groups.members, out))

    def _keys(self, unique: np.ndarray, rank: np.ndarray) -> tuple[SortedShas | SortedSubset, np.ndarray]:
        """The keys (``unique``: their codes, ascending) in sha256 order, and each given key's place among them
        (``rank``: its place among the codes): the raw rows' own where every key is one of them (a position each,
        ascending as their sha256s are), else their bytes sorted."""
        if unique[-1] < self.n:
            assert self.base is not None
            return SortedSubset(self.base, unique), rank
        names = list(self.outside)  # by code past the raw rows, as given
        inside = unique < self.n
        outside = keys([names[c - self.n] for c in unique[~inside].tolist()])
        width = max(outside.dtype.itemsize, self.base.array.dtype.itemsize if self.base is not None else 1)
        key_bytes = np.empty(len(unique), dtype=f"S{width}")
        key_bytes[~inside] = outside
        if self.base is not None:
            key_bytes[inside] = self.base.array[unique[inside]]
        order = np.argsort(key_bytes, kind="stable")
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        return SortedShas(key_bytes[order]), place[rank]


def _placed(place: np.ndarray, sizes: np.ndarray, members: np.ndarray, scratch: Path | None, block: int = KEY_BLOCK
            ) -> tuple[np.ndarray, np.ndarray]:
    """(starts, members) of components given one after the other (``sizes``, ``members``: each one's ascending) laid
    out by key (``place``: each one's place among the keys, each key once), as ``GroupsBuilder.build``'s sort of every
    member by (key, position) lays them: each component's members moved as a block, a block of members at a time, into
    mappings of ``scratch``. The sort's order and keys of every member were 16 bytes a member at once (a batch's
    assignment at a million images, where the components it touched held 960,000 images: its high)."""
    starts = mapped_zeros(len(place) + 1, np.int64, scratch)
    in_place = np.zeros(len(place), dtype=np.int64)
    in_place[place] = sizes
    np.cumsum(in_place, out=starts[1:])
    given = np.zeros(len(sizes) + 1, dtype=np.int64)  # each component's first member as given
    np.cumsum(sizes, out=given[1:])
    shift = starts[place] - given[:-1]  # how far each component's members move
    out = mapped_zeros(len(members), members.dtype, scratch)
    for a in range(0, len(members), block):
        at = np.arange(a, min(a + block, len(members)))
        out[at + shift[np.searchsorted(given, at, side="right") - 1]] = members[a:a + block]
    return starts, out


def grouped_by_code(codes: np.ndarray, among: np.ndarray, scratch: Path | None, block: int = KEY_BLOCK
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The positions ``among`` (a bool a position) grouped by their ``codes`` (one a position, those among them
    non-negative): the codes found, ascending; how many positions each; and the positions code by code, ascending
    within one (``GroupsBuilder.add_many``'s bulk). A counting sort, a block of positions at a time: the counts by
    code and the three results mapped from ``scratch`` (``mapped_arrays``). A sort of every position (its int64
    order, the sorted codes, a unique's copies) was about 40 bytes an image of a batch's heap at a million.

    Phases: each code's count, the codes found with their sizes, each code's first slot, then the positions placed."""
    kind = position_dtype(len(codes))
    span = max((int(codes[a:a + block][among[a:a + block]].max(initial=-1)) for a in range(0, len(codes), block)),
               default=-1) + 1
    slot = mapped_zeros(span, kind, scratch)  # each code's count, then its next free place among the positions
    for a in range(0, len(codes), block):
        found, count = np.unique(codes[a:a + block][among[a:a + block]], return_counts=True)
        slot[found] += count.astype(kind)
    distinct = sum(int(np.count_nonzero(slot[a:a + block])) for a in range(0, span, block))
    keys, sizes = mapped_zeros(distinct, codes.dtype, scratch), mapped_zeros(distinct, np.int64, scratch)
    done = total = 0
    for a in range(0, span, block):
        part = slot[a:a + block]
        hit = np.flatnonzero(part)
        keys[done:done + len(hit)], sizes[done:done + len(hit)] = hit + a, part[hit]
        done += len(hit)
        count = part.copy()
        np.cumsum(count, out=part)
        part += total - count  # the places before this code's: every count of a lower code
        total += int(count.sum())
    members = mapped_zeros(total, kind, scratch)
    for a in range(0, len(codes), block):
        at = (np.flatnonzero(among[a:a + block]) + a).astype(kind)
        order = np.argsort(codes[at], kind="stable")  # a code's positions stay ascending
        at, code = at[order], codes[at[order]]
        found, first, count = np.unique(code, return_index=True, return_counts=True)
        members[slot[code] + (np.arange(len(code)) - np.repeat(first, count))] = at
        slot[found] += count.astype(kind)
    return keys, sizes, members


def _ascending(values: np.ndarray) -> bool:
    """Strictly ascending (so distinct)."""
    return bool((values[1:] > values[:-1]).all())


def _each_ascending(members: np.ndarray, sizes: np.ndarray, block: int = KEY_BLOCK) -> bool:
    """Whether each component's members (one after the other, ``sizes`` of them) are strictly ascending: checked the
    members of a block of components at a time (a step down only where a component starts; no start held for every
    component)."""
    done = 0
    for a in range(0, len(sizes), block):
        count = np.asarray(sizes[a:a + block], dtype=np.int64)
        starts = np.cumsum(count) - count  # each component's first member, within the block's
        part = members[done:done + int(starts[-1] + count[-1])]
        down = np.flatnonzero(part[1:] <= part[:-1]) + 1  # where a member is not above the one before it
        found = np.minimum(np.searchsorted(starts, down), len(starts) - 1)  # ``starts`` ascending: a bisection each
        if len(down) and not (starts[found] == down).all():
            return False
        done += len(part)
    return True


def _spliced(values: np.ndarray, ends: np.ndarray, starts: np.ndarray, pieces: np.ndarray, out: np.ndarray
             ) -> np.ndarray:
    """``values`` with piece ``k`` (``pieces[starts[k]:starts[k + 1]]``) placed after the first ``ends[k]`` of them
    (ascending), written into ``out`` (as long as both) a run of ``values`` at a time: no copy of ``values`` made."""
    done = taken = 0
    for k, end in enumerate(ends.tolist()):
        out[done:done + end - taken] = values[taken:end]
        done, taken = done + end - taken, end
        piece = pieces[starts[k]:starts[k + 1]]
        out[done:done + len(piece)] = piece
        done += len(piece)
    out[done:] = values[taken:]
    return out
