"""The previous curation's walk, reused for the components a batch does not touch (issue 25).

What ``tasks.curation.dedupe.dedupe_component`` decides for a component depends only on its
members (their labels, pixels and first-assigned order), the copy scores among them, the threshold
and whether each member's class abstains. A batch scores only pairs with a new image. So a component
that

* has no member new to the record and none newly eligible (a bad image that is no longer one),
* lost no member (an image gone from the raw version or now set aside),
* kept its key (no merge), and
* whose classes abstain now exactly when they did then

decides as it did in the previous curation: its drops are that curation's report rows, every other
member is kept. Walking it again would cost the batch a share of the table; it is walked only when
one of the above changed (and again, as every component of its class, when the class guard makes its
class abstain during this curation).

The previous curation is used only when this plan builds on it: the curated table's current version
was written under the same curation config, from the assignment record read now, names the classes
that abstained (``near_duplicate_abstained``), has every drop row stored in ``curation_report``, and
the nearest-score summary (which says which images were eligible then) was written by that same run.
Otherwise every component is walked, as in a first curation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tasks.curation.assignments import Assignment, Record
from tasks.curation.groups import Groups
from tasks.curation.nearest import NearestMap
from tasks.curation.report import DROP_FIELDS, stored_report_rows
from tasks.curation.sha_list import SortedShas
from tasks.data import lake
from tasks.settings import Settings

WALK_REASONS = ("exact_duplicate", "near_duplicate", "label_conflict")  # what a component's walk drops


@dataclass(frozen=True)
class PriorWalk:
    """The previous curation's walk: its version, the classes that abstained, its drop rows by component."""

    curated_version: int
    abstain: frozenset[str]
    drops: dict[str, list[dict[str, Any]]]

    def to_walk(self, touched: set[str], abstain: Collection[str], of_classes: Callable[[set[str]], set[str]]
                ) -> list[str]:
        """The component keys to walk: those touched, and those with a member of a class whose abstention changed
        (``of_classes``: the keys of the components with a member of those classes)."""
        changed = set(abstain) ^ self.abstain
        return sorted(touched | of_classes(changed)) if changed else sorted(touched)

    def outcome(self, key: str, merged: Collection[str] = ()) -> list[dict[str, Any]]:
        """The drop rows of an untouched component, as the previous curation decided (its other members are kept);
        with ``merged``, those of the components merged into it too, named after it."""
        return [dict(r) for r in self.drops.get(key, ())] + \
            [{**r, "component": key} for other in merged for r in self.drops.get(other, ())]


def prior_walk(settings: Settings, record: dict[str, Assignment], record_version: int | None,
               nearest: NearestMap) -> PriorWalk | None:
    """The previous curation's walk when this plan builds on it (the module doc), else None."""
    if record_version is None or nearest.written_by is None:  # no record yet, or the summary was rebuilt
        return None
    uri = settings.curated_table
    version = lake.current_version(uri)
    head = lake.commit_at(uri, version) if version is not None else None
    if head is None:
        return None
    meta = head.metadata
    config_hash = settings.section_hash("curation")
    same_run = {k: meta.get(k) for k in ("run_id", "raw_version")} == nearest.written_by
    if not same_run or meta.get("config_hash") != config_hash or meta.get("components_version") != str(record_version) \
            or "near_duplicate_abstained" not in meta or "raw_version" not in meta:
        return None
    rows = stored_report_rows(settings, int(meta["raw_version"]), config_hash)
    if rows is None or len(rows) != int(meta.get("dropped", -1)):  # a crash before the report rows: walk all
        return None
    drops: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        assigned = record.get(r["sha256"])  # a split bridge is recorded nowhere: not a walk's drop
        if r["reason"] in WALK_REASONS and assigned is not None and assigned.component == r["component"]:
            drops.setdefault(r["component"], []).append({k: r[k] for k in DROP_FIELDS})
    return PriorWalk(version, frozenset(json.loads(meta["near_duplicate_abstained"])), drops)


class Grown(NamedTuple):
    """A component that only grew since its last walk: its members new to the record (ascending positions into the
    eligible images), the recorded components merged into it now, and, when there are any, each member's recorded
    component as a code (``Record.component_codes``: -1 for a new member; the merge's parts)."""

    new: np.ndarray
    merged: tuple[str, ...] = ()
    parts: np.ndarray | None = None


@dataclass(frozen=True)
class Touched:
    """The components a batch touched: ``whole`` are walked again from their first member; ``grown`` only gained
    images new to the record or merged recorded components, whose earlier members come first in the walk's order,
    so the previous walks are extended (``dedupe.extend_component``)."""

    whole: set[str]
    grown: dict[str, Grown]


def touched_components(groups: Groups, record: Record, raw_at: np.ndarray, renamed: dict[str, str],
                       nearest: NearestMap, raw_version: int | None = None) -> Touched:
    """The components that gained, lost or merged members since the previous curation (``raw_at``: the eligible
    images' raw positions), found by code for the members of ``TOUCH_BLOCK`` components at a time (a lookup of every
    member's string and assignment was about 5 us an image; the codes of every member at once, about 35 bytes an
    image of the table).

    A member recorded in a component not merged into its own, a recorded member newly eligible or a member gone touch
    the component ``whole``. A component whose only changes are members not recorded before and recorded components
    merged into it (``renamed``: merged key -> key) has ``grown`` when it has a recorded member and every recorded
    image was first assigned before ``raw_version`` (the new members, assigned now, come last in the walk's order);
    without ``raw_version`` every touched component is walked whole.
    """
    keys = groups.ordered.members
    key_codes = record.key_codes(keys)
    whole: set[str] = set()
    for sha in nearest.gone or ():
        if sha in record:
            component = record[sha].component
            whole.add(renamed.get(component, component))
    parts: dict[str, list[str]] = {}
    for merged, key in renamed.items():
        parts.setdefault(key, []).append(merged)
    block = _Block(record, _Merges.of(record, renamed), parts, _before(record, raw_version),
                   [i for i in (record.rows.at.get(s) for s in nearest.added or ()) if i is not None])
    grown: dict[str, Grown] = {}
    for first in range(0, len(keys), TOUCH_BLOCK):
        last = min(len(keys), first + TOUCH_BLOCK)
        lo, hi = int(groups.starts[first]), int(groups.starts[last])
        block.touched(keys, first, groups.starts[first:last + 1] - lo, key_codes[first:last], groups.members[lo:hi],
                      raw_at, whole, grown)
    whole |= {key for key in parts if key not in grown}
    return Touched(whole, grown)


TOUCH_BLOCK = 1 << 16  # components whose members ``touched_components`` codes at a time


@dataclass(frozen=True)
class _Block:
    """What ``touched_components`` reads for every block of components."""

    record: Record
    merges: _Merges
    parts: dict[str, list[str]]
    extendable: bool  # every recorded image was first assigned before this raw version
    added: list[int]  # the raw positions of recorded images eligible again

    def touched(self, keys: Any, first: int, starts: np.ndarray, key_codes: np.ndarray, members: np.ndarray,
                raw_at: np.ndarray, whole: set[str], grown: dict[str, Grown]) -> None:
        """Add the components ``first``, ``first + 1``, ... (their members ``members[starts[k]:starts[k + 1]]``) that
        are touched to ``whole`` or ``grown``.

        Phases: each component's marks, ``MEMBER_BLOCK`` members at a time (a component of most of the table, as a
        million's batch touches, is no array of every member's codes: about 40 bytes a member), then the touched
        ones sorted out, in order."""
        moved, changed, recorded = self._marks(starts, key_codes, members, raw_at)
        whole |= {keys[first + k] for k in np.flatnonzero(moved).tolist()}
        for k in np.flatnonzero(changed).tolist():
            key = keys[first + k]
            if key in whole:
                continue
            if not recorded[k] or not self.extendable:  # a component of new images only, or a backfill: walked
                whole.add(key)
                continue
            merged = tuple(sorted(self.parts.get(key, ())))
            grown[key] = self._grown(members[int(starts[k]):int(starts[k + 1])], raw_at, merged)

    def _marks(self, starts: np.ndarray, key_codes: np.ndarray, members: np.ndarray, raw_at: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each component has a member that moved: recorded elsewhere and not merged now, or eligible again; has a
        member new or recorded elsewhere; how many of its members are recorded), a block of members at a time."""
        count = len(starts) - 1
        moved, changed, recorded = np.zeros(count, bool), np.zeros(count, bool), np.zeros(count, np.int64)
        for a in range(0, len(members), MEMBER_BLOCK):
            b = min(len(members), a + MEMBER_BLOCK)
            lo, hi = int(np.searchsorted(starts, a, "right")) - 1, int(np.searchsorted(starts, b - 1, "right"))
            of_member = np.repeat(np.arange(lo, hi, dtype=np.int32), np.diff(np.clip(starts[lo:hi + 1], a, b)))
            at = raw_at[members[a:b]]
            member = self.record.component_codes(at)
            new = member < 0
            key_code = key_codes.astype(member.dtype)[of_member]
            elsewhere = ~new & (member != key_code)  # recorded in another component: merged into this one, or moved
            gone = elsewhere & ~self.merges.into(member, key_code)
            if self.added:
                gone |= ~new & np.isin(at, self.added)  # recorded, and eligible again
            moved[of_member[gone]] = True
            changed[of_member[new | elsewhere]] = True
            recorded += np.bincount(of_member[~new], minlength=count)
        return moved, changed, recorded

    def _grown(self, members: np.ndarray, raw_at: np.ndarray, merged: tuple[str, ...]) -> Grown:
        """A component that only grew: its new members and, with merged parts, each member's recorded code (read a
        block of members at a time)."""
        new, parts = [], []
        for a in range(0, len(members), MEMBER_BLOCK):
            block = members[a:a + MEMBER_BLOCK]
            member = self.record.component_codes(raw_at[block])
            new.append(block[member < 0])
            if merged:
                parts.append(member)
        return Grown(np.concatenate(new) if new else members[:0].copy(), merged,
                     np.concatenate(parts) if merged else None)


MEMBER_BLOCK = 1 << 16  # members ``touched_components`` codes at a time


@dataclass(frozen=True)
class _Merges:
    """The recorded components merged now, as codes: each one's (``merged``, ascending) and its final key's."""

    merged: np.ndarray
    target: np.ndarray

    @classmethod
    def of(cls, record: Record, renamed: dict[str, str]) -> _Merges:
        if not renamed:
            return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        merged = sorted(renamed)
        into = record.key_codes(SortedShas.of(merged))  # as ``component_codes`` codes them
        finals = sorted(set(renamed.values()))
        final = dict(zip(finals, record.key_codes(SortedShas.of(finals)).tolist()))
        order = np.argsort(into)
        return cls(np.asarray(into)[order],
                   np.array([final[renamed[merged[i]]] for i in order.tolist()], dtype=np.int64))

    def into(self, member: np.ndarray, key_code: np.ndarray) -> np.ndarray:
        """Which members are recorded in a component merged now into the one they are in (``member``: each one's
        recorded component code, ``key_code``: its component's key's)."""
        if not len(self.merged):
            return np.zeros(len(member), dtype=bool)
        i = np.minimum(np.searchsorted(self.merged, member), len(self.merged) - 1)
        return (self.merged[i] == member) & (self.target[i] == key_code)


def _before(record: Record, raw_version: int | None) -> bool:
    """Whether every recorded image of the raw version was first assigned before ``raw_version``."""
    if raw_version is None:
        return False
    return int(np.max(record.first, where=record.split != 0, initial=-1)) < raw_version  # no gathered copy
