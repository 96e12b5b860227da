"""What a class label offered by a person may be: bounded, printable, no path.

A label to accept (``cd4ml classes --accept``, the ``cd4ml_accept_class`` Param) is hostile input.
It is held to the rules a label meets to reach validation at all (the ingest's, for folder names
and manifest rows: valid UTF-8, no NUL), plus what a class name may be here: at most
``MAX_LABEL_CHARS`` characters, no control or format characters, no path separator, no blank
edges. A refusal names the rule and the label's position, never the label. Light on purpose (no
table code): the DAG file takes its Param bounds from here.
"""

from __future__ import annotations

import unicodedata

from tasks.errors import DataError

MAX_LABEL_CHARS = 128  # a folder name holds 255 bytes; a class name a person reads is far shorter
MAX_ACCEPTED = 20  # labels in one acceptance
_REFUSED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")  # control, format (direction marks), surrogates, line breaks


class LabelRefusedError(DataError, ValueError):
    """A label offered for acceptance breaks a label rule; the message names the rule only."""


def label_problem(label: object) -> str | None:
    """What is wrong with ``label`` as a class name (the rule, not the label); None when it may be a class."""
    if not isinstance(label, str) or not label:
        return "a label must be a non-empty string"
    if len(label) > MAX_LABEL_CHARS:
        return f"a label holds at most {MAX_LABEL_CHARS} characters (this one {len(label)})"
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        return "a label must be valid UTF-8 text"
    if label != label.strip():
        return "a label must not start or end with white space"
    if any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in label):
        return "a label must not hold control or format characters (NUL, new lines, direction marks)"
    if "/" in label or "\\" in label or label in (".", ".."):
        return "a label must not be a path (no '/', '\\', '.' or '..')"
    return None


def check_labels(labels: object) -> list[str]:
    """``labels`` as a list of class names, or ``LabelRefusedError`` naming every broken rule by position."""
    if not isinstance(labels, (list, tuple)) or not labels:
        raise LabelRefusedError("give at least one label")
    if len(labels) > MAX_ACCEPTED:
        raise LabelRefusedError(f"at most {MAX_ACCEPTED} labels at once (got {len(labels)})")
    problems = [f"label {i + 1}: {problem}" for i, label in enumerate(labels) if (problem := label_problem(label))]
    if problems:
        raise LabelRefusedError("; ".join(problems))
    return [str(label) for label in labels]


