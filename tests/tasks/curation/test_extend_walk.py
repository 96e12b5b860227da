"""A component's walk extended with the members it gained decides as the whole walk does (issue 25).

Many seeded random components: members recorded at earlier raw versions, new members assigned now (last in the walk's
order), labels, shared pixels, copy scores straddling the threshold (some with images of another component), classes
that abstain. The previous walk over the recorded members, extended with the new ones
(``dedupe.extend_component``), must drop exactly what the whole walk drops and list the new members' possible copies
as it does; where a new member clashes with a member of another label, the extension declines (the whole walk
quarantines it, and an earlier member with it when that is the other one: the component is walked whole).
"""

from __future__ import annotations

import hashlib
import random

import numpy as np

from tasks.curation.copy_pairs import CopyScores
from tasks.curation.dedupe import GrownComponent, dedupe_component, extend_component
from tasks.curation.groups import GroupsBuilder
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.sha_list import SortedShas

THRESHOLD = 0.9
NOW = 5  # the raw version the new members are assigned at


def _sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _case(seed: int) -> dict:
    """One random component ``c`` (recorded and new members) beside another component ``o``."""
    rng = random.Random(seed)
    names = [_sha(f"{seed}-{i}") for i in range(rng.randint(2, 14))]
    new = sorted(rng.sample(names, rng.randint(1, min(5, len(names) - 1))))
    others = [_sha(f"{seed}-other-{i}") for i in range(3)]
    every = sorted(names + others)
    mixed = rng.random() < 0.4  # a component of two labels, else one
    label = {s: (rng.choice("12") if mixed else "1") for s in every}
    pool = [f"p{k}" for k in range(max(2, len(names) // 2))]
    pixels = {s: (rng.choice(pool) if rng.random() < 0.3 else s) for s in every}
    pairs = {CopyScores.key(a, b): round(rng.uniform(0.8, 1.0), 4)
             for a in every for b in every if a < b and rng.random() < 0.35}
    first = {s: (NOW if s in new else rng.randint(0, NOW - 1)) for s in every}
    abstain = {"2"} if rng.random() < 0.3 else set()
    merged = rng.random() < 0.4  # the recorded members in two components merged now, else one
    part = {s: (-1 if s in new else (rng.randrange(2) if merged else 0)) for s in names}
    return {"names": names, "new": new, "others": others, "every": every, "label": label, "pixels": pixels,
            "pairs": pairs, "first": first, "abstain": abstain, "part": part, "merged": merged}


def _walk(order: list[str], case: dict) -> tuple[set[tuple], set[tuple]]:
    scores = CopyScores(lambda sha: b"", stored=case["pairs"])
    possible: list[tuple[str, str, float]] = []
    _, removed = dedupe_component(order, case["pixels"], case["label"], scores, THRESHOLD, case["abstain"], possible)
    return set(removed), set(possible)


def _extended(case: dict, dropped_before: set[str]) -> tuple[set[tuple] | None, set[tuple]]:
    every = SortedShas.of(case["every"])
    at = {s: i for i, s in enumerate(every)}
    builder = GroupsBuilder(every)
    builder.add(case["names"][0], [at[s] for s in case["names"]])
    builder.add(case["others"][0], [at[s] for s in case["others"]])
    groups = builder.build()
    pixels = PixelKeys.of(at, [case["pixels"][s] for s in every])
    raw_at = np.arange(len(every))
    new = np.array(sorted(at[s] for s in case["new"]), dtype=np.int64)
    parts = np.array([case["part"][every[p]] for p in groups.positions(case["names"][0]).tolist()]) \
        if case["merged"] else None
    before = GrownComponent(case["names"][0], groups, new, raw_at, pixels, case["label"].__getitem__,
                            case["first"].__getitem__, dropped_before, parts)
    possible: list[tuple[str, str, float]] = []
    removed = extend_component(before, CopyScores(lambda sha: b"", stored=case["pairs"]), THRESHOLD,
                               case["abstain"], possible)
    return (None if removed is None else set(removed)), set(possible)


def _parts_copied(case: dict) -> bool:
    """Whether two recorded members of different parts are copies (same pixels, or a score at the threshold)."""
    old = [s for s in case["names"] if case["part"][s] >= 0]
    return any(case["part"][a] != case["part"][b] and
               (case["pixels"][a] == case["pixels"][b] or case["pairs"].get(CopyScores.key(a, b), 0.0) >= THRESHOLD)
               for a in old for b in old if a < b)


def test_an_extended_walk_decides_as_the_whole_walk() -> None:
    declined = extended = merged = dropped_new = 0
    for seed in range(600):
        case = _case(seed)
        order = sorted(case["names"], key=lambda s: (case["first"][s], s))
        before: set[tuple] = set()
        for part in (0, 1):  # each recorded component's own last walk
            before |= _walk([s for s in order if case["part"][s] == part], case)[0]
        whole, whole_possible = _walk(order, case)
        removed, possible = _extended(case, {r[0] for r in before})
        clash = bool({r[0] for r in whole if r[1] == "label_conflict"} & set(case["new"]))
        if removed is None:
            declined += 1
            assert clash or _parts_copied(case), seed
            continue
        assert not clash and not _parts_copied(case), seed
        extended += 1
        merged += case["merged"] and len(set(case["part"].values()) - {-1}) == 2
        assert whole == before | removed, seed
        assert possible == {p for p in whole_possible if p[0] in case["new"]}, seed
        dropped_new += len(removed)
    assert extended > 250 and merged > 30 and declined > 50 and dropped_new > 50  # the cases reach every branch


def test_a_partner_in_another_component_is_no_copy() -> None:
    case = _case(7)
    case["pairs"] = {CopyScores.key(case["new"][0], case["others"][0]): 1.0}
    case["pixels"] = {s: s for s in case["every"]}
    removed, possible = _extended(case, set())
    assert removed == set() and possible == set()
