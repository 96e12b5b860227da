"""A curation's process maps its large blocks apart: what it frees goes back to the system at once."""

import subprocess
import sys

import pytest

from tasks.curation.heap import map_large_blocks

# Grow the dynamic threshold with one 8 MB block freed, then hold 60 blocks of 3 MB among small live objects and free
# them: mapped apart they are returned at once; from the heap they stay resident beneath the small ones.
_PROBE = """
import sys
from pathlib import Path
from tasks.curation.heap import map_large_blocks
def anon():
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("RssAnon"))
    return int(line.split()[1]) / 1024
if sys.argv[1] == "set":
    assert map_large_blocks()
first = bytearray(8 << 20)
del first
held, small = [], []
for _ in range(60):
    held.append(bytearray(3 << 20))
    small.append(bytearray(1000))  # above pymalloc's 512 bytes: from the C heap, between the blocks
before = anon()
del held
print(before - anon())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_large_blocks_go_back_only_once_mapped_apart():
    def returned(mode: str) -> float:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
        out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, env=env)
        return float(out.stdout)

    assert returned("set") > 150  # about 180 MB freed, all of it returned
    assert returned("default") < 30  # the threshold had risen to 8 MB: the blocks came from the heap and stay


def test_an_explicit_environment_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert map_large_blocks() is False
