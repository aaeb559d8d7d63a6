"""Inputs of the benchmarks: seeded float32 data, layer shapes and small models.

Data is drawn directly in float32 (``standard_normal(..., dtype=np.float32)``), so no
float64 temporary ever raises the peak memory of a process before a measurement.
PyTorch tensors share the memory of the NumPy arrays (``torch.from_numpy``): both
libraries read the very same bytes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "vector",
    "tensor",
    "global_shapes",
    "global_arrays",
    "holders",
    "resnet18",
    "small_model",
    "prunable_modules",
]


def vector(n: int, seed: int = 0, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``n`` standard normal float32 numbers, optionally reshaped."""
    x = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    return x if shape is None else x.reshape(shape)


def tensor(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Standard normal float32 array of `shape`."""
    return vector(math.prod(shape), seed, shape)


def global_shapes(total: int, count: int = 50, cols: int = 1000, seed: int = 1) -> list[tuple[int, int]]:
    """`count` Linear-like weight shapes ``(rows, cols)`` summing to about `total` entries.

    Sizes vary between half and 1.5 times the mean (1-3M entries each for ~100M in 50).
    """
    u = np.random.default_rng(seed).uniform(0.5, 1.5, count)
    u *= count / u.sum()
    mean_rows = total / count / cols
    return [(max(1, int(round(mean_rows * ui))), cols) for ui in u]


def global_arrays(shapes: list[tuple[int, int]], seed: int = 2) -> list[np.ndarray]:
    """One seeded float32 array per shape."""
    return [tensor(s, seed + i) for i, s in enumerate(shapes)]


def holders(arrays: list[np.ndarray]) -> list[Any]:
    """Linear-like modules whose ``weight`` parameters share the memory of `arrays`.

    Building them costs nothing: no initialisation, no copy. A fresh set per run keeps
    pruning from one run out of the next (pruning never writes into the weights).
    """
    import torch

    mods = []
    for a in arrays:
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.from_numpy(a), requires_grad=True)
        mods.append(m)
    return mods


def resnet18(num_classes: int = 1000, seed: int = 0) -> Any:
    """A ResNet-18 built by hand (no torchvision): 11.7M parameters, 21 conv/linear weights."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(seed)
    return ResNet18()


def small_model(layers: int = 10, width: int = 64, seed: int = 0) -> Any:
    """``layers`` Linear(width, width) with ReLUs: 2 * layers small tensors to prune."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    mods: list[Any] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def prunable_modules(model: Any, with_bias: bool = False) -> list[tuple[Any, str]]:
    """``(module, name)`` of every conv/linear weight (and bias if asked), in order."""
    from torch import nn

    out = []
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            out.append((m, "weight"))
            if with_bias and m.bias is not None:
                out.append((m, "bias"))
    return out
