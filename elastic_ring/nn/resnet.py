"""ResNets for CIFAR (He et al. 2016, "Deep Residual Learning", section 4.2).

A 3x3 convolution with 16 filters, then three stages of n basic blocks each (two 3x3 convolutions
per block) on feature maps of 32, 16 and 8 pixels with 16, 32 and 64 filters, then global average
pooling and a 10-way fully connected layer: 6n+2 weighted layers. Shortcuts are identities; where
the shape changes they subsample by 2 and pad the new channels with zeros (option A), so the
shortcuts add no parameters.

    depth   n    parameters (paper)   parameters (this code, width 16)
    20      3    0.27M                269,722
    32      5    0.46M                464,154
    44      7    0.66M                658,586
    56      9    0.85M                853,018
    110     18   1.7M                 1,727,962

``width`` scales all three stages (16/32/64 at width 16); small widths make fast test models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEPTHS = (20, 32, 44, 56, 110)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.pad = planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.pad == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.pad // 2
        return F.pad(x, (0, 0, 0, 0, half, self.pad - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, depth: int = 110, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.depth = depth
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers: list[nn.Module] = []
        in_planes = width
        for stage, planes in enumerate((width, 2 * width, 4 * width)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def resnet(depth: int = 110, width: int = 16, num_classes: int = 10) -> CifarResNet:
    """Factory: ``resnet(110)`` is ResNet-110 for CIFAR-10."""
    return CifarResNet(depth=depth, width=width, num_classes=num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
