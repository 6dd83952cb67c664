"""The `tiny` branchy model as a PyTorch module, for training on a CPU (OWL part 2 runs it for real).

Built from the same widths as models.tiny(), base by base and branch by branch, so that its
parameters per branch are the profile's (tests/test_fl.py checks it): convolutions without bias,
each followed by BatchNorm and ReLU; a base's branches are joined by concatenation.
"""
from __future__ import annotations

import torch
from torch import nn


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=False))


class Concat(nn.Module):
    """A nonlinear base: parallel branches on one input, outputs concatenated along channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], dim=1)


def _block(cin: int) -> Concat:
    return Concat(
        _conv(cin, 8, 1),
        nn.Sequential(_conv(cin, 8, 1), _conv(8, 16, 3)),
        nn.Sequential(_conv(cin, 8, 1), _conv(8, 8, 3), _conv(8, 16, 3)),
        nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False), _conv(cin, 8, 1)),
    )


class Tiny(nn.Module):
    """models.tiny(): stem, (Inception-style block, strided conv) x 2, global pooling and the classifier."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.bases = nn.ModuleList([_conv(3, 16, 3), _block(16), _conv(48, 48, 3, 2), _block(48), _conv(48, 48, 3, 2)])
        self.classifier = nn.Linear(48, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for base in self.bases:
            x = base(x)
        return self.classifier(x.mean(dim=(2, 3)))
