"""Copy scores in worker processes: a caller without a ``__main__`` guard gets every score in-process, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import itertools

    from tasks.curation import copy_pairs
    from tasks.curation.copy_pairs import CopyScores
    from tests.factories.curation import noise_pngs

    images = {f"{i:064d}": data for i, data in enumerate(noise_pngs(96, 8))}
    pairs = list(itertools.combinations(sorted(images), 2))
    assert len(pairs) >= copy_pairs.PARALLEL_FROM
    scores = CopyScores(images.__getitem__, workers=2)
    scores.score_many(pairs)
    print("scored", scores.fresh.count)
''')


def test_a_script_without_a_main_guard_is_scored_in_process(tmp_path: Path) -> None:
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT)  # no `if __name__ == "__main__":`: spawned workers re-run it and cannot start
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins'}"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "scored 4560" in done.stdout.splitlines()[-1]
    assert "scoring 4560 pairs in this process" in done.stderr
