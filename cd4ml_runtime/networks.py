"""Network definitions in plain torch (no torchvision: its PyPI wheels pull CUDA packages).

An architecture is a small dict stored with every model (``arch``), so a model rebuilds its
own network: ``{"name", "num_classes", "in_channels", "image_size", "stem"}``.

* ``small_cnn``: two conv blocks and a linear head, for tiny images (8-32 px digits).
* ``resnet18`` (basic blocks 2-2-2-2) and ``resnet50`` (bottlenecks 3-4-6-3) with one of two stems:
  ``imagenet`` (7x7 stride 2 + max pool, as in He et al.; for photos of 96 px and more, e.g. 224)
  or ``small`` (3x3 stride 1, no pool: a 16 px digit keeps its detail). ``stem: auto`` picks by
  the image size. Every network exposes ``features`` (backbone to a flat vector) and
  ``classifier`` (the head): transfer learning, frozen backbones and drift embeddings use them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NAMES = ("small_cnn", "resnet18", "resnet50")
IMAGENET_STEM_MIN_SIZE = 96


class SmallCNN(nn.Module):
    """Two conv blocks (conv 3x3, batch norm, ReLU, 2x2 max pool) and one linear layer."""

    def __init__(self, num_classes: int, image_size: int, in_channels: int = 1, widths: tuple[int, int] = (16, 32)) -> None:
        super().__init__()
        if image_size < 4:
            raise ValueError(f"image_size must be >= 4 for two 2x2 poolings, got {image_size}")
        c1, c2 = widths
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(c1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(c2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        side = image_size // 2 // 2
        self.classifier = nn.Linear(c2 * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    """Identity, or a strided 1x1 projection with batch norm when the shape changes."""
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 projection when the shape changes)."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(c_in, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as torchvision's v1.5), 1x1 expand x4, residual."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(c_in, out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with a selectable stem; stages of widths 64-128-256-512 (x expansion), global average pool."""

    def __init__(
        self, block: type[BasicBlock] | type[Bottleneck], depths: tuple[int, ...], num_classes: int,
        in_channels: int = 1, stem: str = "small", width: int = 64,
    ) -> None:
        super().__init__()
        if stem == "imagenet":
            layers: list[nn.Module] = [
                nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
        elif stem == "small":
            layers = [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
        else:
            raise ValueError(f"stem must be 'imagenet' or 'small', got {stem!r}")
        c_in = width
        for stage, depth in enumerate(depths):
            planes = width * 2**stage
            for i in range(depth):
                layers.append(block(c_in, planes, 2 if (i == 0 and stage > 0) else 1))
                c_in = planes * block.expansion
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_in, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def describe(name: str, num_classes: int, in_channels: int, image_size: int, stem: str = "auto") -> dict[str, Any]:
    """The architecture dict stored with a model (``stem: auto`` resolved by the image size)."""
    if name not in NAMES:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(NAMES)}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if stem == "auto":
        stem = "imagenet" if image_size >= IMAGENET_STEM_MIN_SIZE else "small"
    if name == "small_cnn":
        stem = "none"
    return {"name": name, "num_classes": int(num_classes), "in_channels": int(in_channels),
            "image_size": int(image_size), "stem": stem}


def build(arch: dict[str, Any]) -> nn.Module:
    """A freshly initialised network for an architecture dict (the RNG state decides the weights)."""
    name, k, c = arch["name"], int(arch["num_classes"]), int(arch.get("in_channels", 1))
    size = int(arch["image_size"])
    if name == "small_cnn":
        return SmallCNN(k, size, c)
    if size < 8:
        raise ValueError(f"image_size must be >= 8 for a ResNet's three stride-2 stages, got {size}")
    if name == "resnet18":
        return ResNet(BasicBlock, (2, 2, 2, 2), k, c, arch.get("stem", "small"))
    if name == "resnet50":
        return ResNet(Bottleneck, (3, 4, 6, 3), k, c, arch.get("stem", "small"))
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(NAMES)}")
