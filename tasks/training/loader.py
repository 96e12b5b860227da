"""From the decode cache to the model: this rank's shuffled batches, on the device.

``train_loader`` shards the train split by rank (``DistributedSampler``) and fetches a whole
batch per call; with ``num_workers`` > 0 worker processes read ahead and pin while the model
trains. Pixels travel as uint8, pinned and copied ``non_blocking`` on CUDA; scaling,
augmentation (train split only) and the per-channel normalisation run on the device.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

from cd4ml_runtime.preprocess import PreprocessSpec, normalise, standardise
from tasks.training.augment import Augment
from tasks.training.data_cache import SplitStore
from tasks.training.device import DevicePlan, to_device


class BatchStoreDataset(Dataset):
    """Indexed with a list of positions, returns the whole batch: one read, no per-image collate."""

    def __init__(self, x: SplitStore | torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(positions, dtype=torch.long)
        if isinstance(self.x, SplitStore):
            return torch.from_numpy(self.x.read(positions)), self.y[index]
        return self.x[index], self.y[index]


def train_loader(
    x: SplitStore | torch.Tensor, y: torch.Tensor, batch_size: int, seed: int, rank: int, world_size: int,
    plan: DevicePlan, num_workers: int = 0,
) -> DataLoader:
    """Shuffled batches of this rank's shard; call ``set_epoch(loader, epoch)`` each epoch."""
    dataset = BatchStoreDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False)
    return DataLoader(
        dataset,
        sampler=BatchSampler(sampler, batch_size=batch_size, drop_last=False),
        batch_size=None,
        num_workers=num_workers,
        pin_memory=plan.pin_memory,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None,
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Reshuffle for ``epoch``: the order depends only on (seed, epoch), so a resumed run repeats it."""
    loader.sampler.sampler.set_epoch(epoch)  # type: ignore[attr-defined]  # BatchSampler over a DistributedSampler


def model_input(x_u8: torch.Tensor, spec: PreprocessSpec, plan: DevicePlan) -> torch.Tensor:
    """Unaugmented uint8 pixels to the model's input on the device (validation, evaluation)."""
    x = normalise(x_u8.to(plan.device, non_blocking=plan.non_blocking), spec)
    return x.contiguous(memory_format=plan.memory_format)


def batches(
    loader: DataLoader, plan: DevicePlan, augment: Augment, spec: PreprocessSpec, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Device batches ready for the model: scaled, augmented, normalised, in the plan's memory format."""
    for xb, yb in loader:
        x = standardise(augment(to_device(xb, plan), generator), spec).contiguous(memory_format=plan.memory_format)
        yield x, yb.to(plan.device, non_blocking=plan.non_blocking)
