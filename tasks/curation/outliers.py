"""Bad images: which image is too small, constant, too dark, too bright, flat or blurry (``curation.outliers``).

Images without features and bad images are set aside before any grouping: a black frame is
"similar" to every other black frame whatever its label. In order, the first that applies:

* absolute: a side below ``min_training_side`` (the model's input floor); a constant image
  (grey std below ``CONSTANT_STD``: all black, all white, one grey) carries no information
  whatever the data; and each absolute override that is set (``min_mean``, ``max_mean``,
  ``min_blur``), which replaces the relative rule of its statistic;
* relative (``tasks.curation.bulk_limits``): size, brightness, contrast and blur against this raw
  version's own images of the same mode family; a rule that cannot show it separates abstains.

An absolute override that would drop a large share of the data stops the curation instead
(``OutlierRuleError``): the threshold a person set does not fit this data.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.curation.assignments import Assignment
from tasks.curation.bulk_limits import RULES, Classes, Rule, Verdict, judge
from tasks.curation.curation_features import Features
from tasks.curation.feature_facts import FeatureFacts, ImageFeatures
from tasks.curation.positions import flat_positions
from tasks.curation.sha_list import SortedSubset
from tasks.curation.tables import RawRows, drop_row
from tasks.errors import DataError
from tasks.settings import OutlierSettings

log = logging.getLogger(__name__)

CONSTANT_STD = 1.0  # grey levels: below, an image is one colour up to encoding noise
DARK_CONSTANT, BRIGHT_CONSTANT = 85.0, 170.0  # a constant image below / above is too_dark / too_bright, else flat
_OVERRIDE = {"too_dark": "min_mean", "too_bright": "max_mean", "blurry": "min_blur"}
STATISTICS = ("side", "mean", "contrast", "blur")  # what the relative rules read (``side``: the shorter side)


class OutlierRuleError(DataError, ValueError):
    """An absolute bad-image override would drop a large share of the images (``curation.outliers.max_share``)."""


@dataclass(frozen=True)
class Measured:
    """What the rules read of one image: its size (from the raw row) and its statistics."""

    family: str
    width: int
    height: int
    mean: float
    contrast: float
    blur: float


def is_constant(f: ImageFeatures | None) -> bool:
    """One colour up to encoding noise: no information whatever the data (a drop that loses nothing)."""
    return f is not None and f.error is None and f.contrast is not None and f.contrast < CONSTANT_STD


def outlier_reason(m: Measured, limits: OutlierSettings) -> tuple[str, str] | None:
    """(reason, detail) from the absolute rules (the input floor, constant images, overrides set), else None."""
    if min(m.width, m.height) < limits.min_training_side:
        return "too_small", f"{m.width}x{m.height} has a side below min_training_side {limits.min_training_side}"
    if m.contrast < CONSTANT_STD:
        reason = "too_dark" if m.mean < DARK_CONSTANT else "too_bright" if m.mean > BRIGHT_CONSTANT else "flat"
        return reason, f"constant image: mean grey {m.mean:.1f}, std {m.contrast:.2f} < {CONSTANT_STD:g}"
    if limits.min_mean is not None and m.mean < limits.min_mean:
        return "too_dark", f"mean {m.mean:.1f} < min_mean {limits.min_mean:g}"
    if limits.max_mean is not None and m.mean > limits.max_mean:
        return "too_bright", f"mean {m.mean:.1f} > max_mean {limits.max_mean:g}"
    if limits.min_blur is not None and m.blur < limits.min_blur:
        return "blurry", f"blur {m.blur:.4g} < min_blur {limits.min_blur:g}"
    return None


def relative_screen(images: dict[str, Measured], labels: dict[str, str], limits: OutlierSettings
                    ) -> tuple[dict[str, tuple[str, str]], list[dict[str, str]]]:
    """(id -> (reason, detail) of each image a relative rule flags, abstentions) over ``images`` per mode family."""
    ids = sorted(images)
    measured = [images[i] for i in ids]
    values = {stat: np.array([float(min(m.width, m.height)) if stat == "side" else getattr(m, stat) for m in measured],
                             dtype=np.float64) for stat in STATISTICS}
    codes: dict[str, int] = {}
    family = np.array([codes.setdefault(m.family, len(codes)) for m in measured], dtype=np.int32)
    return relative_columns(ids, np.arange(len(ids)), family, list(codes), lambda stat, at: values[stat][at],
                            lambda at: [labels[ids[k]] for k in at.tolist()], limits)


def relative_columns(ids: list[str], rows: np.ndarray, family: np.ndarray, names: list[str],
                     values_at: Callable[[str, np.ndarray], np.ndarray],
                     labels_at: Callable[[np.ndarray], Sequence[str]],
                     limits: OutlierSettings) -> tuple[dict[str, tuple[str, str]], list[dict[str, str]]]:
    """``relative_screen`` over columns: the images ``ids[rows]`` (ascending: a family's images are judged in that
    order), by position in ``ids`` their mode family (a code into ``names``), each statistic's values at positions
    (``values_at``: a family's own, float64; ``STATISTICS``) and their labels (``labels_at``)."""
    flagged: dict[str, tuple[str, str]] = {}
    abstained: list[dict[str, str]] = []
    for code in sorted(range(len(names)), key=names.__getitem__):
        of_family = family[rows] == code
        members = rows if of_family.all() else rows[of_family]  # one family: its positions are the rows themselves
        del of_family
        if not len(members):
            continue
        name = names[code]
        family_labels = labels_at(members)
        for statistic, of_statistic in itertools.groupby(RULES, key=lambda rule: rule.statistic):
            rules = [rule for rule in of_statistic if not _overridden(rule, limits)]
            if not rules:
                continue
            family_values = values_at(statistic, members)  # one statistic's copy at a time
            for rule in rules:
                verdict = judge(rule, family_values, family_labels,
                                sigmas=limits.relative_sigmas, gap=limits.relative_gap,
                                min_images=limits.relative_min_images, max_share=limits.max_share)
                for k in verdict.flagged:
                    flagged.setdefault(ids[members[k]], (rule.reason, _detail(
                        verdict, name, float(family_values[k]), limits.relative_sigmas)))
                abstained.extend({"rule": rule.reason, "label": label, "why": f"{name} images: {why}", "family": name}
                                 for label, why in verdict.abstained)
            del family_values
    return flagged, abstained


def _overridden(rule: Rule, limits: OutlierSettings) -> bool:
    """A person's absolute limit replaces this rule."""
    setting = _OVERRIDE.get(rule.reason)
    return setting is not None and getattr(limits, setting) is not None


def _detail(verdict: Verdict, family: str, value: float, sigmas: float) -> str:
    rule, bulk = verdict.rule, verdict.bulk
    side = "<" if rule.low_is_bad else ">"
    name = {"side": "shorter side", "mean": "mean grey"}.get(rule.statistic, rule.statistic)
    return (f"{name} {value:.4g} {side} limit {bulk.limit:.4g} ({sigmas:g} robust sigmas from the median {bulk.median:.4g} "
            f"of this version's {family} images; flagged beyond the gap at {bulk.cut:.4g})")


@dataclass(frozen=True)
class _Columns:
    """What the rules read of a raw version's images, a column each in the raw rows' order: arrays, no object an
    image (a named tuple, five floats and a ``Measured`` each were about 300 bytes an image at the screen's high).

    Views where they can be: the facts' own statistics when they are in the raw rows' order and have no missing
    number, the raw rows' own sizes (a copy of each, int64 sizes and each image's place were about 70 bytes an image
    of the table beside the screen's rules at a million images); the shorter side only for the positions a rule
    reads (``values_at``: a float64 side of every image was 8 bytes an image of the table)."""

    at: np.ndarray | None  # each image's position among the facts; None: the same positions (the facts share the map)
    failed: np.ndarray  # bool: the image has no features (an error)
    family: np.ndarray  # int8: a code into ``names``
    names: list[str]  # the mode families ("unknown" for an image without one)
    width: np.ndarray  # the raw rows' own (int32)
    height: np.ndarray
    values: dict[str, np.ndarray]  # STATISTICS but the side: float64, a missing number read as 0

    @classmethod
    def of(cls, rows: RawRows, facts: FeatureFacts) -> _Columns:
        at = None if facts.at is rows.at else facts.positions(rows.shas)  # aligned: the same places
        values = {stat: _zero_missing(facts.numbers[stat] if at is None else facts.numbers[stat][at])
                  for stat in ("mean", "contrast", "blur")}
        named = [name or "unknown" for name in facts.families] + ["unknown"]  # the last: a row without one
        names = sorted(set(named))
        remap = np.array([names.index(name) for name in named], dtype=np.int8)
        codes = facts.family if at is None else facts.family[at]
        family = remap[np.where(codes < 0, len(named) - 1, codes)]
        failed = facts.failed()
        return cls(at, failed if at is None else failed[at], family, names, rows.width, rows.height, values)

    def values_at(self, statistic: str, at: np.ndarray) -> np.ndarray:
        """One statistic (``STATISTICS``) of the images at positions ``at``, float64 (a new array)."""
        if statistic == "side":
            return np.minimum(self.width[at], self.height[at]).astype(np.float64)
        return self.values[statistic][at]

    def fact_at(self, k: int) -> int:
        """Image ``k``'s position among the facts."""
        return k if self.at is None else int(self.at[k])

    def measured(self, k: int) -> Measured:
        return Measured(self.names[self.family[k]], int(self.width[k]), int(self.height[k]),
                        float(self.values["mean"][k]), float(self.values["contrast"][k]), float(self.values["blur"][k]))


def _zero_missing(values: np.ndarray) -> np.ndarray:
    """``values`` with a missing number (NaN) read as 0: the array itself where none is missing (read only)."""
    missing = np.isnan(values)
    return np.where(missing, 0.0, values) if missing.any() else values


def screen(by_sha: RawRows, features: Features, record: Mapping[str, Assignment],
           limits: OutlierSettings) -> tuple[SortedSubset, list[dict[str, Any]], list[tuple[str, str, str, ImageFeatures]],
                                             list[dict[str, str]]]:
    """(eligible shas in order, drop rows, outliers, abstentions): images without features and bad images are set aside.

    ``by_sha`` in sha256 order (``tables.raw_facts``). Phases: the facts as columns, the absolute rules, the
    relative rules over the rest, then the rows (the images without features first, then the bad ones).
    """
    shas = by_sha.shas
    columns = _Columns.of(by_sha, features.by_sha)
    decided = _absolute(shas, columns, limits)
    _check_override_share(decided, features.by_sha, len(by_sha), limits)
    relative, abstained = relative_columns(shas, flat_positions(~columns.failed & ~_marked(by_sha, decided)),
                                           columns.family, columns.names, columns.values_at,
                                           lambda at: Classes(by_sha.codes[at], by_sha.names), limits)
    decided.update(relative)
    for family, rule in sorted({(a["family"], a["rule"]) for a in abstained}):
        log.warning("curate: the %s rule abstains for %s images: %s", rule, family,
                    "; ".join(a["why"] for a in abstained if (a["family"], a["rule"]) == (family, rule)))
    dropped, outliers = _rows(shas, by_sha, columns, decided, features.by_sha, record)
    eligible = shas.take(np.flatnonzero(~columns.failed & ~_marked(by_sha, decided)))  # their bytes: no string
    return eligible, dropped, outliers, abstained


def _absolute(shas: list[str], columns: _Columns, limits: OutlierSettings) -> dict[str, tuple[str, str]]:
    """sha256 -> (reason, detail) of each image an absolute rule flags: the masks find the candidates, and
    ``outlier_reason`` (the rules in their order, the first that applies) names each one's reason."""
    v = columns.values
    hit = (columns.width < limits.min_training_side) | (columns.height < limits.min_training_side)
    hit |= v["contrast"] < CONSTANT_STD
    for stat, setting, low_is_bad in (("mean", "min_mean", True), ("mean", "max_mean", False),
                                      ("blur", "min_blur", True)):
        limit = getattr(limits, setting)
        if limit is not None:
            hit |= v[stat] < limit if low_is_bad else v[stat] > limit
    decided = {}
    for k in np.flatnonzero(hit & ~columns.failed).tolist():
        if (bad := outlier_reason(columns.measured(k), limits)) is not None:
            decided[shas[k]] = bad
    return decided


def _marked(by_sha: RawRows, decided: dict[str, tuple[str, str]]) -> np.ndarray:
    """Each position's mark: flagged by a rule (placed from the few flagged images, not a lookup of every image)."""
    marked = np.zeros(len(by_sha), dtype=bool)
    marked[by_sha.positions(decided)] = True
    return marked


def _rows(shas: list[str], by_sha: RawRows, columns: _Columns, decided: dict[str, tuple[str, str]],
          facts: FeatureFacts, record: Mapping[str, Assignment]
          ) -> tuple[list[dict[str, Any]], list[tuple[str, str, str, ImageFeatures]]]:
    """The drop rows (the images without features, then the bad images, each in sha256 order) and the outliers."""
    def home(sha: str) -> str:
        return record[sha].component if sha in record else sha  # bad images are not grouped

    dropped: list[dict[str, Any]] = []
    for k in np.flatnonzero(columns.failed):
        error = facts.errors[columns.fact_at(int(k))]
        reason = "undecodable" if error.startswith("undecodable") else "fastdup_invalid"
        dropped.append(drop_row(by_sha[shas[k]], reason, home(shas[k]), None, error))
    outliers: list[tuple[str, str, str, ImageFeatures]] = []
    for sha in sorted(decided):  # the sha256 order of ``shas``: the few flagged, not a string of every image
        reason, detail = decided[sha]
        dropped.append(drop_row(by_sha[sha], reason, home(sha), None, detail))
        outliers.append((sha, reason, detail, facts[sha]))
    return dropped, outliers


def constant_images(facts: FeatureFacts) -> set[str]:
    """The images that are one colour (``is_constant``), read from the columns in their own order: no lookup by
    sha256 (the screen already placed every image; a row a later one replaced is not counted)."""
    one_colour = facts.numbers["contrast"] < CONSTANT_STD  # a missing contrast (NaN) is not
    return {sha for i in np.flatnonzero(one_colour & ~facts.failed()).tolist()
            if facts.at[sha := facts.shas[i]] == i}


_STATISTIC = {"blurry": ("blur", "min_blur"), "too_dark": ("mean", "min_mean"), "too_bright": ("mean", "max_mean")}


def _check_override_share(decided: dict[str, tuple[str, str]], facts: FeatureFacts, total: int,
                          limits: OutlierSettings) -> None:
    """Stop before dropping when an absolute limit flags a large share: the threshold does not fit this data."""
    counts: dict[str, int] = {}
    for sha, (reason, _) in decided.items():
        if not is_constant(facts[sha]):  # a constant image is bad in any amount
            counts[reason] = counts.get(reason, 0) + 1
    for reason, n in sorted(counts.items()):
        if n < 10 or n / max(total, 1) <= limits.max_share:
            continue
        detail = ""
        if reason in _STATISTIC:
            stat, setting = _STATISTIC[reason]
            values = facts.numbers[stat][~np.isnan(facts.numbers[stat])]
            detail = (f" ({setting} {getattr(limits, setting):g}; this data's median {stat} "
                      f"{float(np.median(values)):.4g})" if len(values) else f" ({setting} {getattr(limits, setting):g})")
        raise OutlierRuleError(
            f"curation.outliers: {reason} would drop {n} of {total} images ({n / total:.1%}, more than max_share "
            f"{limits.max_share:g}){detail}: the limit does not fit this dataset. Look at some of them, then set "
            f"the limit for this data (e.g. in conf/datasets/<name>.yaml), remove it (null: the relative rule) or "
            f"raise max_share; nothing was written"
        )
