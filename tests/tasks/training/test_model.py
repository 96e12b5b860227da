"""Networks and the data path pieces, without MLflow: shapes, transfer, cache, sharding, augmentation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.factories.digits import write_curated_digits


@pytest.mark.parametrize("name,channels,size", [("small_cnn", 1, 16), ("small_cnn", 3, 16), ("resnet18", 1, 16),
                                               ("resnet18", 3, 112), ("resnet50", 3, 32)])
def test_every_model_maps_a_batch_to_class_logits_and_trains(name: str, channels: int, size: int) -> None:
    from tasks.training.model import build_model

    torch.manual_seed(0)
    model = build_model(name, num_classes=10, image_size=size, in_channels=channels)
    x = torch.rand(4, channels, size, size)
    logits = model(x)
    assert logits.shape == (4, 10)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert hasattr(model, "features") and hasattr(model, "classifier")


def test_resnet18_is_resnet18_sized() -> None:
    from tasks.training.model import build_model

    params = sum(p.numel() for p in build_model("resnet18", 10, 16).parameters())
    assert 11_000_000 < params < 11_300_000  # torchvision's resnet18 has 11.2M with 1000 classes
    # ResNet-50 at 224 px with the ImageNet stem: torchvision's has 25.56M with 1000 classes (2.05M in the head)
    params = sum(p.numel() for p in build_model("resnet50", 1000, 224, in_channels=3).parameters())
    assert params == 25_557_032
    from tasks.training.model import architecture

    assert architecture("resnet50", 5, 224, 3)["stem"] == "imagenet" and architecture("resnet18", 5, 32)["stem"] == "small"


def test_unknown_model_is_a_clear_error() -> None:
    from tasks.training.model import MODEL_NAMES, build_model

    assert set(MODEL_NAMES) == {"small_cnn", "resnet18", "resnet50"}
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        build_model("vgg", 10, 16)


def test_transfer_keeps_the_backbone_and_starts_a_new_head_when_classes_change() -> None:
    from tasks.training.model import build_model, transfer_weights

    torch.manual_seed(1)
    source = build_model("small_cnn", 10, 16)
    torch.manual_seed(2)
    target = build_model("small_cnn", 3, 16)
    fresh = transfer_weights(target, source.state_dict(), freeze_backbone=True)
    assert fresh == ["classifier.bias", "classifier.weight"]
    for key, value in source.features.state_dict().items():
        assert torch.equal(target.features.state_dict()[key], value)
    assert not any(p.requires_grad for p in target.features.parameters())
    assert all(p.requires_grad for p in target.classifier.parameters())


def test_random_shift_moves_pixels_within_bounds_and_is_seeded() -> None:
    from tasks.training.augment import random_shift

    x = torch.zeros(64, 1, 8, 8)
    x[:, 0, 3:5, 3:5] = 1.0  # a centred 2x2 square: any shift up to 2 keeps it inside
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, b = random_shift(x, 2, g1), random_shift(x, 2, g2)
    assert torch.equal(a, b)
    assert a.shape == x.shape
    assert torch.all(a.sum(dim=(1, 2, 3)) == 4.0)
    assert (a != x).any()  # some images moved
    assert torch.equal(random_shift(x, 0, torch.Generator()), x)


def test_distributed_shards_are_disjoint_and_cover_the_split() -> None:
    from tasks.training.device import device_plan
    from tasks.training.loader import set_epoch, train_loader

    plan = device_plan("cpu", amp=True, channels_last=True)
    assert plan.amp_dtype is None and not plan.pin_memory and plan.backend == "gloo"
    assert plan.memory_format == torch.channels_last  # on CPU too (faster NHWC kernels)
    assert device_plan("cpu", amp=True, channels_last=False).memory_format == torch.contiguous_format
    x = torch.arange(100, dtype=torch.uint8).reshape(100, 1, 1, 1)
    y = torch.arange(100)
    seen: list[list[int]] = []
    for rank in range(2):
        loader = train_loader(x, y, batch_size=16, seed=3, rank=rank, world_size=2, plan=plan)
        set_epoch(loader, 1)
        seen.append([int(v) for _, yb in loader for v in yb])
    assert len(seen[0]) == len(seen[1]) == 50
    assert set(seen[0]).isdisjoint(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(100))
    loader = train_loader(x, y, batch_size=16, seed=3, rank=0, world_size=2, plan=plan)
    set_epoch(loader, 1)
    assert [int(v) for _, yb in loader for v in yb] == seen[0]  # same (seed, epoch): same order
    set_epoch(loader, 2)
    assert [int(v) for _, yb in loader for v in yb] != seen[0]


def test_the_decode_cache_is_built_once_per_version_and_matches_the_serving_decode(tmp_path: Path) -> None:
    import numpy as np

    from cd4ml_runtime.preprocess import PreprocessSpec, decode_many
    from tasks.training.data_cache import NoTrainingDataError, ensure_cache, load_cache, load_split_rows

    uri = str(tmp_path / "curated")
    version = write_curated_digits(uri, limit=120)
    cache_dir = str(tmp_path / "cache")
    path = ensure_cache(cache_dir, uri, version, 16)
    stamp = os.stat(Path(path) / "x_train.u8").st_mtime_ns
    assert ensure_cache(cache_dir, uri, version, 16) == path
    assert os.stat(Path(path) / "x_train.u8").st_mtime_ns == stamp  # not decoded again
    assert ensure_cache(cache_dir, uri, version, 8) != path  # another image size is another cache
    assert ensure_cache(cache_dir, uri, version, 16, channels=3) != path  # and another channel count

    cached = load_cache(path)
    assert cached.spec.channels == 1  # auto: the digits are stored as L
    rows = load_split_rows(uri, version, ("train",))
    served = decode_many(rows["image"].to_pylist(), PreprocessSpec(1, 16))
    assert np.array_equal(cached.train.read(np.arange(len(cached.train))), served)
    assert np.array_equal(cached.train.read([5, 2, 5]), served[[5, 2, 5]])  # any order, repeats
    from tasks.training.data_cache import SplitStore

    eager = SplitStore(cached.train.path, cached.train.n, cached.train.shape, release_bytes=1)  # pages handed back each read
    assert all(np.array_equal(eager.read([i, 0]), served[[i, 0]]) for i in range(len(served)))
    # the statistics are the train split's own
    x = served.astype(np.float64) / 255
    assert cached.spec.mean[0] == pytest.approx(x.mean(), abs=1e-5) and cached.spec.std[0] == pytest.approx(x.std(), abs=1e-5)
    assert cached.classes == [str(d) for d in range(10)]
    assert len(cached.examples) == 2 and cached.rows().num_rows == len(cached.y_train) + len(cached.y_val)

    only_train = write_curated_digits(str(tmp_path / "no-val"), splits=("train",), limit=60)
    with pytest.raises(NoTrainingDataError, match="0 val rows"):
        ensure_cache(cache_dir, str(tmp_path / "no-val"), only_train, 16)


def test_learning_rate_scales_with_the_global_batch() -> None:
    from tasks.settings import TrainingSettings
    from tasks.training.loop import lr_factor, scaled_learning_rate

    base = {
        "model": "small_cnn", "image_size": 16, "epochs": 2, "batch_size": 64, "learning_rate": 0.001,
        "weight_decay": 0.0, "patience": 1, "min_delta": 0.0, "seed": 0, "num_threads": 1,
        "checkpoint_dir": "/tmp/c", "cache_dir": "/tmp/d", "base_batch_size": 64,
    }
    linear = TrainingSettings(**base, lr_scaling="linear")
    assert scaled_learning_rate(linear, 1) == pytest.approx(0.001)
    assert scaled_learning_rate(linear, 4) == pytest.approx(0.004)
    assert scaled_learning_rate(TrainingSettings(**base, lr_scaling="sqrt"), 4) == pytest.approx(0.002)
    assert scaled_learning_rate(TrainingSettings(**base, lr_scaling="none"), 4) == pytest.approx(0.001)

    warm = TrainingSettings(**base, warmup_epochs=1)
    factor = lr_factor(warm, steps_per_epoch=10)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0) and factor(19) < 0.05
    with pytest.raises(ValueError, match="nproc_per_node > 1 needs launcher torchrun"):
        TrainingSettings(**base, nproc_per_node=2)
