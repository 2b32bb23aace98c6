"""A small convolutional classifier for DP / FDP image classification (GroupNorm, no BatchNorm).

Two blocks ``conv 3×3 → GroupNorm → ReLU → max-pool 2×2`` (1 → 16 → 32 channels by default) and a
linear head on the flattened map: 20.6k parameters at 28×28. GroupNorm normalises each example on
its own (BatchNorm mixes examples and is refused in private training); every layer has a ghost
clipping rule (``featuredp.clipping.rules``: Conv2d, GroupNorm, Linear), so per-example gradient
norms never materialise per-example gradients.

>>> m = SmallCNN(in_channels=1, image_size=28, num_classes=10)
>>> m(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in m.parameters())
(torch.Size([2, 10]), 20586)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from featuredp._validate import check_int

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    """Blocks conv 3×3 (padding 1) → GroupNorm(``groups``) → ReLU → max-pool 2, one per width; a linear head."""

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10,
                 widths: Sequence[int] = (16, 32), groups: int = 4) -> None:  # fmt: skip
        super().__init__()
        in_channels = check_int("in_channels", in_channels, minimum=1)
        size = check_int("image_size", image_size, minimum=1)
        num_classes = check_int("num_classes", num_classes, minimum=2)
        groups = check_int("groups", groups, minimum=1)
        layers: list[nn.Module] = []
        prev = in_channels
        for w in widths:
            w = check_int("widths", w, minimum=1)
            if w % groups:
                raise ValueError(f"widths must be multiples of groups={groups}, got {w}")
            layers += [nn.Conv2d(prev, w, 3, padding=1), nn.GroupNorm(groups, w), nn.ReLU(), nn.MaxPool2d(2)]
            prev = w
            size //= 2
        if size < 1:
            raise ValueError(f"image_size={image_size} is too small for {len(widths)} pooling steps")
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(prev * size * size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape (B, num_classes), of images (B, C, H, W)."""
        return self.head(self.features(x).flatten(1))
