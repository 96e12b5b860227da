"""Deduplication inside one component: which members are copies of which kept image, never through a chain."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import numpy as np

from tasks.curation.by_position import PlaceAmong, SortedRank
from tasks.curation.copy_pairs import CopyScores
from tasks.curation.groups import Groups
from tasks.curation.pixel_keys import HEAD_BLOCK, PixelKeys
from tasks.curation.runs import runs_of
from tasks.curation.tables import RawRows

# ``pixels`` below: each image's pixel key (``Features.pixel_keys``: its decoded pixels' digest, or its sha256).


def group_by_pixels(shas: list[str], pixels: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in shas:
        out.setdefault(pixels[s], []).append(s)
    return out


def _copies_of(sha: str, among: Mapping[str, Any] | set[str], by_digest: dict[str, list[str]], pixels: Mapping[str, str],
               scores: CopyScores, threshold: float) -> list[tuple[str, str]]:
    """Images of ``among`` known now to be copies of ``sha``: (image, how), same pixels first, then scored pairs.

    ``by_digest`` groups ``among`` by decoded-pixel digest; a scored pair is a copy at ``threshold`` or above.
    """
    digest = pixels[sha]
    same = [(o, "same pixels") for o in by_digest.get(digest, ()) if o != sha]
    return same + [(o, f"copy score {v:.4f}") for o, v in scores.partners(sha).items()
                   if v >= threshold and o in among and pixels[o] != digest]


def _strongest(sha: str, copies: list[tuple[str, str]], scores: CopyScores, rank: Mapping[str, Any]
               ) -> tuple[str, str]:
    """The copy ``sha`` is most surely a copy of: same pixels, then the highest score, then the first in ``rank``
    (each copy's place in the component's order: a number, or ``(first raw version, sha256)``)."""
    return min(copies, key=lambda c: (c[1] != "same pixels", -(scores.get(sha, c[0]) or 0.0), rank[c[0]]))


class RecordedMembers:
    """The recorded members of one component, indexed once for every new image that joins it.

    ``rank`` is a member's place in the component's order (ascending sha256s, as ``known``: ascending positions into
    the eligible images that ``eligible`` looks up; ties of the strongest copy go to the first); ``by_digest`` groups by
    decoded pixels the members that share their pixels with one of ``newcomers`` (positions too; ``raw_at``: the
    eligible images' raw positions, where the pixel keys are): a new image looks up its own pixels only. Built once per
    component from positions (no string a member): a new image then costs its own partners, never the component's size.
    """

    def __init__(self, eligible: SortedRank, known: np.ndarray, raw_at: np.ndarray, pixels: PixelKeys,
                 newcomers: np.ndarray) -> None:
        self.rank = PlaceAmong(eligible, known)
        hits = _sharing_heads(pixels, known, raw_at, raw_at[newcomers])
        self.by_digest = group_by_pixels([eligible.members[p] for p in known[hits].tolist()], pixels)


def _sharing_heads(pixels: PixelKeys, known: np.ndarray, raw_at: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``pixels.sharing_heads(raw_at[known], wanted)``, ``known`` a block at a time: no array of every known member's
    raw position (a component of most of the table: 4 bytes a member)."""
    found = [pixels.sharing_heads(raw_at[known[a:a + HEAD_BLOCK]], wanted) + a for a in range(0, len(known), HEAD_BLOCK)]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def recorded_original(sha: str, recorded: RecordedMembers, pixels: Mapping[str, str], by_sha: RawRows,
                      scores: CopyScores, threshold: float) -> tuple[str, str, str] | None:
    """(reason, recorded image, how) when a new image is a copy of a recorded image with its label, else None."""
    label = by_sha.label(sha)
    copies = [(o, how) for o, how in _copies_of(sha, recorded.rank, recorded.by_digest, pixels, scores, threshold)
              if by_sha.label(o) == label]
    if not copies:
        return None
    original, how = _strongest(sha, copies, scores, recorded.rank)
    if how == "same pixels":
        return "exact_duplicate", original, "same decoded pixels"
    return "near_duplicate", original, how


def dedupe_component(order: list[str], pixels: Mapping[str, str], labels: dict[str, str], scores: CopyScores,
                     threshold: float, abstain: Collection[str] = (),
                     possible: list[tuple[str, str, float]] | None = None,
                     ) -> tuple[list[str], list[tuple[str, str, str | None, str]]]:
    """Which members of one component are kept: drop precisely, never through a chain.

    ``order`` is the component's members, first assigned first. Two members are copies when
    their decoded pixels are identical or their copy score (``tasks.curation.copy_score``) is at least
    ``threshold`` (``curation.copy_similarity``, calibrated on planted copies against distinct
    images). Walking in order, a member is dropped only when it is a copy of a member already
    KEPT with its label (not of something that was itself dropped, nor of a chain A~B~C), as
    ``exact_duplicate`` or ``near_duplicate`` of that image, with the score in the detail;
    otherwise it is kept. Only scored pairs count: each image's candidate pairs (its
    ``copy_candidates`` nearest neighbours, ``tasks.curation.neighbours``) and the stored scores, so
    the scoring per image is bounded whatever the component's size. A member that is a known copy of a member with another label is quarantined
    (``label_conflict``) with that member: nobody can tell which label is right. Members only
    linked through the component (grouped generously for split assignment) are all kept.
    In a class of ``abstain`` (``tasks.curation.separation``, ``tasks.curation.class_guard``) a
    scored copy is kept too and appended to ``possible`` as (image, kept image, score); same
    pixels are still dropped.

    Returns (kept shas, [(sha, reason, kept sha or None, detail)]).
    """
    if len(order) == 1:
        return list(order), []
    index = {s: i for i, s in enumerate(order)}
    by_digest = group_by_pixels(order, pixels)
    label = [labels[s] for s in order]

    def known_copies(i: int) -> list[tuple[int, str]]:
        """Members that are copies of member i by what is known now (same pixels, or a scored pair)."""
        return [(index[o], how) for o, how in _copies_of(order[i], index, by_digest, pixels, scores, threshold)]

    copies = [known_copies(i) for i in range(len(order))]  # the scores do not change during the walk
    clash: dict[int, tuple[int, str]] = {}  # member -> a known copy of it with another label
    for i in range(len(order)):
        other = next(((k, how) for k, how in copies[i] if label[k] != label[i]), None)
        if other is not None:
            clash[i] = other
    kept: list[int] = []
    kept_set: set[int] = set()
    removed: list[tuple[str, str, str | None, str]] = []
    for i, sha in enumerate(order):
        if i in clash:
            k, how = clash[i]
            removed.append((sha, "label_conflict", None,
                            f"copy ({how}) of {order[k][:12]} labelled {label[k]!r}, this one {label[i]!r}"))
            continue
        originals = [(order[k], how) for k, how in copies[i] if k in kept_set and label[k] == label[i]]
        if not originals:
            kept.append(i)
            kept_set.add(i)
            continue
        original, how = _strongest(sha, originals, scores, index)
        if how != "same pixels" and label[i] in abstain:
            if possible is not None:
                possible.append((sha, original, scores.get(sha, original) or 0.0))
            kept.append(i)
            kept_set.add(i)
        elif how == "same pixels":
            removed.append((sha, "exact_duplicate", original, "same decoded pixels as the kept image"))
        else:
            removed.append((sha, "near_duplicate", original, f"{how} to the kept image (drop at >= {threshold})"))
    return [order[i] for i in kept], removed



class GrownComponent:
    """One component as its last walks left it, for the walk of the members it gained (``extend_component``): its
    members indexed once (``RecordedMembers``: a bisection of its positions, the members sharing pixels with a new one
    grouped by their pixels; ``raw_at``: the eligible images' raw positions), what was kept then everything not
    ``dropped``. ``parts``: when recorded components were merged into it now, each member's recorded component (a
    code, -1 for a new member, as ``groups.positions(key)`` orders them)."""

    def __init__(self, key: str, groups: Groups, new: np.ndarray, raw_at: np.ndarray, pixels: PixelKeys,
                 label_of: Callable[[str], str], first_version: Callable[[str], int], dropped: Collection[str],
                 parts: np.ndarray | None = None) -> None:
        self.key, self.eligible, self.pixels, self.parts = key, groups.eligible, pixels, parts
        self.label_of, self.first_version = label_of, first_version
        self.dropped = set(dropped)
        self.new = [groups.eligible[p] for p in new.tolist()]
        self.members = groups.positions(key)
        self.at = raw_at[self.members]
        self.recorded = RecordedMembers(groups.rank(), self.members, raw_at, pixels, new)

    def _sha(self, i: int) -> str:
        return self.eligible[int(self.members[i])]

    def _token(self, i: int) -> bytes | str:
        return self.pixels.token_at(int(self.at[i]), self._sha(i))

    def kept(self, sha: str) -> bool:
        """Whether an earlier member was kept by the last walk."""
        return sha not in self.dropped

    def copies_of(self, sha: str, scores: CopyScores, threshold: float) -> list[tuple[str, str]]:
        """``_copies_of`` among the whole component's members: same pixels first, then scored pairs."""
        return _copies_of(sha, self.recorded.rank, self.recorded.by_digest, self.pixels, scores, threshold)

    def _checked(self) -> np.ndarray:
        """The earlier members whose partners say whether the merged parts are apart: all but the largest part's."""
        if self.parts is None:
            return np.zeros(0, dtype=np.int64)
        codes, counts = np.unique(self.parts[self.parts >= 0], return_counts=True)
        return np.flatnonzero((self.parts >= 0) & (self.parts != codes[np.argmax(counts)]))

    def to_read(self) -> list[str]:
        """The images whose stored pairs the extension reads: the new members, and the merged parts' but the
        largest one's."""
        return self.new + [self._sha(i) for i in self._checked().tolist()]

    def apart(self, scores: CopyScores, threshold: float) -> bool:
        """Whether no earlier member is a known copy of an earlier member of another part (each part's last walk saw
        only its own members): same pixels, or a scored pair at ``threshold`` or above (found from the partners of
        every part but the largest)."""
        if self.parts is None:
            return True
        if self._pixels_across():
            return False
        for i in self._checked().tolist():
            for o, v in scores.partners(self._sha(i)).items():
                j = self.recorded.rank.get(o) if v >= threshold else None
                if j is not None and self.parts[j] >= 0 and self.parts[j] != self.parts[i]:
                    return False
        return True

    def _pixels_across(self) -> bool:
        """Whether two earlier members of different parts share their pixels (by their keys' heads, then whole)."""
        assert self.parts is not None
        old = np.flatnonzero(self.parts >= 0)
        runs = runs_of(self.pixels.heads(self.at[old]), self.parts[old])
        mixed = ~runs.same
        for s, e in zip(runs.start[mixed].tolist(), runs.end[mixed].tolist()):
            seen: dict[bytes | str, int] = {}
            for k in runs.order[s:e].tolist():
                if seen.setdefault(self._token(int(old[k])), int(self.parts[old[k]])) != self.parts[old[k]]:
                    return True
        return False


class _Order(Mapping[str, tuple[int, str]]):
    """A member's place in its component's walk, ``(first raw version, sha256)``, read for the few compared."""

    def __init__(self, first_version: Callable[[str], int]) -> None:
        self.first_version = first_version

    def __getitem__(self, sha: str) -> tuple[int, str]:
        return self.first_version(sha), sha

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def extend_component(before: GrownComponent, scores: CopyScores, threshold: float,
                     abstain: Collection[str] = (), possible: list[tuple[str, str, float]] | None = None,
                     ) -> list[tuple[str, str, str | None, str]] | None:
    """``dedupe_component``'s drops among ``before.new`` (ascending), the members a component gained after its last
    walk (or walks, of the components merged into it).

    They come last in the walk's order (first assigned now), so every earlier member decides as it did then
    (``before``: what it kept) unless one of them is a known copy of a new member with another label (a clash
    that quarantines both) or, after a merge, of an earlier member of another part. Then None: the component must be
    walked whole. Otherwise each new member is walked as ``dedupe_component`` walks it, against the members kept
    before it, reading only its own partners and the members sharing its pixels (never the component's size in
    strings or pairs; a merge's parts but the largest are read for their partners). ``possible`` gets the new
    members' possible copies only (the earlier members' were listed by the walk that decided them).
    """
    if not before.apart(scores, threshold):
        return None
    new = before.new
    order = _Order(before.first_version)
    kept: set[str] = set()
    removed: list[tuple[str, str, str | None, str]] = []
    found: list[tuple[str, str, float]] = []
    fresh = set(new)
    for sha in new:
        copies = before.copies_of(sha, scores, threshold)
        label = before.label_of(sha)
        if any(before.label_of(o) != label for o, _ in copies):
            return None
        originals = [(o, how) for o, how in copies if (o in kept if o in fresh else before.kept(o))]
        if not originals:
            kept.add(sha)
            continue
        original, how = _strongest(sha, originals, scores, order)
        if how != "same pixels" and label in abstain:
            found.append((sha, original, scores.get(sha, original) or 0.0))
            kept.add(sha)
        elif how == "same pixels":
            removed.append((sha, "exact_duplicate", original, "same decoded pixels as the kept image"))
        else:
            removed.append((sha, "near_duplicate", original, f"{how} to the kept image (drop at >= {threshold})"))
    if possible is not None:
        possible.extend(found)
    return removed
