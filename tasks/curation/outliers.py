"""Bad images: which image is too small, too dark, too bright or blurry (``curation.outliers``).

Images without features and bad images are set aside before any grouping: a black frame is
"similar" to every other black frame whatever its label. A rule that would drop a large share
of the data stops the curation instead (``OutlierRuleError``): the threshold does not fit it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.curation.assignments import Assignment
from tasks.curation.curation_features import Features, ImageFeatures
from tasks.curation.tables import drop_row
from tasks.errors import DataError
from tasks.settings import OutlierSettings


class OutlierRuleError(DataError, ValueError):
    """A bad-image rule would drop a large share of the images (``curation.outliers.max_share``)."""


def outlier_reason(width: int, height: int, stats: ImageFeatures, limits: OutlierSettings) -> tuple[str, str] | None:
    """(reason, detail) when an image is too small, too dark, too bright or blurry, else None."""
    if min(width, height) < limits.min_training_side:
        return "too_small", f"{width}x{height} has a side below min_training_side {limits.min_training_side}"
    if stats.mean is not None and stats.mean < limits.min_mean:
        return "too_dark", f"mean {stats.mean:.1f} < min_mean {limits.min_mean:g}"
    if stats.mean is not None and stats.mean > limits.max_mean:
        return "too_bright", f"mean {stats.mean:.1f} > max_mean {limits.max_mean:g}"
    if stats.blur is not None and stats.blur < limits.min_blur:
        return "blurry", f"blur {stats.blur:.1f} < min_blur {limits.min_blur:g}"
    return None


def screen(by_sha: dict[str, dict[str, Any]], features: Features, record: dict[str, Assignment],
           limits: OutlierSettings) -> tuple[list[str], list[dict[str, Any]], list[tuple[str, str, str, ImageFeatures]]]:
    """(eligible shas in order, drop rows, outliers): images without features and bad images are set aside."""
    dropped: list[dict[str, Any]] = []
    outliers: list[tuple[str, str, str, ImageFeatures]] = []
    eligible: list[str] = []
    for sha, r in by_sha.items():
        f = features.by_sha[sha]
        home = record[sha].component if sha in record else sha  # bad images are not grouped
        if f.error is not None:
            reason = "undecodable" if f.error.startswith("undecodable") else "fastdup_invalid"
            dropped.append(drop_row(r, reason, home, None, f.error))
            continue
        bad = outlier_reason(int(r["width"]), int(r["height"]), f, limits)
        if bad is not None:
            dropped.append(drop_row(r, bad[0], home, None, bad[1]))
            outliers.append((sha, bad[0], bad[1], f))
            continue
        eligible.append(sha)
    _check_outlier_share(outliers, features, len(by_sha), limits)
    return eligible, dropped, outliers


_STATISTIC = {"blurry": ("blur", "min_blur"), "too_dark": ("mean", "min_mean"), "too_bright": ("mean", "max_mean")}


def _check_outlier_share(outliers: list[tuple[str, str, str, ImageFeatures]], features: Features, total: int,
                         limits: OutlierSettings) -> None:
    """Stop before dropping when one bad-image rule flags a large share: the threshold does not fit this data."""
    counts: dict[str, int] = {}
    for _, reason, _, _ in outliers:
        counts[reason] = counts.get(reason, 0) + 1
    for reason, n in sorted(counts.items()):
        if n < 10 or n / max(total, 1) <= limits.max_share:
            continue
        detail = ""
        if reason in _STATISTIC:
            stat, setting = _STATISTIC[reason]
            values = [getattr(f, stat) for f in features.by_sha.values() if getattr(f, stat) is not None]
            detail = (f" ({setting} {getattr(limits, setting):g}; this data's median {stat} "
                      f"{float(np.median(values)):.1f})" if values else f" ({setting} {getattr(limits, setting):g})")
        raise OutlierRuleError(
            f"curation.outliers: {reason} would drop {n} of {total} images ({n / total:.1%}, more than max_share "
            f"{limits.max_share:g}){detail}: the rule does not fit this dataset. Look at some of them, then set "
            f"the threshold for this data (e.g. in conf/datasets/<name>.yaml) or raise max_share; nothing was written"
        )
