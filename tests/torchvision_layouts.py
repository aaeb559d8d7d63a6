"""torchvision's resnet18, mobilenet_v3_small and vit_b_16, written out with its module names.

torchvision cannot be installed beside the CPU torch used here, so the tests carry the
three architectures: the same modules, names, hyper-parameters and forward passes as
torchvision 0.2x (``torchvision.models.resnet``, ``mobilenetv3``, ``vision_transformer``),
so that a state dict of one loads into the other. Every builder takes ``width``, a map
applied to each inner channel count (not the image's 3 channels nor the classes): the
layout a shrunk model should have is the same builder with ``width=lambda c: c - round(r * c)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

__all__ = [
    "resnet18",
    "mobilenet_v3_small",
    "vit",
    "vit_b_16",
    "unet",
    "kept_width",
    "parameter_count",
    "macs",
    "randomized",
]

Width = Callable[[int], int]


def _same(c: int) -> int:
    return c


def kept_width(amount: float) -> Width:
    """The width a group of ``c`` channels has after losing ``round(amount * c)``."""
    return lambda c: c - round(amount * c)


# --------------------------------------------------------------------------- resnet18


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, layers: list[int], num_classes: int = 1000, width: Width = _same) -> None:
        super().__init__()
        self.inplanes = width(64)
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width(64), layers[0])
        self.layer2 = self._make_layer(width(128), layers[1], stride=2)
        self.layer3 = self._make_layer(width(256), layers[2], stride=2)
        self.layer4 = self._make_layer(width(512), layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width(512), num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def resnet18(num_classes: int = 1000, width: Width = _same) -> ResNet:
    """torchvision's ``resnet18`` (random weights)."""
    return ResNet([2, 2, 2, 2], num_classes, width)


# --------------------------------------------------------------------------- mobilenet_v3_small


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    def __init__(
        self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, activation: type | None = nn.ReLU
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=0.001, momentum=0.01),
        ]
        if activation is not None:
            layers.append(activation(inplace=True))
        super().__init__(*layers)
        self.out_channels = cout


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels: int, squeeze_channels: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.avgpool(x)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._scale(x) * x


class InvertedResidual(nn.Module):
    def __init__(
        self, cin: int, kernel: int, expanded: int, cout: int, use_se: bool, hs: bool, stride: int, squeeze: int
    ) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(Conv2dNormActivation(cin, expanded, 1, activation=act))
        layers.append(Conv2dNormActivation(expanded, expanded, kernel, stride, groups=expanded, activation=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, squeeze))
        layers.append(Conv2dNormActivation(expanded, cout, 1, activation=None))
        self.block = nn.Sequential(*layers)
        self.out_channels = cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


#: (input, kernel, expanded, output, squeeze-excite, hardswish, stride) as torchvision's small setting.
_SMALL = [
    (16, 3, 16, 16, True, False, 2),
    (16, 3, 72, 24, False, False, 2),
    (24, 3, 88, 24, False, False, 1),
    (24, 5, 96, 40, True, True, 2),
    (40, 5, 240, 40, True, True, 1),
    (40, 5, 240, 40, True, True, 1),
    (40, 5, 120, 48, True, True, 1),
    (48, 5, 144, 48, True, True, 1),
    (48, 5, 288, 96, True, True, 2),
    (96, 5, 576, 96, True, True, 1),
    (96, 5, 576, 96, True, True, 1),
]


class MobileNetV3(nn.Module):
    def __init__(self, num_classes: int = 1000, width: Width = _same) -> None:
        super().__init__()
        layers: list[nn.Module] = [Conv2dNormActivation(3, width(16), 3, 2, activation=nn.Hardswish)]
        for cin, k, exp, cout, se, hs, stride in _SMALL:
            squeeze = width(_make_divisible(exp // 4, 8))
            layers.append(InvertedResidual(width(cin), k, width(exp), width(cout), se, hs, stride, squeeze))
        last = width(6 * 96)
        layers.append(Conv2dNormActivation(width(96), last, 1, activation=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last, width(1024)),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=0.2, inplace=True),
            nn.Linear(width(1024), num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def mobilenet_v3_small(num_classes: int = 1000, width: Width = _same) -> MobileNetV3:
    """torchvision's ``mobilenet_v3_small`` (random weights)."""
    return MobileNetV3(num_classes, width)


# --------------------------------------------------------------------------- vit_b_16


class MLPBlock(nn.Sequential):
    def __init__(self, in_dim: int, mlp_dim: int, dropout: float) -> None:
        super().__init__(
            nn.Linear(in_dim, mlp_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp_dim, in_dim), nn.Dropout(dropout)
        )


class EncoderBlock(nn.Module):
    def __init__(self, num_heads: int, hidden_dim: int, mlp_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.ln_1 = norm(hidden_dim)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = norm(hidden_dim)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x)
        x = x + input
        y = self.ln_2(x)
        y = self.mlp(y)
        return x + y


class Encoder(nn.Module):
    def __init__(self, seq_length: int, num_layers: int, num_heads: int, hidden_dim: int, mlp_dim: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(num_layers):
            layers[f"encoder_layer_{i}"] = EncoderBlock(num_heads, hidden_dim, mlp_dim)
        self.layers = nn.Sequential(layers)
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class VisionTransformer(nn.Module):
    def __init__(
        self, image_size: int, patch_size: int, num_layers: int, num_heads: int, hidden_dim: int, mlp_dim: int,
        num_classes: int = 1000,
    ) -> None:  # fmt: skip
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim = image_size, patch_size, hidden_dim
        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim)
        self.seq_length = seq_length
        self.heads = nn.Sequential(OrderedDict([("head", nn.Linear(hidden_dim, num_classes))]))

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        p = self.patch_size
        x = self.conv_proj(x)
        x = x.reshape(n, self.hidden_dim, (h // p) * (w // p))
        return x.permute(0, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._process_input(x)
        n = x.shape[0]
        batch_class_token = self.class_token.expand(n, -1, -1)
        x = torch.cat([batch_class_token, x], dim=1)
        x = self.encoder(x)
        x = x[:, 0]
        return self.heads(x)


def vit(
    image_size: int = 32, patch_size: int = 8, num_layers: int = 2, num_heads: int = 4, hidden_dim: int = 64,
    mlp_dim: int = 256, num_classes: int = 10, width: Width = _same,
) -> VisionTransformer:  # fmt: skip
    """torchvision's ``VisionTransformer``, small by default; ``width`` maps the MLP width only."""
    return VisionTransformer(image_size, patch_size, num_layers, num_heads, hidden_dim, width(mlp_dim), num_classes)


def vit_b_16(num_classes: int = 1000, width: Width = _same) -> VisionTransformer:
    """torchvision's ``vit_b_16`` (224 px, 12 layers, 12 heads, 768 wide, MLP 3072)."""
    return vit(224, 16, 12, 12, 768, 3072, num_classes, width)


# --------------------------------------------------------------------------- a U-Net


class UNet(nn.Module):
    """Two levels down, two up; the decoder reads ``torch.cat([upsampled, skip], 1)``."""

    def __init__(self, width: Width = _same) -> None:
        super().__init__()
        c1, c2, c3 = width(8), width(16), width(32)

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

        self.enc1, self.enc2, self.mid = block(3, c1), block(c1, c2), block(c2, c3)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(c3, c2, 2, stride=2)
        self.dec2 = block(2 * c2, c2)
        self.up1 = nn.Upsample(scale_factor=2)
        self.dec1 = block(c2 + c1, c1)
        self.head = nn.Conv2d(c1, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def unet(width: Width = _same) -> UNet:
    """A small U-Net with Concat skips, a transposed convolution and an upsampling."""
    return UNet(width)


# --------------------------------------------------------------------------- counting


def parameter_count(model: nn.Module) -> int:
    """Parameters (not buffers)."""
    return sum(p.numel() for p in model.parameters())


def macs(model: nn.Module, *inputs: torch.Tensor) -> int:
    """Multiply-accumulates of every ``Conv*d`` and ``Linear`` (and attention projections) in one run."""
    total = 0

    def count(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            total += out.numel() * module.in_features
        elif isinstance(module, nn.modules.conv._ConvNd):
            w = module.weight
            kernel = w[0, 0].numel()
            if module.transposed:  # every input entry meets w.shape[1] filters of its group
                total += args[0].numel() * w.shape[1] * kernel
            else:  # every output entry reads w.shape[1] channels of its group
                total += out.numel() * w.shape[1] * kernel

    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    handles = [m.register_forward_hook(count) for m in layers]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return total


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """`model` in float64 and evaluation mode, its ``BatchNorm2d`` statistics and affine terms
    drawn far from 0/1 (so that folding and slicing them shows)."""
    g = torch.Generator().manual_seed(seed)
    model = model.double().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g, dtype=torch.float64) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g, dtype=torch.float64) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=g, dtype=torch.float64))
                m.bias.copy_(torch.randn(m.num_features, generator=g, dtype=torch.float64) * 0.1)
    return model
