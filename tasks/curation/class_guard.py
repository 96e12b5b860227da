"""The class guard: one curation never drops more than ``curation.max_class_drop_share`` of any class.

Whatever the thresholds and whatever the data, one curation drops at most
``floor(max_class_drop_share x images of the class in the raw version)`` images of a class as
``near_duplicate`` plus bad images (``too_small``, ``too_dark``, ``too_bright``, ``blurry``).
The floor is the rounding: a class of fewer than ``1 / share`` images (50 at the default 0.02)
loses none of them this way. Beyond its budget a class abstains instead of dropping:

* bad images first (``guard_outliers``, right after ``tasks.curation.outliers.screen``): when a
  class has more bad images than its budget, all of them are kept (grouped and split like any
  image) and listed as possible outliers. A rule that fires mostly on one class measures how
  that class looks, not a defect, and dropping it would bias the labels downstream; a rule that
  fires on more than ``curation.outliers.max_share`` of ALL images still stops the curation
  (in ``screen``, before this guard): that rule does not fit the data at all.
* then duplicates (``over_budget``, after deduplication): a class whose near-duplicate drops
  plus the bad images it still drops exceed its budget abstains for duplicates; the plan
  deduplicates again keeping its near-copies and lists them as possible copies.

Outside the budget: constant images (``outliers.is_constant``: one colour, no information in any
amount), ``exact_duplicate`` (identical decoded pixels: the kept image carries every
bit of it, nothing is lost), ``undecodable``/``fastdup_invalid`` (no image to keep), and the
quarantines ``label_conflict`` and ``split_bridge`` (they protect labels and split stability and
are decided as before; a bridge is named after this guard, even when it is named a duplicate:
``tasks.curation.assignments.bridge_rows``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection
from typing import Any

from tasks.curation.outliers import is_constant
from tasks.curation.sha_list import SortedSubset
from tasks.curation.tables import RawRows

BAD_IMAGE_REASONS = ("too_small", "too_dark", "too_bright", "blurry", "flat")


def budget(images: int, share: float) -> int:
    """Drops allowed in a class of ``images``: floor(share x images) (a tiny epsilon keeps 0.02 x 50 at 1)."""
    return int(math.floor(share * images + 1e-9))


def guard_outliers(by_sha: RawRows, eligible: SortedSubset, dropped: list[dict[str, Any]],
                   outliers: list[tuple[str, str, str, Any]], share: float
                   ) -> tuple[SortedSubset, list[dict[str, Any]], list[tuple[str, str, str, Any]], list[dict[str, Any]]]:
    """(eligible, dropped, outliers, decisions) with the bad images of classes over budget kept and listed.

    A decision is {"rule": "bad_images", "label", "why", "kept": [{sha256, reason, detail}]}.
    """
    sizes = by_sha.sizes()
    per_class: dict[str, list[tuple[str, str, str, Any]]] = {}
    for o in outliers:
        if is_constant(o[3]):
            continue
        per_class.setdefault(by_sha.label(o[0]), []).append(o)
    keep: set[str] = set()
    decisions = []
    for label, flagged in sorted(per_class.items()):
        allowed = budget(sizes[label], share)
        if len(flagged) <= allowed:
            continue
        keep.update(o[0] for o in flagged)
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(Counter(o[1] for o in flagged).items()))
        decisions.append({
            "rule": "bad_images", "label": label,
            "why": f"bad-image rules flag {len(flagged)} of {sizes[label]} images of this class ({reasons}), more "
                   f"than max_class_drop_share {share:g} allows ({allowed}): kept, listed as possible outliers",
            "kept": [{"sha256": o[0], "reason": o[1], "detail": o[2]} for o in flagged]})
    if not keep:
        return eligible, dropped, outliers, []
    return (eligible.union(keep), [d for d in dropped if d["sha256"] not in keep],
            [o for o in outliers if o[0] not in keep], decisions)


def over_budget(by_sha: RawRows, dropped: list[dict[str, Any]], share: float,
                exempt: Collection[str] = ()) -> dict[str, str]:
    """label -> why, for each class whose near-duplicate plus bad-image drops (but ``exempt``) exceed its budget."""
    sizes = by_sha.sizes()
    near = Counter(d["label"] for d in dropped if d["reason"] == "near_duplicate")
    bad = Counter(d["label"] for d in dropped if d["reason"] in BAD_IMAGE_REASONS and d["sha256"] not in exempt)
    out = {}
    for label in sorted(near):
        allowed = budget(sizes[label], share)
        if near[label] + bad[label] > allowed:
            out[label] = (f"{near[label]} near-duplicate and {bad[label]} bad-image drops of {sizes[label]} images of "
                          f"this class exceed max_class_drop_share {share:g} ({allowed} images)")
    return out
