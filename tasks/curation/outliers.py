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

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.curation.assignments import Assignment
from tasks.curation.bulk_limits import RULES, Verdict, judge
from tasks.curation.curation_features import Features, ImageFeatures
from tasks.curation.tables import RawFacts, drop_row
from tasks.errors import DataError
from tasks.settings import OutlierSettings

log = logging.getLogger(__name__)

CONSTANT_STD = 1.0  # grey levels: below, an image is one colour up to encoding noise
DARK_CONSTANT, BRIGHT_CONSTANT = 85.0, 170.0  # a constant image below / above is too_dark / too_bright, else flat
_OVERRIDE = {"too_dark": "min_mean", "too_bright": "max_mean", "blurry": "min_blur"}


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


def measured(width: int, height: int, f: ImageFeatures) -> Measured:
    return Measured(f.family or "unknown", width, height, float(f.mean or 0.0), float(f.contrast or 0.0),
                    float(f.blur or 0.0))


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
    flagged: dict[str, tuple[str, str]] = {}
    abstained: list[dict[str, str]] = []
    by_family: dict[str, list[str]] = {}
    for i in sorted(images):
        by_family.setdefault(images[i].family, []).append(i)
    for family, ids in sorted(by_family.items()):
        family_labels = [labels[i] for i in ids]
        values = _statistics([images[i] for i in ids])  # once a family, not once a rule
        for rule in RULES:
            if _OVERRIDE.get(rule.reason) and getattr(limits, _OVERRIDE[rule.reason]) is not None:
                continue  # the person's absolute limit replaces this rule
            verdict = judge(rule, values[rule.statistic], family_labels,
                            sigmas=limits.relative_sigmas, gap=limits.relative_gap,
                            min_images=limits.relative_min_images, max_share=limits.max_share)
            for k in verdict.flagged:
                flagged.setdefault(ids[k], (rule.reason, _detail(verdict, family, float(values[rule.statistic][k]),
                                                                 limits.relative_sigmas)))
            abstained.extend({"rule": rule.reason, "label": label, "why": f"{family} images: {why}", "family": family}
                             for label, why in verdict.abstained)
    return flagged, abstained


def _statistics(measured: list[Measured]) -> dict[str, np.ndarray]:
    """Each statistic a rule reads, one float64 per image in that order (``side``: the shorter side)."""
    return {"side": np.array([float(min(m.width, m.height)) for m in measured], dtype=np.float64),
            **{stat: np.array([getattr(m, stat) for m in measured], dtype=np.float64)
               for stat in ("mean", "contrast", "blur")}}


def _detail(verdict: Verdict, family: str, value: float, sigmas: float) -> str:
    rule, bulk = verdict.rule, verdict.bulk
    side = "<" if rule.low_is_bad else ">"
    name = {"side": "shorter side", "mean": "mean grey"}.get(rule.statistic, rule.statistic)
    return (f"{name} {value:.4g} {side} limit {bulk.limit:.4g} ({sigmas:g} robust sigmas from the median {bulk.median:.4g} "
            f"of this version's {family} images; flagged beyond the gap at {bulk.cut:.4g})")


def screen(by_sha: dict[str, RawFacts], features: Features, record: dict[str, Assignment],
           limits: OutlierSettings) -> tuple[list[str], list[dict[str, Any]], list[tuple[str, str, str, ImageFeatures]],
                                             list[dict[str, str]]]:
    """(eligible shas in order, drop rows, outliers, abstentions): images without features and bad images are set aside."""
    dropped: list[dict[str, Any]] = []
    outliers: list[tuple[str, str, str, ImageFeatures]] = []
    decided: dict[str, tuple[str, str]] = {}
    bulk: dict[str, Measured] = {}
    for sha, r in by_sha.items():
        f = features.by_sha[sha]
        home = record[sha].component if sha in record else sha  # bad images are not grouped
        if f.error is not None:
            reason = "undecodable" if f.error.startswith("undecodable") else "fastdup_invalid"
            dropped.append(drop_row(r, reason, home, None, f.error))
            continue
        m = measured(r.width, r.height, f)
        bad = outlier_reason(m, limits)
        if bad is None:
            bulk[sha] = m
        else:
            decided[sha] = bad
    _check_override_share(decided, features, len(by_sha), limits)
    relative, abstained = relative_screen(bulk, {s: str(by_sha[s].label) for s in bulk}, limits)
    decided.update(relative)
    for family, rule in sorted({(a["family"], a["rule"]) for a in abstained}):
        log.warning("curate: the %s rule abstains for %s images: %s", rule, family,
                    "; ".join(a["why"] for a in abstained if (a["family"], a["rule"]) == (family, rule)))
    eligible: list[str] = []
    for sha, r in by_sha.items():
        if sha in decided:
            home = record[sha].component if sha in record else sha
            dropped.append(drop_row(r, decided[sha][0], home, None, decided[sha][1]))
            outliers.append((sha, decided[sha][0], decided[sha][1], features.by_sha[sha]))
        elif features.by_sha[sha].error is None:
            eligible.append(sha)
    return eligible, dropped, outliers, abstained


_STATISTIC = {"blurry": ("blur", "min_blur"), "too_dark": ("mean", "min_mean"), "too_bright": ("mean", "max_mean")}


def _check_override_share(decided: dict[str, tuple[str, str]], features: Features, total: int,
                          limits: OutlierSettings) -> None:
    """Stop before dropping when an absolute limit flags a large share: the threshold does not fit this data."""
    counts: dict[str, int] = {}
    for sha, (reason, _) in decided.items():
        if not is_constant(features.by_sha[sha]):  # a constant image is bad in any amount
            counts[reason] = counts.get(reason, 0) + 1
    for reason, n in sorted(counts.items()):
        if n < 10 or n / max(total, 1) <= limits.max_share:
            continue
        detail = ""
        if reason in _STATISTIC:
            stat, setting = _STATISTIC[reason]
            values = [getattr(f, stat) for f in features.by_sha.values() if getattr(f, stat) is not None]
            detail = (f" ({setting} {getattr(limits, setting):g}; this data's median {stat} "
                      f"{float(np.median(values)):.4g})" if values else f" ({setting} {getattr(limits, setting):g})")
        raise OutlierRuleError(
            f"curation.outliers: {reason} would drop {n} of {total} images ({n / total:.1%}, more than max_share "
            f"{limits.max_share:g}){detail}: the limit does not fit this dataset. Look at some of them, then set "
            f"the limit for this data (e.g. in conf/datasets/<name>.yaml), remove it (null: the relative rule) or "
            f"raise max_share; nothing was written"
        )
