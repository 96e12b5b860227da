"""fastdup is optional: whether it is installed here, and the one way the curation imports it.

fastdup's licence (CC BY-NC-ND 4.0) does not cover commercial use, so an install may leave it out
(`make venv WITH_FASTDUP=0`, README "Licences"). Only two things need it: its own model
(``curation.embedding: fastdup``) and its HTML galleries. Without it the first is refused before
anything runs (``FastdupUnavailableError``, naming how to install it) and the second is skipped;
the curation's own page (``tasks.curation.report_html``) shows the same findings either way.

Whether it is installed is answered from the import system without importing it: the import
prints a banner and takes about a second, and a blocked import (``sys.modules["fastdup"] = None``)
counts as not installed.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tasks.errors import DataError
from tasks.settings import CurationSettings

INSTALL_HINT = ("pip install --no-deps -r requirements-fastdup.txt (what `make venv` does by default; "
                "fastdup is licensed CC BY-NC-ND 4.0, non-commercial: README \"Licences\")")


class FastdupUnavailableError(DataError, RuntimeError):
    """A setting asks for fastdup and it is not installed here; the message says how to install it."""


def fastdup_installed() -> bool:
    """True when ``import fastdup`` would find the package (it is not imported here)."""
    try:
        return importlib.util.find_spec("fastdup") is not None
    except (ImportError, ValueError):  # a half-imported or blocked module counts as missing
        return False


def embedding_problem(cfg: CurationSettings) -> str | None:
    """Why these settings cannot run here, or None: ``embedding: fastdup`` needs fastdup installed."""
    if cfg.embedding == "fastdup" and not fastdup_installed():
        return f"curation.embedding: fastdup needs the fastdup package, which is not installed here: {INSTALL_HINT}; " \
               "or use curation.embedding: pixels (the default, no fastdup)"
    return None


def require_embedding(cfg: CurationSettings) -> None:
    """Refuse before any work when the configured embedding cannot run here."""
    problem = embedding_problem(cfg)
    if problem is not None:
        raise FastdupUnavailableError(problem)


def import_fastdup(purpose: str) -> ModuleType:
    """The fastdup module, imported now; ``FastdupUnavailableError`` naming ``purpose`` when it is missing."""
    if not fastdup_installed():
        raise FastdupUnavailableError(f"{purpose} needs the fastdup package, which is not installed here: {INSTALL_HINT}")
    import fastdup

    return fastdup
