"""Launching training: in this process, or as N ranks under torchrun; each process then runs the loop.

``launch`` runs a ``WorkerRequest`` with the configured launcher: ``in_process`` calls
``run_worker`` here (so does ``tasks.training.tune`` for each trial); ``torchrun`` writes the
request beside the checkpoints and starts ``torchrun --standalone --nproc_per_node N -m
tasks.training.launch --request <checkpoint_dir>/request.json`` (the same inside a Kubernetes
trainer pod). Every rank runs ``run_worker``: same code, so a 2-process run on CPU tests what a
multi-GPU run does. The torchrun child dies with the task process, so an orphan never trains on
beside an Airflow retry.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

from tasks.settings import REPO_ROOT, Settings, TrainingSettings
from tasks.training.device import device_plan
from tasks.training.distributed import process_group
from tasks.training.loop import EpochCallback, train_rank
from tasks.training.request import REQUEST_FILE, RESULT_FILE, WorkerOutcome, WorkerRequest

log = logging.getLogger(__name__)


def run_worker(request: WorkerRequest, callback: EpochCallback | None = None) -> WorkerOutcome | None:
    """Train as this process's rank; rank 0 returns the outcome, other ranks None."""
    settings = Settings.model_validate(request.settings)
    cfg = settings.training
    torch.set_num_threads(cfg.num_threads)
    plan = device_plan(cfg.device, cfg.amp, cfg.channels_last, int(os.environ.get("LOCAL_RANK", "0")))
    with process_group(plan) as (rank, world):
        return train_rank(request, settings, plan, rank, world, callback)


def _die_with_parent() -> None:
    """In the torchrun child: get SIGTERM when the task process dies (e.g. SIGKILLed by Airflow).

    Otherwise an orphaned torchrun would keep training and writing checkpoints while the
    retry resumes from the same folder.
    """
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def run_torchrun(request_path: Path, nproc: int, num_threads: int, tracking_uri: str) -> WorkerOutcome:
    """``torchrun --standalone --nproc_per_node N -m tasks.training.launch``; rank 0 leaves result.json."""
    result_path = request_path.with_name(RESULT_FILE)
    result_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": str(num_threads),
        "MLFLOW_TRACKING_URI": tracking_uri,
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "tasks.training.launch", "--request", str(request_path),
    ]
    log.info("launching %s", " ".join(command))
    done = subprocess.run(command, env=env, check=False, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(
            f"torchrun exited with {done.returncode}; a retry resumes from the checkpoint in {request_path.parent}"
        )
    return WorkerOutcome.read(result_path)


def launch(request: WorkerRequest, cfg: TrainingSettings) -> WorkerOutcome | None:
    """Run ``request`` with ``cfg.launcher``: torchrun ranks (the request beside the checkpoints) or this process."""
    if cfg.launcher == "torchrun":
        if not request.checkpoint_dir:
            raise ValueError("the torchrun launcher needs a checkpoint_dir: its ranks read the request from there")
        request_path = Path(request.checkpoint_dir) / REQUEST_FILE
        request.write(request_path)
        return run_torchrun(request_path, cfg.nproc_per_node, cfg.num_threads, request.tracking_uri)
    return run_worker(request)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point: ``torchrun --nproc_per_node N -m tasks.training.launch --request FILE``."""
    parser = argparse.ArgumentParser(prog="python -m tasks.training.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True, help="request.json written by tasks.training.train")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s rank{os.environ.get('RANK', '0')} %(name)s: %(message)s")
    path = Path(args.request)
    outcome = run_worker(WorkerRequest.read(path))
    if outcome is not None:
        outcome.write(path.with_name(RESULT_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
