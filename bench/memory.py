"""The benchmarks' memory readings of this process: resident now, its peak, and a sampled high-water mark.

``ru_maxrss`` (``peak_mb``) counts file-backed pages (a memory-mapped vector file, index) with the heap; the kernel
may drop the former under pressure, so ``rss_split_mb`` and ``HighWater`` give the anonymous and the file-backed parts
apart. Neither the kernel nor Python keeps a high of those: ``HighWater`` samples them every ``SAMPLE_S`` seconds,
with the C heap's memory in use (``heap_in_use_mb``: what the anonymous memory holds that a library asked for and did
not free; the rest of it is the allocator's free but kept memory, Python's own arenas and the libraries' mappings).
"""

from __future__ import annotations

import ctypes
import resource
import threading
from pathlib import Path

SAMPLE_S = 0.005


def rss_mb() -> float:
    """Resident MB now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def peak_mb() -> float:
    """The process's peak resident MB so far (``ru_maxrss``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_split_mb() -> list[float]:
    """[anonymous, file-backed] resident MB now (``RssAnon``; ``RssFile`` + ``RssShmem``)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    kb = {k: int(v.split()[0]) for k, v in fields.items() if k in ("RssAnon", "RssFile", "RssShmem")}
    return [kb.get("RssAnon", 0) / 1024, (kb.get("RssFile", 0) + kb.get("RssShmem", 0)) / 1024]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def mallinfo() -> _MallInfo2 | None:
    """glibc's ``mallinfo2`` now (its heaps, in use and free, and its mapped blocks), None where it is missing."""
    return None if _MALLINFO2 is None else _MALLINFO2()


def heap_in_use_mb() -> float:
    """MB the C library's allocator has handed out and not had back: its heaps' chunks in use and its mapped blocks
    (numpy's arrays, Arrow's buffers under the system pool, the native libraries' own; not Python's small objects,
    which live in arenas of their own); NaN where glibc's ``mallinfo2`` is missing."""
    m = mallinfo()
    if m is None:
        return float("nan")
    return (m.uordblks + m.hblkhd) / 2**20


class HighWater:
    """Highs of resident memory while it runs (``high``: total MB; ``split``: [anonymous, file-backed, C heap in use]
    MB), sampled every ``SAMPLE_S``. A context manager (``before``: resident MB on entry), or ``restart`` for a
    section's own high inside a longer run (it returns the highs so far, to be merged back with ``merge``)."""

    def __init__(self) -> None:
        self.before = rss_mb()
        self.high, self.split = self.before, _readings()
        self._lock = threading.Lock()  # a sample taken across a restart or a merge would overwrite what they set
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def __enter__(self) -> HighWater:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        total, split = rss_mb(), _readings()
        with self._lock:
            self.high = max(self.high, total)
            self.split = [max(h, v) for h, v in zip(self.split, split)]

    def restart(self) -> tuple[float, list[float]]:
        """The highs so far; from here on the highs are a section's own."""
        total, split = rss_mb(), _readings()
        with self._lock:
            outer = self.high, self.split
            self.high, self.split = total, split
        return outer

    def merge(self, outer: tuple[float, list[float]]) -> tuple[float, list[float]]:
        """This section's highs (sampled once more now); the run's highs again include ``outer``."""
        self._sample()
        with self._lock:
            own = self.high, list(self.split)
            self.high, self.split = max(outer[0], own[0]), [max(a, b) for a, b in zip(outer[1], own[1])]
        return own

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def _readings() -> list[float]:
    """What ``HighWater`` samples: [anonymous, file-backed, C heap in use] MB."""
    return [*rss_split_mb(), heap_in_use_mb()]
