"""DDP setup: the process group, the wrapped model and the collectives every rank takes part in.

Distributed when ``WORLD_SIZE`` > 1 (torchrun sets it): gloo on CPU, NCCL on CUDA (the device
plan's backend). With one process every function here is a no-op, so the loop calls them
either way.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tasks.training.device import DevicePlan


def _init_distributed(plan: DevicePlan) -> tuple[int, int, bool]:
    """(rank, world size, whether this call created the process group)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    dist.init_process_group(backend=plan.backend, timeout=timedelta(minutes=30))
    return dist.get_rank(), dist.get_world_size(), True


@contextmanager
def process_group(plan: DevicePlan) -> Iterator[tuple[int, int]]:
    """(rank, world size) of this process; a group created here is torn down when all ranks are done."""
    rank, world, owns_group = _init_distributed(plan)
    try:
        yield rank, world
    finally:
        if owns_group:
            dist.barrier()
            dist.destroy_process_group()


def wrap(model: nn.Module, plan: DevicePlan, world_size: int) -> nn.Module:
    """The module the loop trains: ``model`` itself alone, in ``DistributedDataParallel`` with ranks."""
    if world_size <= 1:
        return model
    # A conv weight with one input channel has a size-1 dim, so its gradient's stride there is
    # arbitrary: DDP warns although the memory order is the same. Nothing to fix.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    return DistributedDataParallel(
        model,
        device_ids=[plan.device.index] if plan.device.type == "cuda" else None,
        gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy, one layout
    )


def all_sum(values: torch.Tensor, world_size: int) -> torch.Tensor:
    """``values`` summed over ranks, in place."""
    if world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def average_buffers(model: nn.Module, world_size: int) -> None:
    """Average batch-norm running statistics over ranks before evaluating.

    DDP keeps parameters identical but each rank updates its own running stats on its own
    shard; without this every rank would validate a slightly different model and the logged
    (rank 0) model would not score the all-reduced val accuracy.
    """
    if world_size <= 1:
        return
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer.div_(world_size)
