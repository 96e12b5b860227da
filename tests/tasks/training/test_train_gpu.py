"""The CUDA path (bf16 autocast, channels_last, pinned memory, NCCL): runs only where torch sees a GPU.

The same functions run on CPU in every other test; these check what only a GPU can show.
"""

from __future__ import annotations

import pytest
import torch

from tests.factories.digits import write_curated_digits
from tests.factories.training import fast, private_home

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]


def test_the_cuda_plan_uses_bf16_channels_last_pinned_memory_and_nccl() -> None:
    from tasks.training.device import device_plan, to_device

    plan = device_plan("auto", amp=True, channels_last=True)
    assert plan.device.type == "cuda" and plan.backend == "nccl"
    assert plan.amp_dtype == torch.bfloat16 and plan.memory_format == torch.channels_last
    assert plan.pin_memory and plan.non_blocking
    x = to_device(torch.full((2, 1, 4, 4), 255, dtype=torch.uint8).pin_memory(), plan)
    assert x.is_cuda and x.dtype == torch.float32 and torch.all(x == 1.0)
    with plan.autocast():
        y = torch.nn.Linear(4, 2).cuda()(x.flatten(2))
    assert y.dtype == torch.bfloat16


def test_resnet18_trains_on_the_gpu_and_serves_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    import mlflow
    import pandas as pd

    from tasks.models.registry import mlflow_client
    from tasks.training.train import train
    from tests.factories.digits import split_rows

    with private_home(tmp_path_factory, "gpu-home") as base:
        settings = fast(base, model="resnet18", epochs=3, device="cuda", num_threads=4)
        version = write_curated_digits(settings.curated_table)
        result = train(settings, settings.curated_table, version, "manual__gpu", "2026-11-21")
        run = mlflow_client(settings).get_run(result.mlflow_run_id)
        assert "cuda" in run.data.tags["cd4ml.device"] and "bfloat16" in run.data.tags["cd4ml.device"]
        assert result.metrics["best_val_accuracy"] > 0.85
        model = mlflow.pyfunc.load_model(result.model_uri)  # weights were saved from the GPU, load on CPU
        val = split_rows("val")[:50]
        labels = model.predict(pd.DataFrame({"image": [r["image"] for r in val]}))["label"].tolist()
        assert sum(p == r["label"] for p, r in zip(labels, val)) >= 40


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices for NCCL DDP")
def test_two_gpus_with_nccl_reach_the_accuracy_of_one(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tasks.training.train import train, with_training

    with private_home(tmp_path_factory, "nccl-home") as base:
        one = fast(base, epochs=3, device="cuda")
        version = write_curated_digits(one.curated_table)
        single = train(one, one.curated_table, version, "gpu-1", "2026-11-21")
        two = with_training(one, {"launcher": "torchrun", "nproc_per_node": 2, "batch_size": 32})
        double = train(two, one.curated_table, version, "gpu-2", "2026-11-21")
        assert double.world_size == 2
        assert abs(single.metrics["best_val_accuracy"] - double.metrics["best_val_accuracy"]) <= 0.05
