"""Torch modules with the layouts (and module names) of torchvision's models, random weights.

torchvision cannot be installed beside the CPU torch of this project, so its
``resnet18``, ``mobilenet_v3_small`` and ``vit_b_16`` are written here with the same
structure and the same parameter names (``conv1``, ``layer1.0.downsample.0``,
``features.1.block.0.0``, ``encoder.layers.encoder_layer_0.mlp.0``, ...); the sizes can
be made small for tests. Only torch is imported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["resnet18", "mobilenet_v3_small", "vit_b_16", "BasicBlock"]


class BasicBlock(nn.Module):
    """torchvision's ResNet ``BasicBlock``: two 3x3 convolutions and a shortcut."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` with basic blocks (``resnet18``: ``layers=(2, 2, 2, 2)``)."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), width: int = 64, num_classes: int = 1000):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(width: int = 64, num_classes: int = 1000) -> ResNet:
    """torchvision's ``resnet18`` layout (``width=64``), random weights and BatchNorm statistics."""
    model = ResNet((2, 2, 2, 2), width, num_classes)
    _randomize_norms(model)
    return model


def _randomize_norms(model: nn.Module) -> None:
    """Running statistics and affine parameters away from their defaults, as after training."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def _divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: Any = nn.Hardswish):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=0.001, momentum=0.01),
        ]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return s * x


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, expanded: int, cout: int, se: bool, act: Any, stride: int):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(Conv2dNormActivation(cin, expanded, 1, act=act))
        layers.append(Conv2dNormActivation(expanded, expanded, k, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcitation(expanded, _divisible(expanded // 4)))
        layers.append(Conv2dNormActivation(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return y + x if self.use_res_connect else y


#: torchvision's mobilenet_v3_small settings: kernel, expanded, out, SE, activation, stride
_SMALL = [
    (3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1),
]  # fmt: skip


class MobileNetV3(nn.Module):
    """torchvision's ``mobilenet_v3_small`` layout: depthwise blocks with squeeze-excite."""

    def __init__(self, width: float = 1.0, num_classes: int = 1000, last_channel: int = 1024):
        super().__init__()
        first = _divisible(16 * width)
        layers: list[nn.Module] = [Conv2dNormActivation(3, first, 3, 2, act=nn.Hardswish)]
        cin = first
        for k, exp, out, se, a, stride in _SMALL:
            act = nn.Hardswish if a == "HS" else nn.ReLU
            e, o = _divisible(exp * width), _divisible(out * width)
            layers.append(InvertedResidual(cin, k, e, o, se, act, stride))
            cin = o
        last = 6 * cin
        layers.append(Conv2dNormActivation(cin, last, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last, last_channel),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2),
            nn.Linear(last_channel, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def mobilenet_v3_small(width: float = 1.0, num_classes: int = 1000, last_channel: int = 1024) -> MobileNetV3:
    """torchvision's ``mobilenet_v3_small`` layout (``width=1.0``), random weights."""
    model = MobileNetV3(width, num_classes, last_channel)
    _randomize_norms(model)
    return model


class MLPBlock(nn.Sequential):
    def __init__(self, dim: int, mlp_dim: int):
        super().__init__(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp_dim, dim), nn.Dropout(0.0))


class EncoderBlock(nn.Module):
    def __init__(self, heads: int, dim: int, mlp_dim: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = self.dropout(y) + x
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    def __init__(self, seq: int, layers: int, heads: int, dim: int, mlp_dim: int):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential()
        for i in range(layers):
            self.layers.add_module(f"encoder_layer_{i}", EncoderBlock(heads, dim, mlp_dim))
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """torchvision's ``VisionTransformer`` (``vit_b_16``: patch 16, 12 layers, 12 heads, 768, 3072)."""

    def __init__(self, image: int = 224, patch: int = 16, layers: int = 12, heads: int = 12, dim: int = 768,
                 mlp_dim: int = 3072, num_classes: int = 1000):  # fmt: skip
        super().__init__()
        self.patch_size, self.hidden_dim = patch, dim
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        seq = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = Encoder(seq, layers, heads, dim, mlp_dim)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(dim, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.hidden_dim, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


def vit_b_16(image: int = 224, layers: int = 12, heads: int = 12, dim: int = 768, mlp_dim: int = 3072,
             num_classes: int = 1000) -> VisionTransformer:  # fmt: skip
    """torchvision's ``vit_b_16`` layout (the defaults), random weights."""
    return VisionTransformer(image, 16, layers, heads, dim, mlp_dim, num_classes)
