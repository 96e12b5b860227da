"""Copy scores in worker processes: a caller without a ``__main__`` guard gets them from the workers (which never
re-run it); workers that cannot start leave every score to this process, never a hang, and what the caller's frames
hold is freed when the call returns."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import gc
    import itertools
    import weakref

    from tasks.curation import copy_pairs
    from tasks.curation.copy_pairs import CopyScores
    from tests.factories.curation import noise_pngs

    images = {f"{i:064d}": data for i, data in enumerate(noise_pngs(96, 8))}
    pairs = list(itertools.combinations(sorted(images), 2))
    assert len(pairs) >= copy_pairs.PARALLEL_FROM


    class Held:  # what the caller's frame holds while it scores (a plan's maps)
        pass


    def plan():
        held = Held()
        scores = CopyScores(images.__getitem__, workers=2)
        scores.score_many(pairs)
        return scores.fresh.count, weakref.ref(held)


    gc.disable()  # freed when the call returns, not at a later garbage collection
    count, held = plan()
    print("caller's frame held after the call:", held() is not None)
    print("scored", count)
''')


# Imported at every interpreter's start (it is on PYTHONPATH): a process started once WORKERS_FAIL is set exits at
# once, as a worker that cannot start does.
SITECUSTOMIZE = "import os\nif os.environ.get('WORKERS_FAIL'):\n    os._exit(3)\n"


def _run(tmp_path: Path, workers_fail: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT if not workers_fail else 'import os\nos.environ["WORKERS_FAIL"] = "1"\n' + SCRIPT)
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), str(REPO / "plugins")])}
    env.pop("WORKERS_FAIL", None)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)


def test_a_script_without_a_main_guard_is_scored_by_the_workers(tmp_path: Path) -> None:
    done = _run(tmp_path, workers_fail=False)  # no `if __name__ == "__main__":`: the workers must not re-run it
    assert done.returncode == 0, done.stderr[-2000:]
    assert "scored 4560" in done.stdout.splitlines()[-1]
    assert "in this process" not in done.stderr


def test_workers_that_cannot_start_leave_the_scores_to_this_process(tmp_path: Path) -> None:
    done = _run(tmp_path, workers_fail=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "scored 4560" in done.stdout.splitlines()[-1]
    # The failed workers' exception kept every frame up the stack (a whole plan) until a full garbage collection.
    assert "caller's frame held after the call: False" in done.stdout
    assert "scoring 4560 pairs in this process" in done.stderr
