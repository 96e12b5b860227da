"""A folder of stored files that is there whole or not at all: built in a temporary folder beside its place, marked
complete last, then renamed into place. A reader sees all of it or none; of two curations that build one folder at
once, the first rename stands. A temporary folder older than ``STALE_SECONDS`` is a crashed build's."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

DONE = "complete"  # the file a built folder holds last
STALE_SECONDS = 3600
_WORK_PREFIX = ".tmp-"


def complete(folder: Path) -> bool:
    return (folder / DONE).is_file()


def work_folder(parent: Path) -> Path:
    """A new temporary folder in ``parent`` (made if missing) to build in."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=_WORK_PREFIX, dir=parent))


def publish(work: Path, own: Path) -> bool:
    """``work`` marked complete and renamed to ``own``; False where another curation's, renamed first, stands (the
    caller removes ``work``)."""
    (work / DONE).touch()
    try:
        work.rename(own)
    except OSError:
        if not complete(own):
            raise
        return False
    return True


def prune_stale(parent: Path) -> None:
    """Crashed builds' temporary folders in ``parent`` go."""
    for path in parent.glob(_WORK_PREFIX + "*"):
        if time.time() - path.stat().st_mtime > STALE_SECONDS:
            shutil.rmtree(path, ignore_errors=True)
