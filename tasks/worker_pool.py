"""A pool of spawned worker processes that never re-run the caller's main script.

``spawn`` starts each worker as a fresh interpreter and, before it takes work, re-runs the caller's ``__main__``
(as ``__mp_main__``) so that functions defined there can be found. Every function this project hands to a worker lives
in an importable module, so that re-run buys nothing and breaks two callers:

* a script without a ``if __name__ == "__main__":`` guard: the re-run starts the work again, which tries to start
  workers while bootstrapping, and the pool breaks (the callers fell over to one process);
* an Airflow task: its main script is ``airflow``, whose import needs the metadata database URL, which Airflow 3 sets to
  ``airflow-db-not-allowed:///`` in a task's process, so every worker died on start (a curation in a Celery worker
  scored its copies on one core: bench/README.md, run 40).

Here each worker starts with an empty ``__main__`` (no file, no spec, so nothing is re-run): it imports only what the
functions it runs need. The caller's ``__main__`` is set aside only while a worker process is created, under a lock.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

_STARTING = threading.Lock()  # one worker created at a time: the caller's __main__ is set aside meanwhile


@contextmanager
def _caller_main_set_aside() -> Iterator[None]:
    """``sys.modules["__main__"]`` is an empty module while a worker is created (what it is told to prepare)."""
    with _STARTING:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


class _Worker(SpawnProcess):
    """A spawned process told to prepare no main module."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 (multiprocessing's name)
        with _caller_main_set_aside():
            return SpawnProcess._Popen(process_obj)


class _Context(SpawnContext):
    Process = _Worker


def spawn_pool(workers: int, initializer: Callable[..., object] | None = None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``workers`` spawned processes that never run the caller's main script; what they
    run must be importable by name (a module's function, not one of ``__main__``)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=_Context(), initializer=initializer, initargs=initargs)
